# Databricks notebook source
# MAGIC %md
# MAGIC # ocr_pages
# MAGIC Reads document pages (image files or a table of image bytes or paths) with the PP-OCRv4 ONNX
# MAGIC models on onnxruntime and writes the page text and its lines (text, box, confidence) to a Delta
# MAGIC table with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.

# COMMAND ----------

dbutils.widgets.text("config", "conf/ocr_pages.yaml", "Config YAML")  # noqa: F821
dbutils.widgets.text("overlay", "", "Overlay YAML (optional)")  # noqa: F821
dbutils.widgets.text("overrides", "", "Overrides: key.path=value, one per line or ';'-separated")  # noqa: F821
dbutils.widgets.text("ds", "", "Run date YYYY-MM-DD (empty: today)")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline import load_config, run_job

config = load_config(args.config_path, overlays=args.overlays, overrides=args.overrides_with_run())
summary = run_job(config, spark=spark)  # noqa: F821
