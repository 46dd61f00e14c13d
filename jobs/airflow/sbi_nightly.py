"""Airflow DAG: the nightly jobs through spark-submit, each with ``--ds`` = the DAG run's logical date.

Copy (or symlink) this file into the Airflow ``dags/`` folder on a machine where the repository is
installed at ``$SBI_HOME`` (default ``/opt/sbi``, with its ``.venv``), and point the ``spark_default``
connection at the cluster's master. A rerun of a day (``airflow tasks clear``) replaces that day's
partition, since the jobs write with ``sink.mode: overwrite_partition``. After scoring, ``pipeline
report --history 14 --fail-on-deviation`` fails its task (an alert) when the night deviates.

Module level only builds the DAG: no connections, no Spark, nothing read. Checked by
tests/spark/test_scheduling.py without Airflow installed.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow import DAG
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.bash import BashOperator

SBI_HOME = os.environ.get("SBI_HOME", "/opt/sbi")
PYTHON = f"{SBI_HOME}/.venv/bin/python"
WAREHOUSE = os.environ.get("SBI_WAREHOUSE", f"{SBI_HOME}/warehouse")

# Spark's Python workers and the driver run the repository's venv (see docs/getting-started/cluster.md)
ENV = {"PYSPARK_PYTHON": PYTHON, "PYSPARK_DRIVER_PYTHON": PYTHON, "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1"}
SPARK_CONF = {"spark.sql.execution.arrow.maxRecordsPerBatch": "10000", "spark.ui.showConsoleProgress": "false"}


def submit(job: str, *overrides: str) -> SparkSubmitOperator:
    """``spark-submit jobs/<job>.py --conf conf/<job>.yaml --ds {{ ds }} [--set k=v ...]``."""
    sets = [arg for override in overrides for arg in ("--set", override)]
    return SparkSubmitOperator(
        task_id=job,
        application=f"{SBI_HOME}/jobs/{job}.py",
        application_args=["--conf", f"{SBI_HOME}/conf/{job}.yaml", "--ds", "{{ ds }}", *sets],
        name=f"sbi-{job}",
        conn_id="spark_default",
        conf=SPARK_CONF,
        env_vars=ENV,
    )


with DAG(
    dag_id="sbi_nightly",
    schedule="0 2 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=10)},
    tags=["spark-batch-inference"],
) as dag:
    score = submit("score_documents", f"source.path={WAREHOUSE}/demo/documents",
                   f"sink.path={WAREHOUSE}/demo/document_scores")
    report = BashOperator(
        task_id="report_score_documents",
        bash_command=(f"{PYTHON} -m pipeline report {WAREHOUSE}/demo/document_scores --history 14 "
                      f"--fail-on-deviation --out {WAREHOUSE}/reports/score_documents_{{{{ ds }}}}.html"),
        cwd=SBI_HOME,
    )
    generate = submit("generate_text", f"source.path={WAREHOUSE}/demo/documents")
    refresh = submit("refresh_recommendations")

    score >> report
    score >> generate  # the GPU job after the CPU one: one night's cluster at a time
