# Databricks notebook source
# MAGIC %md
# MAGIC # ocr_pages
# MAGIC Reads document pages (image files or a table of image bytes or paths) with the PP-OCRv4 ONNX
# MAGIC models on onnxruntime and writes the page text and its lines (text, box, confidence) to a Delta
# MAGIC table with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`, `sink.path`): the YAML's own are the demo's, relative to the repository
# MAGIC (found above this notebook's folder), and the second cell names each one it does not find. The model
# MAGIC `package:rapidocr_onnxruntime` comes from the `rapidocr-onnxruntime` wheel; or set `model.path` to your
# MAGIC model folder.

# COMMAND ----------

from pipeline.notebook import declare_widgets

declare_widgets(dbutils, config="conf/ocr_pages.yaml")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline.notebook import run_notebook

summary = run_notebook(args, spark=spark)  # noqa: F821
