"""Get the SparkSession a job runs in: the active one (spark-submit, Databricks), else a local one."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from pipeline.config import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["activate_for_this_thread", "get_session", "session_key", "session_settings"]


def session_settings(config: SparkConfig) -> dict[str, str]:
    """Settings applied to every session this library builds or reuses (runtime SQL settings)."""
    return {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.arrow_max_records_per_batch),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
    }


def get_session(config: SparkConfig) -> "SparkSession":
    """The active session with our runtime settings, or a new local one built from ``config``.

    Under spark-submit the master and resources come from spark-submit; here
    ``spark.master`` is only set when Python started Spark itself.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in session_settings(config).items():
            active.conf.set(key, value)
        return active

    # Workers must run this interpreter (the venv), not whatever python3 is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(config.app_name)
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # not launched by spark-submit
        builder = builder.master(config.master)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": "2g",
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
    }
    for key, value in {**defaults, **session_settings(config), **config.conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def session_key(spark: "SparkSession") -> int:
    """One key per underlying session (several Python wrappers may share one JVM session)."""
    jsession = getattr(spark, "_jsparkSession", None)  # classic only; Spark Connect has no JVM handle
    return id(jsession) if jsession is not None else id(spark)


def activate_for_this_thread(spark: "SparkSession") -> None:
    """Make ``spark`` the JVM thread's active session (classic); nothing to do on Spark Connect.

    Python data sources are looked up in the JVM thread's active session, and a
    write from another Python thread runs on a JVM thread that has none.
    """
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        return
    try:
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - best effort: the default session is used instead
        pass
