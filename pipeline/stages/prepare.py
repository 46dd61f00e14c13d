"""Prepare: the checks that fail in seconds, before any Spark work, and the session the run uses.

Partitioning, the model (resolved, checked and its revision hashed by the task kind), the addresses the job
names, the session (light for a small job, :mod:`pipeline.small_jobs`, with the model warming up in a
worker meanwhile), the locations the session must reach, and the staging root.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from pipeline.compat import check_spark
from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.logs import RunLog
from pipeline.metrics import StageClock
from pipeline.registry import get_task_kind
from pipeline.sessions import is_connect
from pipeline.stages.plan import Prepared, kind_and_task
from pipeline.stages.resume import check_staging_root
from pipeline.tasks.job import checked_model

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["check_partitioning", "prepare", "uses_object_store"]


def check_partitioning(config: JobConfig) -> None:
    """Refuse a partitioning the sink cannot keep: columns that are neither ``ds`` nor kept, or an
    ``overwrite_partition`` of anything but the run date."""
    other_parts = [c for c in config.sink.partition_by if c != "ds" and c not in config.source.keep_columns]
    if other_parts:
        raise JobError(
            f"sink.partition_by {other_parts} are neither 'ds' nor in source.keep_columns; "
            "partition by ds (the run date) or keep those source columns"
        )
    if config.sink.mode == "overwrite_partition" and config.sink.partition_by != ["ds"]:
        raise JobError("sink.mode overwrite_partition replaces one run date: use sink.partition_by: [ds]")


def uses_object_store(config: JobConfig) -> bool:
    """Whether the job names an ``s3a://``/``s3://`` location (a session built for it needs the S3A jars)."""
    locations = [config.source.path, config.sink.path, config.sink.quarantine_path, config.run.runs_path]
    return any(str(loc).startswith(("s3a://", "s3://")) for loc in locations if loc)


def prepare(config: JobConfig, *, spark: "SparkSession | None", log: RunLog, recorder: Any,
            clock: StageClock, labels: Any = None) -> Prepared:
    """Checks that fail in seconds before any Spark work: partitioning, the model, addresses, locations.

    ``labels`` (:class:`pipeline.spark.job_labels.JobLabels`) gets the session once there is one: from then
    on every Spark job of the run names its stage."""
    from pipeline import faults as fault_hooks
    from pipeline.io.preflight import check_locations
    from pipeline.small_jobs import small_job
    from pipeline.spark.reach import check_job_addresses
    from pipeline.spark.session import get_session

    log.stage_now = "model check"
    check_partitioning(config)
    check_spark()  # the installed pyspark against the supported lines, before a session is built or used
    kind = get_task_kind(config.task.kind)
    kind.job.check_extras(config, kind.task)  # a missing library fails here with its pip line, not on an executor
    kind, task = kind_and_task(config)
    config, model = checked_model(config, kind, task)  # before any Spark work: a bad model fails in seconds
    recorder.note(model_name=model.name, model_revision=model.revision)
    clock.lap("model check", model=f"{model.name}@{model.revision}")
    log.stage_now = "session"
    if spark is None:  # a metastore or object store endpoint nobody answers fails in seconds, not minutes
        check_job_addresses(config, timeout_s=config.spark.connect_timeout_s)
    small = small_job(config, spark=spark)
    if small:
        log.line(f"[{config.job}] small job ({small.why}): a light local session, committed from the driver "
                 "(spark.small_job_rows: 0 turns this off)")
    spark = spark or get_session(config.spark, object_stores=uses_object_store(config),
                                 storage=config.storage.options(), small=small.small)
    if labels is not None:
        labels.attach(spark)
        labels.stage("pre-flight")
    log.stage_now = "pre-flight"
    if small:  # the model loads in a worker while the driver plans (pipeline.spark.warmup)
        from pipeline.spark.warmup import start_warm_up, warm_up_plan

        if (warm := warm_up_plan(config, model_path=model.path, task_class=kind.task,
                                     model_revision=model.revision)) is not None:
            start_warm_up(spark, warm, labels=labels)
    if is_connect(spark):  # a Connect client may talk to a server of another Spark line
        check_spark(spark.version, where="the Spark Connect server")
    recorder.note(spark=spark)
    clock.lap("session", small=small.small or None)
    # a remote path the session cannot reach fails here, before any work
    check_locations(spark, source=config.source, sink=config.sink,
                    files={"run.summary_path": config.run.summary_path, "run.report_path": config.run.report_path})
    check_staging_root(config)
    recorder.flush()  # a runs table written through the session (a Volume, abfss://): its started row, now
    clock.lap("pre-flight")
    return Prepared(config=config, kind=kind, task=task, model=model, spark=spark, small=small.small,
                    scored_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
                    faults=fault_hooks.from_env(config.run.faults), log=log, clock=clock, labels=labels)
