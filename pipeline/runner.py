"""Orchestrate one job: read -> infer on the executors -> write Delta -> report.

The only module that wires sources, the UDF glue, sinks and metrics together.
``run_job`` is what spark-submit entries, the CLI and notebooks call::

    from pipeline import load_config, run_job
    summary = run_job(load_config("conf/score_documents.yaml", overrides=["source.limit=100"]))
    assert summary.complete
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.fingerprint import task_fingerprint
from pipeline.metrics import RunSummary, StageClock, batch_metrics
from pipeline.registry import ModelInfo, TaskKind, get_task_kind
from pipeline.spark.checks import QUARANTINED_STATUSES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["JobError", "plan_inference_tasks", "prepare_inputs", "prepare_scores", "run_job", "score_inputs"]

# task_fingerprint: what incremental runs compare besides the input (pipeline.fingerprint)
LINEAGE_COLUMNS = ("model_name", "model_revision", "task_fingerprint", "run_id", "scored_at")


def content_hash(input_columns: tuple[str, ...]) -> Any:
    """sha256 of a row's task inputs: what incremental runs compare to find changed documents."""
    from pyspark.sql import functions as F

    if input_columns == ("text",):
        digest = F.sha2(F.col("text").cast("binary"), 256)
    else:
        digest = F.sha2(F.to_json(F.struct(*[F.col(c) for c in input_columns])), 256)
    # a null input still needs a key, or the anti-join would rescore it every run
    return F.coalesce(digest, F.lit("null"))


def _check_ids(inputs: "DataFrame", id_column: str) -> None:
    bad = inputs.groupBy("id").count().where("`count` > 1 OR id IS NULL").limit(5).collect()
    if bad:
        shown = ", ".join(f"{r['id']!r} x{r['count']}" for r in bad)
        raise JobError(
            f"source.unique_ids is set but id column {id_column!r} has null or duplicate ids ({shown}); "
            "deduplicate the source or set source.unique_ids: false"
        )


def _known_bad(spark: "SparkSession", config: JobConfig, fingerprint: str) -> "DataFrame | None":
    """The (id, content hash) keys the quarantine table holds for ``fingerprint``; None without a quarantine."""
    from pipeline.io.sources import SourceError, read_delta

    try:
        quarantine = read_delta(spark, config.sink.resolved_quarantine_path())
    except SourceError:
        return None
    id_col = config.source.id_column
    if any(c not in quarantine.columns for c in (id_col, "content_hash", "task_fingerprint")):
        return None
    return (quarantine.where(quarantine["task_fingerprint"] == fingerprint)
            .select(quarantine[id_col].alias("_bad_id"), quarantine["content_hash"].alias("_bad_hash")).distinct())


def _incremental_filter(spark: "SparkSession", inputs: "DataFrame", config: JobConfig,
                        fingerprint: str, notes: dict[str, Any] | None = None) -> "DataFrame":
    """Rows whose (id, content hash, task fingerprint) the output lacks (an anti-join in Spark).

    ``fingerprint`` is this run's :func:`pipeline.fingerprint.task_fingerprint`: a row scored
    with another model revision or other result-changing settings is scored again. A row the
    quarantine holds under the same key failed before and would fail again: skipped (and put in
    ``notes["known_bad"]``, lazily, to be counted) unless ``run.retry_quarantined``, so one poison row
    left in the source neither fails every night's error budget nor grows the quarantine.
    """
    from pipeline.io.sources import SourceError, read_delta

    if not config.sink.path:
        raise JobError("run.incremental needs sink.path (the output Delta table to compare against)")
    if not config.run.retry_quarantined:
        bad = _known_bad(spark, config, fingerprint)
        if bad is not None:
            on = inputs["id"].eqNullSafe(bad["_bad_id"]) & (inputs["content_hash"] == bad["_bad_hash"])
            if notes is not None:
                notes["known_bad"] = inputs.join(bad, on=on, how="left_semi")
            inputs = inputs.join(bad, on=on, how="left_anti")
    try:
        done = read_delta(spark, config.sink.path)
    except SourceError:
        return inputs  # no output yet: everything is new
    missing = [c for c in ("content_hash", "task_fingerprint") if c not in done.columns]
    if missing:
        raise JobError(f"output {config.sink.path} has no {' or '.join(missing)} column (written by an older "
                       "version); run once without run.incremental to rebuild it")
    done = (done.where(done["task_fingerprint"] == fingerprint)
            .select(done[config.source.id_column].alias("_done_id"), done["content_hash"].alias("_done_hash"))
            .distinct())
    # null-safe on the id: a null-id row scored before is not new every night (it was, and grew the table)
    return inputs.join(done, on=inputs["id"].eqNullSafe(done["_done_id"])
                       & (inputs["content_hash"] == done["_done_hash"]), how="left_anti")


