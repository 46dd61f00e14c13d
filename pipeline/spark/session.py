"""Get the SparkSession a job runs in: a Spark Connect one, the active one, else a local one.

Both session kinds run every job (``pipeline.runner`` uses only the DataFrame
API): a classic session (spark-submit, a local ``local[*]`` one) and a Spark
Connect session (Databricks serverless and standard access, or any
``sc://host:port`` server), chosen with ``spark.remote`` or ``SPARK_REMOTE``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Mapping

from pipeline.config import DELTA_CONNECTOR_CONF, SparkConfig
from pipeline.spark.class_archive import QUICK_START_JVM_OPTIONS
from pipeline.spark.jars import GROUPS, session_jar_confs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["QUICK_START_JVM_OPTIONS", "USER_CLASSPATH_CONFS", "apply_session_settings", "get_session",
           "quiet_task_failure_logs", "remote_url", "s3a_settings", "session_settings", "with_local_task_attempts"]

# Spark's own patterns (SparkContext.createTaskScheduler): these local masters allow one attempt per task
_LOCAL_ONE_ATTEMPT = re.compile(r"local(?:\[\s*([0-9]+|\*)\s*\])?")


def with_local_task_attempts(master: str, attempts: int) -> str:
    """``master`` with ``attempts`` tries per task when it is a local master that allows only one.

    Local masters ignore ``spark.task.maxFailures``: ``local`` and ``local[N]``
    give each task a single attempt, so one Python worker that dies (a segfault,
    an OOM kill) fails the whole job. ``local[N,F]`` is Spark's way to allow F.
    A master that already names F, and any cluster master, is returned as is.

    >>> with_local_task_attempts("local[*]", 4), with_local_task_attempts("local[2]", 4)
    ('local[*,4]', 'local[2,4]')
    >>> with_local_task_attempts("local", 4), with_local_task_attempts("local[2,3]", 4)
    ('local[1,4]', 'local[2,3]')
    >>> with_local_task_attempts("spark://host:7077", 4), with_local_task_attempts("local[2]", 1)
    ('spark://host:7077', 'local[2]')
    """
    match = _LOCAL_ONE_ATTEMPT.fullmatch(master.strip())
    if match is None or attempts <= 1:
        return master
    return f"local[{match.group(1) or 1},{attempts}]"


# Who prints a failed task's Java stack trace (each a copy of what the driver's error carries, which the
# CLI prints as one line): the executor ("Exception in task"), Utils ("Aborting task", around a data source
# write), the scheduler ("Lost task" at WARN, "failed N times; aborting job"), and the v2 write nodes
# ("Aborting commit for partition", "... is aborting").
_TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor", "org.apache.spark.util.Utils", "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.datasources.v2",
)


# settings through which a user's spark.conf may bring the Delta classes themselves
USER_CLASSPATH_CONFS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")


def session_settings(config: SparkConfig) -> dict[str, str]:
    """Settings applied to every session this library builds or reuses (runtime SQL settings)."""
    return {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(config.arrow_max_records_per_batch),
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
    }


def s3a_settings(options: Mapping[str, str]) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` for S3 settings in delta-rs's names (``StorageConfig.options()``): what
    Hadoop's S3A (the connector's file system) needs to reach the same store with the same keys.

    Keys make S3A take them from its settings (``SimpleAWSCredentialsProvider``, or the temporary
    provider with a session token) instead of its default chain; an endpoint gets path-style access
    (MinIO, moto and most S3-compatible servers need it). Spark redacts these values in its UI and
    logs (``spark.redaction.regex`` matches ``access.key``, ``secret`` and ``token``).

    >>> s3a_settings({"aws_endpoint_url": "http://127.0.0.1:9000", "aws_allow_http": "true"})
    {'spark.hadoop.fs.s3a.endpoint': 'http://127.0.0.1:9000', 'spark.hadoop.fs.s3a.path.style.access': 'true', 'spark.hadoop.fs.s3a.connection.ssl.enabled': 'false'}
    >>> sorted(s3a_settings({"aws_access_key_id": "a", "aws_secret_access_key": "b", "aws_session_token": "c"}))[0]
    'spark.hadoop.fs.s3a.access.key'
    """
    confs: dict[str, str] = {}
    if options.get("aws_access_key_id"):
        provider = "TemporaryAWSCredentialsProvider" if options.get("aws_session_token") else \
            "SimpleAWSCredentialsProvider"
        confs["fs.s3a.aws.credentials.provider"] = f"org.apache.hadoop.fs.s3a.{provider}"
        confs["fs.s3a.access.key"] = options["aws_access_key_id"]
        if options.get("aws_secret_access_key"):
            confs["fs.s3a.secret.key"] = options["aws_secret_access_key"]
        if options.get("aws_session_token"):
            confs["fs.s3a.session.token"] = options["aws_session_token"]
    if options.get("aws_region"):
        confs["fs.s3a.endpoint.region"] = options["aws_region"]
    if options.get("aws_endpoint_url"):
        confs["fs.s3a.endpoint"] = options["aws_endpoint_url"]
        confs["fs.s3a.path.style.access"] = "true"
    if str(options.get("aws_allow_http", "")).lower() == "true":
        confs["fs.s3a.connection.ssl.enabled"] = "false"
    return {f"spark.hadoop.{k}": v for k, v in confs.items()}


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
            _warn(f"warning: could not set {key}={value} on this session ({first}); using the server's value", out)


