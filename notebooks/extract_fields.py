# Databricks notebook source
# MAGIC %md
# MAGIC # extract_fields
# MAGIC Fills a JSON Schema's fields from each row with a causal LM (`task.kind: extract`): a sentiment, a 1-5
# MAGIC rating and up to three aspects per movie review, written to Delta as a typed `fields` struct next to the
# MAGIC raw `completion`, with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`). Decoding is
# MAGIC constrained to the schema (xgrammar on transformers, structured outputs on vLLM); a row whose output
# MAGIC still fails the schema (cut off at `max_new_tokens`) is `invalid_output` and goes to the quarantine table.
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook; `conf/extract_log_fields.yaml`
# MAGIC is the log-line variant (component, severity, error code).
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`, `model.path`, `sink.path`): the YAML's own are the demo's, relative to the
# MAGIC repository (found above this notebook's folder), and the second cell names each one it does not find.

# COMMAND ----------

from pipeline.notebook import declare_widgets

declare_widgets(dbutils, config="conf/extract_fields.yaml")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline.notebook import run_notebook

summary = run_notebook(args, spark=spark)  # noqa: F821
