# Databricks notebook source
# MAGIC %md
# MAGIC # refresh_recommendations
# MAGIC Nightly top-K unseen items per user from the two-tower model: rows `user_id, item_id, score, rank,
# MAGIC model_revision, run_id, ds` replace the run date's partition of the dated Delta table, and
# MAGIC `recommendations_latest` is overwritten with them (unless it already holds a newer date).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC Train a model first: `python jobs/train_recommender.py --refit-full` (writes `<models>/LATEST`).

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
