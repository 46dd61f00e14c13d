# Databricks notebook source
# MAGIC %md
# MAGIC # classify_images
# MAGIC Classifies images (a folder of files read with Spark's `binaryFile` format, or a table of image
# MAGIC bytes or paths) with EfficientNet-Lite0 and writes the top-k ImageNet labels to a Delta table with
# MAGIC lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`). Bad images get a status.
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.

# COMMAND ----------

from pipeline.notebook import declare_widgets

declare_widgets(dbutils, config="conf/classify_images.yaml")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline.notebook import run_notebook

summary = run_notebook(args, spark=spark)  # noqa: F821