def get_session(config: SparkConfig, *, object_stores: bool = True,
                storage: Mapping[str, str] | None = None, small: bool = False) -> "SparkSession":
    """A Spark Connect session (``spark.remote`` / ``SPARK_REMOTE``), the active session, or a new local one.

    Our runtime SQL settings are applied in every case. Under spark-submit the
    master and resources come from spark-submit; here ``spark.master`` is only
    set when Python started Spark itself. ``object_stores=False`` leaves the
    cached S3A jars off a session built here (the runner passes it for a job
    with no ``s3a://`` location: 690 MB of AWS SDK on the classpath cost about
    4 s of every start on 2 cores). ``storage`` (S3 settings in delta-rs's names, the config's
    ``storage:`` section) becomes the S3A settings of a session built here (:func:`s3a_settings`;
    ``spark.conf`` can still set any one of them); an active or Spark Connect session keeps its own.
    ``small`` (a small job on a local master, :mod:`pipeline.stages.small_jobs`): a session built here leaves
    every cached jar off and starts its JVM with :data:`QUICK_START_JVM_OPTIONS` unless ``spark.conf``
    sets ``spark.driver.extraJavaOptions``. A JVM it starts maps the class archive of
    :mod:`pipeline.spark.class_archive` (``spark.class_archive``), unless ``spark.conf`` sets those options.
    """
    url = remote_url(config)
    if url:
        return _connect_session(url, config)

    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        apply_session_settings(active, config)
        _warn_single_attempt(active)
        return active

    # Workers must run this interpreter (the venv), not whatever python3 is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(config.app_name)
    master = None
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):  # not launched by spark-submit
        master = with_local_task_attempts(config.master, config.local_task_attempts)
        builder = builder.master(master)
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
    # the Delta connector and S3A jars fetched once by `make jars` (pipeline.spark.jars), when cached; under
    # spark-submit the driver's JVM and its class path exist already, so its own --jars and --conf decide
    # (naming Delta's catalog here without its classes on that path fails the session's first query)
    groups = () if small else GROUPS if object_stores else tuple(g for g in GROUPS if g != "s3")
    local = master is not None and (master == "local" or master.startswith("local["))
    jars = _jar_confs(config.conf, groups, local=local) if master is not None and groups else {}
    if master is not None and not any(k in config.conf for k in USER_CLASSPATH_CONFS):
        # what has_delta_connector answers for this session without probing it (a first query costs ~2 s)
        defaults[DELTA_CONNECTOR_CONF] = "true" if "spark.sql.extensions" in jars else "false"
    if small and master is not None:
        defaults["spark.driver.extraJavaOptions"] = QUICK_START_JVM_OPTIONS
    if master is not None and config.class_archive and (archive := _class_archive(config.conf, jars)):
        # the JVM maps the classes it loads at start from an archive (pipeline.spark.class_archive)
        defaults["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, [defaults.get("spark.driver.extraJavaOptions"), archive]))
    if master is not None:
        defaults.update(_local_delta_defaults(master))
    if local:
        # workers forked with torch and transformers imported (pipeline.spark.daemon); on a local master the
        # daemon runs where this process imported pipeline. Executors elsewhere may lack it: opt in there
        defaults["spark.python.daemon.module"] = "pipeline.spark.daemon"
    s3a = s3a_settings(storage or {}) if object_stores else {}
    for key, value in {**defaults, **session_settings(config), **s3a, **config.conf, **jars}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    quiet_task_failure_logs(spark)
    _warn_single_attempt(spark)
    return spark


def _jar_confs(user: Mapping[str, str], groups: tuple[str, ...], *, local: bool) -> dict[str, str]:
    """The cached jars' confs for a session built here (:func:`~pipeline.spark.jars.session_jar_confs`), after the
    user's own ``spark.jars`` or ``spark.driver.extraClassPath`` (``spark.conf``), which they extend."""
    jars = session_jar_confs(groups, local=local)
    for key, sep in (("spark.jars", ","), ("spark.driver.extraClassPath", os.pathsep)):
        if jars.get(key) and user.get(key):
            jars[key] = f"{user[key]}{sep}{jars[key]}"
    return jars


def _class_archive(user: Mapping[str, str], jars: Mapping[str, str]) -> str:
    """The JVM options that map (or write) the class archive of the session's class path
    (:mod:`pipeline.spark.class_archive`: one for a jar-free JVM, one for each set of jars on it); ``""`` when the
    user's ``spark.conf`` sets the driver's Java options or ``SPARK_SUBMIT_OPTS`` names an archive already."""
    if "spark.driver.extraJavaOptions" in user or _archive_given(os.environ.get("SPARK_SUBMIT_OPTS", "")):
        return ""
    from pipeline.spark import class_archive

    return class_archive.archive_options(
        jars.get("spark.driver.extraClassPath") or user.get("spark.driver.extraClassPath", ""))


def _archive_given(options: str) -> bool:
    """Whether JVM ``options`` (``SPARK_SUBMIT_OPTS``, which the launcher puts first) name a class archive already:
    a second one would be read as the base of the first, and the JVM would not start.

    >>> _archive_given("-XX:SharedArchiveFile=/c/jvm/a.jsa -Xshare:auto"), _archive_given("-XX:+UseSerialGC")
    (True, False)
    """
    return "SharedArchiveFile" in options or "ArchiveClassesAtExit" in options


def _local_delta_defaults(master: str) -> dict[str, str]:
    """On a local ``master`` Python starts: the Delta connector replays a table's log in as many partitions as there are cores.

    Its default, 50, is sized for clusters: on 2 local cores every read of a small table's snapshot ran 50
    tasks, and a 100-row job spent 25 of its seconds there (bench/small_jobs.py). ``spark.conf`` overrides.
    """
    from pipeline.spark.planning import cores_from_settings

    if not master.startswith("local"):
        return {}
    cores = cores_from_settings({"spark.master": master}, local_cpus=os.cpu_count() or 1) or 1
    return {"spark.databricks.delta.snapshotPartitions": str(min(cores, 50))}


def quiet_task_failure_logs(spark: "SparkSession") -> None:
    """Stop the console printing each failed task's Java stack trace (classic sessions built here).

    The failure reaches the driver anyway: the CLI prints it as one line
    (the Python exception class and message) and ``--verbose`` prints the
    whole text. Our own progress lines are Python prints and stay.
    """
    try:
        jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        level = jvm.org.apache.logging.log4j.Level.toLevel("FATAL")
        for name in _TASK_FAILURE_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # noqa: BLE001 - cosmetic: another logging backend keeps its settings
        pass


def _warn_single_attempt(spark: "SparkSession", out: Any = None) -> None:
    """Say so when a local master (e.g. from ``spark-submit --master local[*]``) allows one attempt per task."""
    try:
        master = str(spark.sparkContext.master)
    except Exception:  # noqa: BLE001 - e.g. a shared Databricks cluster hides the SparkContext: not local
        return
    if _LOCAL_ONE_ATTEMPT.fullmatch(master.strip()):
        _warn(f"warning: master {master} gives each task a single attempt, so one Python worker that dies "
              f"fails the job; use {with_local_task_attempts(master, 4)} for up to 4 attempts", out)


def _warn(text: str, out: Any = None) -> None:
    """A session warning: to ``out`` when given, else through the ``pipeline.spark.session`` logger (with no
    logging configured, Python prints it on stderr, as before)."""
    if out is not None:
        print(text, file=out, flush=True)
    else:
        logging.getLogger(__name__).warning(text)


def _connect_session(url: str, config: SparkConfig) -> "SparkSession":
    """A Spark Connect session to ``url`` (``sc://host:port/;token=...``), with our runtime settings.

    The server owns the master, executors and Python workers, so only runtime
    settings (``spark.conf``) apply; ``spark.master`` and static confs are the
    server's business.
    """
    from pipeline.spark.reach import Unreachable, bounded, connect_address, probe

    # The client alone retries an unavailable server for about 14 minutes, silently: a TCP answer first, and
    # the first request bounded too (a port that accepts connections may not be a Connect server).
    host, port = connect_address(url)
    probe(host, port, timeout_s=config.connect_timeout_s, what="the Spark Connect server",
          check="spark.remote / $SPARK_REMOTE and that the server runs (sbin/start-connect-server.sh)")
    # Like pyspark's own builder: from here on pyspark.sql.functions build Connect columns.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    spark = ConnectSession.builder.remote(url).getOrCreate()  # no request yet
    try:
        bounded(lambda: spark.version, timeout_s=config.connect_timeout_s,
                what=f"the Spark Connect server at {host}:{port}")
    except Unreachable:
        # closed without a request (releasing the session would wait on the same silence), so neither the
        # request left waiting nor the client's exit hook holds the process
        spark.release_session_on_close = False
        spark.stop()
        raise
    apply_session_settings(spark, config)
    runtime = {k: v for k, v in config.conf.items() if k.startswith("spark.sql.")}
    for key, value in runtime.items():
        spark.conf.set(key, value)
    return spark