def _done_keys(spark: "SparkSession", path: str, id_column: str, ds: dt.date) -> "DataFrame | None":
    """The ids the table at ``path`` holds for run date ``ds`` (all its ids without a ``ds`` column);
    None when there is no table. Read at the table's current version, pinned."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import SourceError, read_delta

    try:
        table = read_delta(spark, path)
    except SourceError:
        return None
    if id_column not in table.columns:
        return None
    if "ds" in table.columns:
        table = table.where(F.col("ds") == F.lit(ds).cast("date"))
    return table.select(F.col(id_column).alias("_done_id"))


def _append_key_filter(spark: "SparkSession", inputs: "DataFrame", config: JobConfig,
                       ds: dt.date) -> tuple["DataFrame", int | None]:
    """``inputs`` without the rows whose key (id, ds) the output already holds; and the row count before
    (None when there was nothing to compare against).

    An append is keyed on the row, not the run: a retry with another setting (a smaller batch after
    an out-of-memory error), or a rerun after part of the day went, writes only the keys missing.
    The id compares null-safely. (The quarantine is not consulted: a retry scores a failed row again,
    and its quarantine commit, keyed on the run, finds the earlier try's.)
    """
    done = _done_keys(spark, config.sink.path, config.source.id_column, ds) if config.sink.path else None
    if done is None:
        return inputs, None
    done = done.distinct()
    before = inputs.count()
    return inputs.join(done, on=inputs["id"].eqNullSafe(done["_done_id"]), how="left_anti"), before


def _run_rows_remain(spark: "SparkSession", config: JobConfig, *, by: str | None, ds: dt.date) -> bool:
    """Whether the output still holds rows of run ``by`` (for ``ds`` when partitioned by it): a transaction
    id found in the table is a fast path only while the rows it stood for are there. Unknown run: True."""
    from pipeline.io.sources import SourceError

    if not by or not config.sink.path:
        return True
    day = ds if "ds" in config.sink.partition_by else None
    try:
        return _rows_written(spark, config.sink.path, by, day).limit(1).count() > 0
    except SourceError:
        return False


def _uses_object_store(config: JobConfig) -> bool:
    """Whether the job names an ``s3a://``/``s3://`` location (a session built for it needs the S3A jars)."""
    locations = [config.source.path, config.sink.path, config.sink.quarantine_path, config.run.runs_path]
    return any(str(loc).startswith(("s3a://", "s3://")) for loc in locations if loc)


def _kind_and_task(config: JobConfig, task: Any = None) -> tuple[TaskKind, Any]:
    """The registered kind of ``config.task``, and ``task`` (built from the config only when not given)."""
    kind = get_task_kind(config.task.kind)
    return kind, task if task is not None else kind.task(config.task, model=config.model, batching=config.batching)


def prepare_inputs(spark: "SparkSession", config: JobConfig, *, revision: str, task: Any = None,
                   notes: dict[str, Any] | None = None) -> "DataFrame":
    """The validated rows to score: ``id``, the task's input columns, ``content_hash`` and the kept columns.

    The task kind reads them (:meth:`pipeline.registry.TaskJob.read_inputs`). With ``run.incremental``
    only rows that are new, changed, or were scored with another task fingerprint (another model
    ``revision`` or result-changing settings, see :mod:`pipeline.fingerprint`) remain.
    """
    kind, task = _kind_and_task(config, task)
    inputs = kind.job.read_inputs(spark, config, task)
    if config.source.unique_ids:
        _check_ids(_parsed_rows(inputs), config.source.id_column)
    inputs = _key_malformed_lines(inputs.withColumn("content_hash", content_hash(tuple(task.input_columns))))
    if config.run.incremental:
        inputs = _incremental_filter(spark, inputs, config, task_fingerprint(config, revision=revision), notes)
    return inputs


def plan_inference_tasks(spark: "SparkSession", config: JobConfig, rows: int, task: Any = None) -> int:
    """Inference tasks for ``rows`` rows: ``source.repartition`` if set, else planned from rows and cores.

    Rows per task: ``spark.rows_per_task`` when set, else the task's own preference (``rows_per_task``
    on the task class: generation prefers small tasks), else the default.
    """
    from pipeline.spark.planning import count_cores, plan_tasks

    if config.source.repartition is not None:
        return config.source.repartition
    rows_per_task = config.spark.rows_per_task
    if "rows_per_task" not in config.spark.model_fields_set:
        rows_per_task = getattr(task, "rows_per_task", None) or rows_per_task
    return plan_tasks(rows, cores=count_cores(spark), rows_per_task=rows_per_task)


def _deal(inputs: "DataFrame", tasks: int, task: Any) -> "DataFrame":
    """``inputs`` dealt to ``tasks`` tasks, weighted by the length of the task's first input column if it has one."""
    from pipeline.spark.planning import deal_rows

    types = dict(inputs.dtypes)
    first = next(iter(task.input_columns), None)
    weight = first if types.get(first) in ("string", "binary") else None
    return deal_rows(inputs, tasks, weight=weight, order=tuple(c for c in ("id", "content_hash") if c in types))


def score_inputs(
    inputs: "DataFrame", config: JobConfig, *, tasks: int, run_id: str, ds: dt.date, scored_at: dt.datetime,
    model: ModelInfo, faults: dict[str, Any] | None = None, task: Any = None, progress_dir: str | None = None,
) -> "DataFrame":
    """The lazily scored rows with lineage, in ``tasks`` inference tasks of equal rows and mixed lengths.

    The rows are dealt out by :func:`pipeline.spark.planning.deal_rows` (deterministic across
    task retries), and the source's own split count never decides the parallelism. Each task's counts ride in
    ``METRICS_COLUMN`` (see ``pipeline.spark.run_metrics``); drop it before writing.
    """
    from pyspark.sql import functions as F

    from pipeline.spark.udf import METRICS_COLUMN, InferencePlan, apply_inference

    kind, task = _kind_and_task(config, task)
    plan = InferencePlan(
        task=config.task, model=config.model.model_copy(update={"path": model.path}), batching=config.batching,
        keep_columns=("content_hash", *config.source.keep_columns),
        input_columns=(*task.input_columns, *_malformed_input(inputs)),
        job=config.job, progress_interval_s=config.run.progress_interval_s if config.run.progress else None,
        faults=tuple((faults or {}).items()), metrics_column=METRICS_COLUMN, task_class=kind.task,
        id_column=config.source.id_column, progress_dir=progress_dir,
    )
    scored = apply_inference(_deal(inputs, tasks, task), plan).withColumnRenamed("id", config.source.id_column)
    scored = scored.select(
        "*",
        F.lit(model.name).alias("model_name"),
        F.lit(model.revision).alias("model_revision"),
        F.lit(task_fingerprint(config, revision=model.revision)).alias("task_fingerprint"),
        F.lit(run_id).alias("run_id"),
        F.lit(scored_at).cast("timestamp").alias("scored_at"),
    )
    if "ds" in config.sink.partition_by:
        scored = scored.withColumn("ds", F.lit(ds).cast("date"))
    return scored


def prepare_scores(
    spark: "SparkSession", config: JobConfig, *, run_id: str, ds: dt.date, scored_at: dt.datetime,
    model: ModelInfo, faults: dict[str, Any] | None = None, task: Any = None, tasks: int | None = None,
) -> tuple["DataFrame", "DataFrame"]:
    """``(inputs, scored)``: :func:`prepare_inputs` and :func:`score_inputs` in one call.

    Without ``tasks`` the inputs are counted to plan them.
    """
    inputs = prepare_inputs(spark, config, revision=model.revision, task=task)
    tasks = tasks or plan_inference_tasks(spark, config, inputs.count(), task)
    scored = score_inputs(inputs, config, tasks=tasks, run_id=run_id, ds=ds, scored_at=scored_at,
                          model=model, faults=faults, task=task)
    return inputs, scored


def _quarantine_rows(scored: "DataFrame", inputs: "DataFrame", config: JobConfig,
                     input_columns: tuple[str, ...]) -> "DataFrame":
    """Failed rows with their error, lineage and original inputs, one row per failed row.

    The inputs are joined back by id (null-safe) and content hash. Rows sharing
    both (``source.unique_ids: false``) have the same inputs, the content hash
    being theirs, so the inputs are deduplicated first: a key read twice and
    failed twice gives two quarantine rows, not four.
    """
    from pyspark.sql import functions as F

    id_col = config.source.id_column
    failed = scored.where(F.col("status").isin(*QUARANTINED_STATUSES)).select(
        id_col, "content_hash", "status", "error", *LINEAGE_COLUMNS,
        *(["ds"] if "ds" in scored.columns else []),
    )
    keys = failed.select(F.col(id_col).alias("_k_id"), F.col("content_hash").alias("_k_hash")).distinct()
    originals = (_malformed_originals(inputs, input_columns)
                 .select(F.col("id").alias("_q_id"), F.col("content_hash").alias("_q_hash"),
                         *[F.col(c).alias(f"input_{c}") for c in input_columns])
                 .join(keys, on=(F.col("_q_id").eqNullSafe(F.col("_k_id"))) & (F.col("_q_hash") == F.col("_k_hash")),
                       how="left_semi")
                 .dropDuplicates(["_q_id", "_q_hash"]))
    joined = failed.join(originals, on=(failed[id_col].eqNullSafe(originals["_q_id"]))
                         & (failed["content_hash"] == originals["_q_hash"]), how="left")
    return joined.drop("_q_id", "_q_hash")


# --- malformed source lines (JSON lines Spark could not parse): flagged by the task, quarantined raw ---
def _malformed_input(inputs: "DataFrame") -> tuple[str, ...]:
    """The raw-line column for the task when the source has one (``pipeline.io.sources.MALFORMED_COLUMN``)."""
    from pipeline.io.sources import MALFORMED_COLUMN

    return (MALFORMED_COLUMN,) if MALFORMED_COLUMN in inputs.columns else ()


def _parsed_rows(inputs: "DataFrame") -> "DataFrame":
    """``inputs`` without the malformed lines (those have no id to check)."""
    if not _malformed_input(inputs):
        return inputs
    return inputs.where(inputs[_malformed_input(inputs)[0]].isNull())


def _key_malformed_lines(inputs: "DataFrame") -> "DataFrame":
    """A malformed line has no id: its ``content_hash`` is its raw text's, so two bad lines stay apart."""
    from pyspark.sql import functions as F

    if not _malformed_input(inputs):
        return inputs
    raw = F.col(_malformed_input(inputs)[0])
    return inputs.withColumn("content_hash", F.when(raw.isNotNull(), F.sha2(raw, 256))
                             .otherwise(F.col("content_hash")))


def _malformed_originals(inputs: "DataFrame", input_columns: tuple[str, ...]) -> "DataFrame":
    """``inputs`` with a malformed line's raw text in the first input column (``input_text`` in quarantine)."""
    from pyspark.sql import functions as F

    if not _malformed_input(inputs) or not input_columns:
        return inputs
    raw, first = F.col(_malformed_input(inputs)[0]), input_columns[0]
    return inputs.withColumn(first, F.when(raw.isNotNull(), raw.cast(inputs.schema[first].dataType))
                             .otherwise(F.col(first)))


def _rows_written(spark: "SparkSession", path: str, run_id: str, ds: dt.date | None,
                  version: int | None = None) -> "DataFrame":
    """This run's rows in the table at ``path``, as of ``version`` (the commit this run made; None: latest)."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import read_delta

    written = read_delta(spark, path, version=version).where(F.col("run_id") == F.lit(run_id))
    if ds is not None:
        written = written.where(F.col("ds") == F.lit(ds).cast("date"))
    return written


def _check_before_commit(check: Any, scored: "DataFrame", config: JobConfig) -> None:
    """Refuse to commit scored rows that lost or duplicated input rows, or that failed beyond the error budget."""
    from pipeline.spark.checks import error_budget, top_errors

    if not check.ok:
        raise JobError(
            f"scoring did not return every input row exactly once, so nothing was committed: {check.describe()}. "
            "A source that changed while the job ran (files added to a folder) does this; otherwise it is a bug "
            "or a broken executor, not bad input: rerun the job, and report it if it repeats"
        )
    budget = error_budget(check.errors, check.rows_out, max_fraction=config.run.max_error_fraction,
                          max_errors=config.run.max_errors)
    if budget.exceeded:
        raise JobError(
            f"{budget.describe(top_errors(scored))}. Nothing was committed (neither the output nor the quarantine "
            "table). Fix the cause (a bad model or deploy, batching.max_length beyond the model, broken input), "
            "or raise run.max_error_fraction / run.max_errors if these failures are expected"
        )


def _check_written(in_keys: "DataFrame", written: "DataFrame", quarantined: "DataFrame | None",
                   id_column: str) -> Any:
    """The input keys against what the output and quarantine tables hold for this run (None: not keyed by row).

    Output tables of one row per input row carry the id and ``content_hash``;
    quarantine rows all have status ``error``, so ``errors`` of the result
    counts them. One Spark action over both tables.
    """
    from pyspark.sql import functions as F

    from pipeline.spark.checks import identity_check, key_counts

    columns = [id_column, "content_hash", "status"]
    if not set(columns) <= set(written.columns):
        return None
    held = written.select(*columns)
    if quarantined is not None:
        held = held.unionByName(quarantined.select(id_column, "content_hash", F.lit("error").alias("status")))
    return identity_check(in_keys, key_counts(held, id_column=id_column, status_column="status"))
def _already_committed(config: JobConfig, *, run_id: str, ds: dt.date, model: ModelInfo, version: int | None,
                       by: str | None, out: TextIO, writer: str) -> RunSummary:
    """The summary of a retry of a run whose commit already landed: nothing scored, nothing written."""
    note = f"already committed at version {version} by run {by or '?'}; nothing to do"
    print(f"[{config.job}] run {run_id}: {note}", file=out, flush=True)
    return RunSummary(
        job=config.job, run_id=run_id, ds=ds.isoformat(), rows_in=0, rows_out=0, status={}, seconds=0.0, tokens=0,
        padded_tokens=0, batches=0, model_loads={}, model_name=model.name, model_revision=model.revision,
        output=str(config.sink.path or config.sink.table), delta_version=version, writer=writer,
        details={"already committed": note},
    )


def run_job(config: JobConfig, *, spark: "SparkSession | None" = None, out: TextIO = sys.stdout) -> RunSummary:
    """Run ``config`` end to end and return (and print) its summary.

    Rows whose scoring failed go to the quarantine table (``sink.quarantine_path``),
    the rest to the output. Before any commit the scored ``(id, content_hash)``
    keys must match the input's and the failed rows stay within the error budget
    (``pipeline.spark.checks``); the quarantine commits first, then the output, and
    both are read back at the versions committed and checked again by key.
    Every run, failed or not, leaves a row in the runs table (``pipeline.runs``).
    """
    # every run on the record (runs table, report, MLflow); recording never fails the run
    from pipeline.runs import RunRecorder

    run = config.run.model_copy(update={"run_id": config.run.resolved_run_id(), "ds": config.run.resolved_ds()})
    config = config.model_copy(update={"run": run})  # one run id and ds for the record and the run
    clock = StageClock()
    recorder = RunRecorder.begin(config, run_id=run.run_id, ds=run.ds, out=out)
    clock.lap("runs table")
    try:
        summary = _run_job(config, spark=spark, out=out, recorder=recorder, clock=clock)
    except BaseException as exc:
        recorder.end(error=exc)
        raise
    clock.skip()
    recorder.end(summary=summary)
    clock.lap("runs table")  # after the summary was printed: the returned summary has it, the printed one not
    summary.stage_seconds = dict(clock.seconds)
    return summary


def _run_job(config: JobConfig, *, spark: "SparkSession | None", out: TextIO, recorder: Any,
             clock: StageClock) -> RunSummary:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipeline import faults as fault_hooks
    from pipeline.io.paths import check_locations
    from pipeline.io.sinks import committed_run_via, resolve_writer, run_app_id, source_snapshot, write_sink
    from pipeline.io.sources import is_delta_table
    from pipeline.spark.progress import JobProgress, rows_folder, stage_source
    from pipeline.spark.reach import check_job_addresses
    from pipeline.spark.checks import identity_check, key_counts, replaced_by
    from pipeline.spark.run_metrics import observe_counts
    from pipeline.spark.session import get_session
    from pipeline.spark.udf import METRICS_COLUMN

    other_parts = [c for c in config.sink.partition_by if c != "ds" and c not in config.source.keep_columns]
    if other_parts:
        raise JobError(
            f"sink.partition_by {other_parts} are neither 'ds' nor in source.keep_columns; "
            "partition by ds (the run date) or keep those source columns"
        )
    if config.sink.mode == "overwrite_partition" and config.sink.partition_by != ["ds"]:
        raise JobError("sink.mode overwrite_partition replaces one run date: use sink.partition_by: [ds]")

    kind, task = _kind_and_task(config)
    if config.model.path.startswith("models:/"):  # an alias is pinned to one version for every worker
        from pipeline.tracking import pin_registry_model

        config = pin_registry_model(config)
    model = kind.job.model_info(config, task)  # before any Spark work: a bad model fails in seconds
    model_name, revision = model.name, model.revision
    recorder.note(model_name=model_name, model_revision=revision)
    clock.lap("model check")
    if spark is None:  # a metastore or object store endpoint nobody answers fails in seconds, not minutes
        check_job_addresses(config, timeout_s=config.spark.connect_timeout_s)
    spark = spark or get_session(config.spark, object_stores=_uses_object_store(config))
    recorder.note(spark=spark)
    clock.lap("session")
    check_locations(spark, config)  # a remote path the session cannot reach fails here, before any work
    clock.lap("pre-flight")
    run_id = config.run.resolved_run_id()
    ds = config.run.resolved_ds()
    scored_at = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    faults = fault_hooks.from_env(config.run.faults)
    # one Delta transaction id per logical run: a fast path for a retry whose commit landed, taken only while
    # that run's rows are still in the output (appends are keyed on the rows themselves below)
    app_id = run_app_id(config, model_revision=revision, source_snapshot=source_snapshot(config))
    if config.run.incremental or config.sink.mode == "append":
        done = committed_run_via(spark, config.sink.path, app_id) if config.sink.path else None
        if done and _run_rows_remain(spark, config, by=done[1], ds=ds):
            return _already_committed(config, run_id=run_id, ds=ds, model=model, version=done[0], by=done[1], out=out,
                                      writer=resolve_writer(spark, config.sink))
        if done:
            # the transaction id outlived the rows (the day deleted, restored or overwritten since): the rows
            # missing by key are scored, under this try's own transaction id, or the commit would be skipped
            print(f"[{config.job}] run {run_id}: run {done[1]} committed at version {done[0]} but its rows are no "
                  f"longer in {config.sink.path}; scoring the rows missing by key", file=out, flush=True)
            app_id = f"{app_id}-{run_id}"
    clock.lap("idempotency")

    notes: dict[str, Any] = {}
    inputs = prepare_inputs(spark, config, revision=revision, task=task, notes=notes)
    known_bad = notes["known_bad"].count() if "known_bad" in notes else 0
    rows_before = None
    if config.sink.mode == "append" and not config.run.incremental:
        inputs, rows_before = _append_key_filter(spark, inputs, config, ds)
    rows_in = inputs.count()
    if rows_before is not None and rows_before > rows_in:
        print(f"[{config.job}] run {run_id}: {rows_before - rows_in:,} of {rows_before:,} row(s) already in "
              f"{config.sink.path} for ds {ds} (key: id, ds): not scored again", file=out, flush=True)
    tasks = plan_inference_tasks(spark, config, rows_in, task)
    rows_dir = rows_folder(spark) if config.run.progress and rows_in else None  # workers' rows done, same host
    scored = score_inputs(inputs, config, tasks=tasks, run_id=run_id, ds=ds, scored_at=scored_at,
                          model=model, faults=faults, task=task, progress_dir=rows_dir)
    sink = config.sink
    if config.run.incremental and sink.mode != "append":
        # new rows join the run's partition; replacing it would drop the rows scored earlier today
        sink = sink.model_copy(update={"mode": "append"})
    mode_note = " incremental" if config.run.incremental else ""
    print(f"[{config.job}] run {run_id}: scoring {rows_in:,}{mode_note} rows in {tasks} tasks with {model_name} "
          f"@ {revision} -> {sink.path or sink.table} (ds {ds}, mode {sink.mode})", file=out, flush=True)

    # Scored rows feed the checks and two writes (quarantine, output): keep them so inference runs once.
    scored = scored.persist(StorageLevel.MEMORY_AND_DISK)
    # the input keys feed the check before the commits and the one after them
    in_keys = key_counts(inputs, id_column="id").persist(StorageLevel.MEMORY_AND_DISK)
    # the tasks' counts are observed on the first action over the scored rows (the check, which runs
    # inference and fills the cache); their column is never written
    observed_scored, observed = observe_counts(scored, METRICS_COLUMN)
    progress = (JobProgress(stage_source(spark, rows_dir=rows_dir), job=config.job, planned_tasks=tasks,
                            rows_total=rows_in, interval=config.run.progress_interval_s, out=out)
                if config.run.progress and rows_in else nullcontext())
    clock.lap("planning")
    started = time.perf_counter()
    metadata = {"sbi.job": config.job, "sbi.run_id": run_id, "sbi.model_revision": revision}
    id_col = config.source.id_column
    quarantine_path = sink.resolved_quarantine_path()
    quarantine_version = None
    quarantine_run = run_id
    try:
        try:
            with progress:
                scored_check = identity_check(
                    in_keys, key_counts(observed_scored, id_column=id_col, status_column="status"))
            counts = observed.counts() if rows_in else {}
            _check_before_commit(scored_check, scored, config)
            errors = scored_check.errors
            clock.lap("inference and check")
            # quarantine first: a crash before the output commit leaves a partition a rerun replaces
            if errors or is_delta_table(spark, quarantine_path):
                # written even when empty once it exists, so a rerun replaces that day's failures too
                q = write_sink(_quarantine_rows(scored, inputs, config, tuple(task.input_columns)), sink,
                               partition_values={"ds": ds}, commit_metadata=metadata, path=quarantine_path,
                               txn_app_id=app_id)
                quarantine_version = q.version
                if q.already_committed:  # an earlier try of this run committed them: read back its rows
                    earlier = committed_run_via(spark, quarantine_path, app_id)
                    quarantine_run = (earlier and earlier[1]) or run_id
                fault_hooks.after_quarantine_commit(faults, version=q.version)
                clock.lap("quarantine commit")
            to_write = scored.drop(METRICS_COLUMN).where(~F.col("status").isin(*QUARANTINED_STATUSES))
            result = write_sink(
                kind.job.shape_output(to_write, config), sink,
                partition_values={"ds": ds}, commit_metadata=metadata, faults=faults, txn_app_id=app_id,
            )
            clock.lap("commit")
            if result.already_committed:  # a concurrent try of this very run committed first
                return _already_committed(config, run_id=run_id, ds=ds, model=model, version=result.version,
                                          by=None, out=out, writer=result.writer)
            if result.swept.get("files"):
                print(f"[{config.job}] swept {result.swept['files']} leftover file(s) "
                      f"({result.swept['bytes'] / 1e6:.1f} MB) of crashed writes from {result.output}",
                      file=out, flush=True)
        finally:
            scored.unpersist()
        seconds = time.perf_counter() - started

        partition_ds = ds if "ds" in sink.partition_by else None
        written = _rows_written(spark, result.output, run_id, partition_ds, version=result.version)
        quarantined = None
        if quarantine_version is not None:
            quarantined = _rows_written(spark, quarantine_path, quarantine_run, partition_ds,
                                        version=quarantine_version)
        written_check = _check_written(in_keys, written, quarantined, id_col)
    finally:
        in_keys.unpersist()
    if written_check is not None:
        rows_out, rows_quarantined = written_check.rows_out - written_check.errors, written_check.errors
    else:  # output rows are not one per input row (e.g. recommendations): counted, and checked by the kind
        rows_out = written.count()
        rows_quarantined = quarantined.count() if quarantined is not None else 0
    sample_cols = [c for c in (config.source.id_column, "label", "score", "completion", "finish_reason",
                               "n_tokens", "status")
                   if c in written.columns]
    clock.lap("read-back")
    samples = [r.asDict() for r in written.select(*sample_cols).limit(config.run.sample_rows).collect()]

    incomplete = None
    if written_check is not None and not written_check.ok:
        incomplete = "read back after the commit: " + written_check.describe(what="written")
    incomplete = incomplete or kind.job.check_complete(rows_in=rows_in, rows_out=rows_out,
                                                       rows_quarantined=rows_quarantined, counts=counts)
    replaced = None
    if not incomplete and result.version is not None and rows_out:
        replaced = replaced_by(spark, result.output, run_id=run_id, version=result.version,
                               partition={"ds": ds} if partition_ds is not None else {})
    details = kind.job.after_commit(spark, config, output=result.output, run_id=run_id, ds=ds) if not incomplete else {}
    details = {**kind.job.summary_lines(spark, config, counts, model), **details}
    if known_bad:
        details["known-bad rows skipped"] = (f"{known_bad:,} (quarantined earlier with the same content and task "
                                             "fingerprint; --retry-quarantined scores them again)")
    malformed = int(counts.get("status", {}).get("malformed", 0))
    if malformed:
        details["malformed input"] = (f"{malformed:,} source line(s) could not be parsed; quarantined with their "
                                      f"raw text in input_{task.input_columns[0]}")
    if counts.get("torch_threads"):  # {threads: tasks}: spark.task.cpus, or model.torch_threads
        details["torch threads"] = ", ".join(f"{t} ({n} tasks)" for t, n in sorted(counts["torch_threads"].items()))
    summary = RunSummary(
        job=config.job, run_id=run_id, ds=ds.isoformat(), rows_in=rows_in, rows_out=rows_out,
        rows_quarantined=rows_quarantined, quarantine=quarantine_path if quarantine_version is not None else None,
        status={k: int(v) for k, v in counts.get("status", {}).items()}, seconds=seconds,
        tokens=int(counts.get("tokens", 0)), padded_tokens=int(counts.get("padded_tokens", 0)),
        batches=int(counts.get("batches", 0)),
        model_loads={w: int(counts.get("model_loads", {}).get(w, 0)) for w in counts.get("tasks_per_worker", {})},
        model_name=model_name, model_revision=revision, output=result.output,
        delta_version=result.version, writer=result.writer,
        batch_sizes={k: int(v) for k, v in counts.get("batch_sizes", {}).items()}, samples=samples,
        incremental=config.run.incremental,
        retries={k: int(counts.get(k, 0)) for k in ("oom_splits", "adaptive_splits", "poison_bisections",
                                                     "task_retries") if counts.get(k)},
        precision_used=counts.get("precision_used", {}), precision_fallbacks=counts.get("precision_fallbacks", {}),
        generation_backend=counts.get("generation_backend", {}),
        load_seconds=float(counts.get("load_seconds", 0.0)), infer_seconds=float(counts.get("infer_seconds", 0.0)),
        tasks=tasks, rows_per_worker={w: int(n) for w, n in counts.get("rows_per_worker", {}).items()},
        incomplete=incomplete, details=details, replaced=replaced,
        batch_metrics=batch_metrics(counts),
    )
    clock.lap("summary")
    summary.stage_seconds = dict(clock.seconds)
    recorder.summary = summary  # a run failing its row check below is recorded with its counts
    print(summary.render(), file=out, flush=True)
    if config.run.summary_path:
        Path(config.run.summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(config.run.summary_path).write_text(summary.to_json())
    if not summary.complete:
        raise JobError(f"{incomplete}; see the summary above")
    return summary
