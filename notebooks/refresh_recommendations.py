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

import datetime as dt

config_path = dbutils.widgets.get("config").strip()  # noqa: F821
overlay = dbutils.widgets.get("overlay").strip()  # noqa: F821
raw = dbutils.widgets.get("overrides").replace(";", "\n")  # noqa: F821
overrides = [line.strip() for line in raw.splitlines() if line.strip()]
ds = dbutils.widgets.get("ds").strip() or None  # noqa: F821
run_id = dbutils.widgets.get("run_id").strip() or None  # noqa: F821
if not config_path:
    raise ValueError("the 'config' widget is empty: set it to conf/refresh_recommendations.yaml or a copy of it")
if ds:
    dt.date.fromisoformat(ds)  # fail here, clearly, on a malformed date
bad = [o for o in overrides if "=" not in o]
if bad:
    raise ValueError(f"overrides {bad} are not key.path=value (e.g. task.k=20)")

# COMMAND ----------

from pipeline.recs.job import run_refresh

summary = run_refresh(config_path, ds=ds, run_id=run_id, overrides=overrides,  # noqa: F821
                      overlays=[overlay] if overlay else [], spark=spark)  # noqa: F821
