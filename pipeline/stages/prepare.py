"""Prepare: the checks that fail in seconds, before any Spark work, and the session the run uses.

Partitioning, the model (resolved, checked and its revision hashed by the task kind), the addresses the job
names, the session (light for a small job, :mod:`pipeline.stages.small_jobs`, with the model warming up in a
worker meanwhile), the locations the session must reach, and the staging root.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from pipeline.core.compat import check_spark
from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.core.logs import RunLog
from pipeline.core.metrics import StageClock
from pipeline.registry import get_task_kind
from pipeline.core.sessions import is_connect
from pipeline.stages.outcomes import Prepared, kind_and_task
from pipeline.stages.resume import check_staging_root
from pipeline.tasks.job import checked_model

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["check_partitioning", "prepare", "source_log", "uses_object_store"]


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


class _Beside:
    """``fn(*args)`` in a thread of its own: :meth:`result` is its value or raises its error, :meth:`exception`
    its error (None: none), ``done_at`` the ``clock()`` reading when it ended (both wait for it)."""

    def __init__(self, fn: Any, *args: Any, clock: Any) -> None:
        import threading

        self._value: Any = None
        self._error: BaseException | None = None
        self.done_at = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn, args, clock), daemon=True,
                                        name="sbi-model-check")
        self._thread.start()

    def _run(self, fn: Any, args: tuple[Any, ...], clock: Any) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self._error = exc
        finally:
            self.done_at = clock()

    def exception(self) -> BaseException | None:
        self._thread.join()
        return self._error

    def result(self) -> Any:
        if self.exception() is not None:
            raise self._error  # type: ignore[misc]
        return self._value


def source_log(config: JobConfig) -> Any:
    """The Delta source's log, read once (:class:`pipeline.io.delta.state.TableState`; its version pins what the
    run reads); None for other sources, a stream, or a log this process cannot read."""
    from pipeline.io.delta.state import read_state

    if config.source.format != "delta" or not config.source.path or config.source.stream is not None:
        return None
    state = read_state(config.source.location)
    return state if state is not None and state.exists else None


def prepare(config: JobConfig, *, spark: "SparkSession | None", log: RunLog, recorder: Any,
            clock: StageClock, labels: Any = None) -> Prepared:
    """Checks that fail in seconds before any Spark work: partitioning, the model, addresses, locations.

    ``labels`` (:class:`pipeline.spark.job_labels.JobLabels`) gets the session once there is one: from then
    on every Spark job of the run names its stage."""
    from pipeline.core import faults as fault_hooks
    from pipeline.io.preflight import check_locations
    from pipeline.stages.small_jobs import small_job
    from pipeline.spark.reach import check_job_addresses
    from pipeline.spark.session import get_session

    log.stage_now = "model check"
    check_partitioning(config)
    check_spark()  # the installed pyspark against the supported lines, before a session is built or used
    kind = get_task_kind(config.task.kind)
    kind.job.check_extras(config, kind.task)  # a missing library fails here with its pip line, not on an executor
    kind, task = kind_and_task(config)
    if spark is None:  # a metastore or object store endpoint nobody answers fails in seconds, not minutes
        check_job_addresses(config, timeout_s=config.spark.connect_timeout_s)
    source_state = source_log(config)  # the source's log, read once: the small job's size, then the identity
    small = small_job(config, spark=spark, source_state=source_state)
    if small:
        log.line(f"[{config.job}] small job ({small.why}): a light local session, committed from the driver "
                 "(spark.small_job_rows: 0 turns this off)")
    # the model is checked (plain Python and file reads) while the session starts: side by side
    checking = _Beside(checked_model, config, kind, task, clock=clock.clock)
    if spark is None:
        log.stage_now = "session"
        try:
            spark = get_session(config.spark, object_stores=uses_object_store(config),
                                storage=config.storage.options(), small=small.small)
        except BaseException:
            log.stage_now = "model check"
            if (error := checking.exception()) is not None:  # a bad model is the error to report: found first
                raise error from None
            log.stage_now = "session"
            raise
    log.stage_now = "model check"
    config, model = checking.result()  # before any Spark job: a bad model fails here
    recorder.note(model_name=model.name, model_revision=model.revision)
    clock.lap_until("model check", checking.done_at, model=f"{model.name}@{model.revision}")
    clock.lap("session", small=small.small or None)  # what the session's start took beyond the model check
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
    # a remote path the session cannot reach fails here, before any work
    check_locations(spark, source=config.source, sink=config.sink,
                    files={"run.summary_path": config.run.summary_path, "run.report_path": config.run.report_path})
    check_staging_root(config)
    recorder.flush()  # a runs table written through the session (a Volume, abfss://): its started row, now
    clock.lap("pre-flight")
    return Prepared(config=config, kind=kind, task=task, model=model, spark=spark, small=small.small,
                    source_state=source_state,
                    scored_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
                    faults=fault_hooks.from_env(config.run.faults), log=log, clock=clock, labels=labels)
