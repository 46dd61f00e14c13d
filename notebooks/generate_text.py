# Databricks notebook source
# MAGIC %md
# MAGIC # generate_text
# MAGIC Generates one completion per row (one-sentence review summaries) with a causal LM, writing a Delta table
# MAGIC with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`). The model folder comes
# MAGIC from `python jobs/prepare_llm.py` (SmolLM2-135M-Instruct converted from GGUF).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.

# COMMAND ----------

dbutils.widgets.text("config", "conf/generate_text.yaml", "Config YAML")  # noqa: F821
dbutils.widgets.text("overlay", "", "Overlay YAML (optional)")  # noqa: F821
dbutils.widgets.text("overrides", "", "Overrides: key.path=value, one per line or ';'-separated")  # noqa: F821
dbutils.widgets.text("ds", "", "Run date YYYY-MM-DD (empty: today)")  # noqa: F821

# COMMAND ----------

import datetime as dt

config_path = dbutils.widgets.get("config").strip()  # noqa: F821
overlay = dbutils.widgets.get("overlay").strip()  # noqa: F821
raw = dbutils.widgets.get("overrides").replace(";", "\n")  # noqa: F821
overrides = [line.strip() for line in raw.splitlines() if line.strip()]
ds = dbutils.widgets.get("ds").strip()  # noqa: F821
if not config_path:
    raise ValueError("the 'config' widget is empty: set it to a job YAML such as conf/generate_text.yaml")
if ds:
    dt.date.fromisoformat(ds)  # fail here, clearly, on a malformed date
    overrides.append(f"run.ds={ds}")

# COMMAND ----------

from pipeline import load_config, run_job

config = load_config(config_path, overlays=[overlay] if overlay else [], overrides=overrides)
summary = run_job(config, spark=spark)  # noqa: F821
