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

dbutils.widgets.text("config", "conf/refresh_recommendations.yaml", "Config YAML")  # noqa: F821
dbutils.widgets.text("overlay", "", "Overlay YAML (optional)")  # noqa: F821
dbutils.widgets.text("overrides", "", "Overrides: key.path=value, one per line or ';'-separated")  # noqa: F821
dbutils.widgets.text("ds", "", "Run date YYYY-MM-DD (empty: today)")  # noqa: F821
dbutils.widgets.text("run_id", "", "Run id (empty: a new one)")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline import load_config, run_job

config = load_config(args.config_path, overlays=args.overlays, overrides=args.overrides_with_run())
summary = run_job(config, spark=spark)  # noqa: F821
