"""Get the SparkSession a job runs in: a Spark Connect one, the active one, else a local one.

Both session kinds run every job (``pipeline.runner`` uses only the DataFrame
API): a classic session (spark-submit, a local ``local[*]`` one) and a Spark
Connect session (Databricks serverless and standard access, or any
``sc://host:port`` server), chosen with ``spark.remote`` or ``SPARK_REMOTE``.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from pipeline.config import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["activate_for_this_thread", "apply_session_settings", "get_session", "is_connect", "remote_url",
           "session_key", "session_settings"]


def session_settings(config: SparkConfig) -> dict[str, str]:
    """Settings applied to every session this library builds or reuses (runtime SQL settings)."""
    return {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.arrow_max_records_per_batch),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
    }


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no ``sparkContext``, JVM or RDD API on the driver)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def remote_url(config: SparkConfig) -> str | None:
    """The Spark Connect address to use: ``spark.remote``, else ``$SPARK_REMOTE``, else None (classic)."""
    return config.remote or os.environ.get("SPARK_REMOTE") or None


def apply_session_settings(spark: "SparkSession", config: SparkConfig, *, out: Any = None) -> None:
    """Set :func:`session_settings` on ``spark`` (either kind).

    A managed Connect session may refuse a key (serverless allows only some
    settings): the job still runs with the server's value, and a line on
    stderr names the key.
    """
    for key, value in session_settings(config).items():
        try:
            if spark.conf.get(key, None) != value:
                spark.conf.set(key, value)
        except Exception as exc:  # noqa: BLE001 - a refused setting must not stop the job
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            print(f"warning: could not set {key}={value} on this session ({first}); using the server's value",
                  file=out or sys.stderr, flush=True)


def get_session(config: SparkConfig) -> "SparkSession":
    """A Spark Connect session (``spark.remote`` / ``SPARK_REMOTE``), the active session, or a new local one.

    Our runtime SQL settings are applied in every case. Under spark-submit the
    master and resources come from spark-submit; here ``spark.master`` is only
    set when Python started Spark itself.
    """
    url = remote_url(config)
    if url:
        return _connect_session(url, config)

    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        apply_session_settings(active, config)
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


def _connect_session(url: str, config: SparkConfig) -> "SparkSession":
    """A Spark Connect session to ``url`` (``sc://host:port/;token=...``), with our runtime settings.

    The server owns the master, executors and Python workers, so only runtime
    settings (``spark.conf``) apply; ``spark.master`` and static confs are the
    server's business.
    """
    # Like pyspark's own builder: from here on pyspark.sql.functions build Connect columns.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    spark = ConnectSession.builder.remote(url).getOrCreate()
    apply_session_settings(spark, config)
    runtime = {k: v for k, v in config.conf.items() if k.startswith("spark.sql.")}
    for key, value in runtime.items():
        spark.conf.set(key, value)
    return spark


def session_key(spark: "SparkSession") -> Any:
    """One key per underlying session: the server-side session id on Spark Connect, the JVM session on classic
    (several Python wrappers may share one)."""
    if is_connect(spark):
        return ("connect", spark.session_id)
    return id(spark._jsparkSession)


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
