# Databricks notebook source
# MAGIC %md
# MAGIC # generate_text
# MAGIC Generates one completion per row (one-sentence review summaries) with a causal LM, writing a Delta table
# MAGIC with lineage (`model_name`, `model_revision`, `run_id`, `scored_at`, `ds`). The model folder comes
# MAGIC from `python jobs/prepare_llm.py` (SmolLM2-135M-Instruct converted from GGUF).
# MAGIC
# MAGIC Install the package on the cluster first (a wheel built with `pip wheel .`, or `%pip install`).
# MAGIC The same YAML config drives spark-submit, the CLI and this notebook.
# MAGIC
# MAGIC On Databricks set the `overlay` widget to `conf/env/databricks.yaml` and give your locations in
# MAGIC `overrides` (`source.path`, `model.path`, `sink.path`): the YAML's own are the demo's, relative to the
# MAGIC repository (found above this notebook's folder), and the second cell names each one it does not find.
# MAGIC
# MAGIC `task.backend: auto` runs vLLM where the cluster's Python can import it (GPU clusters:
# MAGIC `%pip install 'spark-batch-inference[vllm]'`), else transformers; the `overrides` widget
# MAGIC takes `task.backend=transformers` or `task.vllm.max_num_seqs=64`.

# COMMAND ----------

from pipeline.notebook import declare_widgets

declare_widgets(dbutils, config="conf/generate_text.yaml")  # noqa: F821

# COMMAND ----------

from pipeline.notebook import read_widgets

args = read_widgets(dbutils)  # noqa: F821 - validates the widgets before any work
print(args)

# COMMAND ----------

from pipeline.notebook import run_notebook

summary = run_notebook(args, spark=spark)  # noqa: F821
