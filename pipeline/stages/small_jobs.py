"""Small jobs on a local master: a session and a commit sized for a few thousand rows.

A 100-row job that builds its own local session spent most of its time on what a big job
amortises: the Delta connector's jars (690 MB of classpath with S3A, the connector's first
snapshot jobs), a JVM tuned for hours of work, and the three Python processes Spark starts for a
Python data source write (its planning, its task, its commit). Measured on 2 cores
(``bench/small_jobs.py``, docs/benchmarks_small_jobs.md): 64 s with the jars, 37 s without them, under 20 s
light.

:func:`small_job` decides before the session exists. When it says yes the runner builds the session
light (:func:`pipeline.spark.session.get_session` ``small=True``: no cached jars, so reads and commits
take the deltalake path; a quick-start JVM) and commits from the driver
(:func:`pipeline.io.delta.datasource.write_from_driver`). The inference tasks, the key checks, the
staging, the markers and the Delta transaction are the same as for any job; only where the commit's
one task runs differs. A job is small only when all of these hold, so nothing it needs goes missing:

- ``spark.small_job_rows`` is not 0 and the source holds at most that many rows: ``source.limit``,
  else the Delta log's row counts (a table whose log lacks them is not small);
- no session was passed in, none is active, no ``spark-submit`` launched this process, no Spark
  Connect address is set, and ``spark.master`` is local;
- every location (source, sink, quarantine, runs table) is a local path, not a catalog table or an
  object store, and ``sink.writer`` is ``auto`` or ``deltalake``;
- ``spark.conf`` brings no jars or Delta settings of its own, and no fault drill is configured (the
  drills exercise the distributed write).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.config import JobConfig
from pipeline.core.locations import Location
from pipeline.spark.session import USER_CLASSPATH_CONFS

__all__ = ["SmallJob", "small_job"]

_LOCAL_MASTER = re.compile(r"local(\[.*\])?")
# spark.conf settings that bring jars or the Delta connector's own session settings
_USER_DELTA_CONFS = (*USER_CLASSPATH_CONFS, "spark.sql.extensions", "spark.sql.catalog.spark_catalog")


@dataclass(frozen=True)
class SmallJob:
    """Whether a job runs light, and why (or why not), in words for the run's first line."""

    small: bool
    why: str
    rows: int | None = None

    def __bool__(self) -> bool:
        return self.small


def small_job(config: JobConfig, *, spark: Any = None, environ: Mapping[str, str] | None = None,
              active_session: bool | None = None, source_state: Any = None) -> SmallJob:
    """Whether ``config`` runs as a small job (see the module's conditions); ``spark``: a session passed in.

    ``active_session``: whether a SparkSession is active in this process (None: ask pyspark);
    ``source_state``: the Delta source's log as the run read it (:class:`pipeline.io.delta.state.TableState`;
    None: read here).

    >>> from pipeline.config import build_config
    >>> raw = {"job": "j", "source": {"path": "/d", "limit": 100}, "model": {"path": "/m"},
    ...        "task": {"kind": "embed"}, "sink": {"path": "/out"}, "spark": {"master": "local[2]"}}
    >>> small_job(build_config(raw), environ={}, active_session=False)
    SmallJob(small=True, why='source.limit 100 <= spark.small_job_rows 10,000', rows=100)
    >>> small_job(build_config({**raw, "sink": {"path": "s3://lake/out"}}), environ={}, active_session=False).why
    'sink.path s3://lake/out is not a local path'
    >>> small_job(build_config({**raw, "spark": {"master": "yarn"}}), environ={}, active_session=False).why
    'spark.master yarn is not local'
    """
    env = os.environ if environ is None else environ
    refusal = _refusal(config, spark=spark, env=env, active_session=active_session)
    if refusal:
        return SmallJob(False, refusal)
    limit = config.spark.small_job_rows
    rows, source = _source_rows(config, source_state)
    if rows is None:
        return SmallJob(False, source)
    if rows > limit:
        return SmallJob(False, f"{source} > spark.small_job_rows {limit:,}", rows)
    return SmallJob(True, f"{source} <= spark.small_job_rows {limit:,}", rows)


def _refusal(config: JobConfig, *, spark: Any, env: Mapping[str, str], active_session: bool | None) -> str | None:
    """Why ``config`` cannot run light whatever its size, else None."""
    from pipeline.core.faults import ENV as FAULTS_ENV

    if config.spark.small_job_rows == 0:
        return "spark.small_job_rows is 0"
    if spark is not None:
        return "a session was passed in"
    if config.source.stream is not None:
        return "a stream (its rows arrive while it runs)"
    if config.spark.remote or env.get("SPARK_REMOTE"):
        return "a Spark Connect session"
    if env.get("PYSPARK_GATEWAY_PORT"):
        return "launched by spark-submit (its session is the job's)"
    if not _LOCAL_MASTER.fullmatch(config.spark.master.strip()):
        return f"spark.master {config.spark.master} is not local"
    if config.source.format == "table" or config.sink.table:
        return "a catalog table needs the Delta connector"
    if config.sink.writer == "delta":
        return "sink.writer is delta (the connector)"
    locations = {"source.path": config.source.location, "sink.path": config.sink.location,
                 "sink.quarantine_path": config.sink.quarantine_path and config.sink.quarantine_location,
                 "run.runs_path": config.run.runs_path and Location.of(config.run.runs_path)}
    for key, location in locations.items():
        if location and not location.local:
            return f"{key} {location} is not a local path"
    named = [k for k in _USER_DELTA_CONFS if k in config.spark.conf]
    if named:
        return f"spark.conf sets {', '.join(named)}"
    if config.run.faults or env.get(FAULTS_ENV, "").strip() not in ("", "{}"):
        return "a fault drill is configured"
    if active_session is None:
        from pyspark.sql import SparkSession

        active_session = SparkSession.getActiveSession() is not None
    if active_session:
        return "a SparkSession is active in this process"
    return None


def _source_rows(config: JobConfig, state: Any = None) -> tuple[int | None, str]:
    """The most rows the job can read and where that bound comes from; ``(None, why)`` when unknown."""
    limit = config.source.limit
    delta = config.source.format == "delta" and bool(config.source.path)
    if delta and state is not None:  # the log the run read once
        rows, features = state.rows(), list(state.unreadable)
    else:
        rows, features = _delta_log_rows(config.source.location) if delta else (None, [])
    if features:  # a light session reads through deltalake, which cannot: the connector's session can
        return None, f"the source uses {', '.join(features)}, which only the Delta connector reads"
    if limit is not None and limit <= config.spark.small_job_rows:
        return limit, f"source.limit {limit:,}"
    if not delta:
        return None, f"the row count of a {config.source.format} source is not known before reading it"
    if rows is None:
        return None, f"the Delta log of {config.source.path} does not count its rows"
    if limit is not None:
        rows = min(rows, limit)
    return rows, f"the source's {rows:,} rows (its Delta log)"


def _delta_log_rows(path: "str | Location") -> tuple[int | None, list[str]]:
    """The rows of the Delta table at ``path`` by its log's per-file counts (None when any is missing or no
    table), and the features it uses that only the Delta connector reads (deletion vectors, column mapping)."""
    from pipeline.io.delta.state import read_state

    state = read_state(path)
    if state is None or not state.exists:  # no table there (yet): the read reports it; not small meanwhile
        return None, []
    return state.rows(), list(state.unreadable)
