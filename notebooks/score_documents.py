# Databricks notebook source
# MAGIC %md
# MAGIC # score_documents
# MAGIC Embeds documents and scores zero-shot labels with a sentence encoder, writing a Delta table
# MAGIC with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.

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
