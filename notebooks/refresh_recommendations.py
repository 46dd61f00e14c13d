# Databricks notebook source
# MAGIC %md
# MAGIC # refresh_recommendations
# MAGIC Nightly top-K unseen items per user from the two-tower model: rows `user_id, item_id, score, rank,
# MAGIC model_revision, run_id, ds` replace the run date's partition of the dated Delta table, and
# MAGIC `recommendations_latest` is overwritten with them (unless it already holds a newer date).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC Train a model first: `python jobs/train_recommender.py --refit-full` (writes `<models>/LATEST`).
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`, `model.path`, `task.interactions`, `task.items`, `task.latest_path`,
# MAGIC `sink.path`): the YAML's own are the demo's, relative to the repository (found above this notebook's
# MAGIC folder), and the second cell names each one it does not find.

# COMMAND ----------

from pipeline.notebook import declare_widgets

declare_widgets(dbutils, config="conf/refresh_recommendations.yaml")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline.notebook import run_notebook

summary = run_notebook(args, spark=spark)  # noqa: F821
