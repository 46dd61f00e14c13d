# Databricks notebook source
# MAGIC %md
# MAGIC # Nightly recommendation refresh
# MAGIC Top-K unseen items per user from the two-tower model, written to the dated Delta table
# MAGIC (partition `ds` replaced) and to `recommendations_latest`. Config: `conf/refresh_recommendations.yaml`.
# MAGIC Install the package on the cluster (wheel or `%pip install`); this notebook adds nothing to `sys.path`.

# COMMAND ----------

dbutils.widgets.text("conf", "conf/refresh_recommendations.yaml", "Config YAML")
dbutils.widgets.text("ds", "", "Run date (YYYY-MM-DD, empty = today UTC)")
dbutils.widgets.text("run_id", "", "Run id (empty = new)")
dbutils.widgets.text("overrides", "", "Overrides key.path=value, comma separated")

# COMMAND ----------

import datetime as dt

conf = dbutils.widgets.get("conf").strip()
ds = dbutils.widgets.get("ds").strip() or None
run_id = dbutils.widgets.get("run_id").strip() or None
overrides = [o.strip() for o in dbutils.widgets.get("overrides").split(",") if o.strip()]
if not conf:
    raise ValueError("widget 'conf' is empty: set it to a config YAML, e.g. conf/refresh_recommendations.yaml")
if ds is not None:
    try:
        dt.date.fromisoformat(ds)
    except ValueError:
        raise ValueError(f"widget 'ds' is {ds!r}; use YYYY-MM-DD, e.g. 2026-11-30, or leave it empty") from None
bad = [o for o in overrides if "=" not in o]
if bad:
    raise ValueError(f"widget 'overrides' entries {bad} are not key.path=value (e.g. task.k=20)")

# COMMAND ----------

from pipeline.recs.job import run_refresh

summary = run_refresh(conf, ds=ds, run_id=run_id, overrides=overrides, spark=spark)
