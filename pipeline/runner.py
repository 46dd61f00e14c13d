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
from pipeline.metrics import RunSummary, batch_metrics
from pipeline.registry import ModelInfo, TaskKind, get_task_kind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["JobError", "plan_inference_tasks", "prepare_inputs", "prepare_scores", "run_job", "score_inputs"]

LINEAGE_COLUMNS = ("model_name", "model_revision", "run_id", "scored_at")


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


def _incremental_filter(spark: "SparkSession", inputs: "DataFrame", config: JobConfig, revision: str) -> "DataFrame":
    """Rows whose (id, content hash) the output lacks for ``revision`` (an anti-join in Spark)."""
    from pipeline.io.sources import SourceError, read_delta

    if not config.sink.path:
        raise JobError("run.incremental needs sink.path (the output Delta table to compare against)")
    try:
        done = read_delta(spark, config.sink.path)
    except SourceError:
        return inputs  # no output yet: everything is new
    if "content_hash" not in done.columns:
        raise JobError(f"output {config.sink.path} has no content_hash column (written by an older version); "
                       "run once without run.incremental to rebuild it")
    done = (done.where(done["model_revision"] == revision)
            .select(done[config.source.id_column].alias("id"), "content_hash").distinct())
    return inputs.join(done, on=["id", "content_hash"], how="left_anti")


def _kind_and_task(config: JobConfig, task: Any = None) -> tuple[TaskKind, Any]:
    """The registered kind of ``config.task``, and ``task`` (built from the config only when not given)."""
    kind = get_task_kind(config.task.kind)
    return kind, task if task is not None else kind.task(config.task, model=config.model, batching=config.batching)


def prepare_inputs(spark: "SparkSession", config: JobConfig, *, revision: str, task: Any = None) -> "DataFrame":
    """The validated rows to score: ``id``, the task's input columns, ``content_hash`` and the kept columns.

    The task kind reads them (:meth:`pipeline.registry.TaskJob.read_inputs`). With ``run.incremental``
    only new or changed rows (for ``revision``) remain.
    """
    kind, task = _kind_and_task(config, task)
    inputs = kind.job.read_inputs(spark, config, task)
    if config.source.unique_ids:
        _check_ids(inputs, config.source.id_column)
    inputs = inputs.withColumn("content_hash", content_hash(tuple(task.input_columns)))
    if config.run.incremental:
        inputs = _incremental_filter(spark, inputs, config, revision)
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


def score_inputs(
    inputs: "DataFrame", config: JobConfig, *, tasks: int, run_id: str, ds: dt.date, scored_at: dt.datetime,
    model: ModelInfo, faults: dict[str, Any] | None = None, task: Any = None,
) -> "DataFrame":
    """The lazily scored rows with lineage, in ``tasks`` inference tasks hashed by id.

    Hashing by id is deterministic across task retries, and the source's own
    split count never decides the parallelism. Each task's counts ride in
    ``METRICS_COLUMN`` (see ``pipeline.spark.run_metrics``); drop it before writing.
    """
    from pyspark.sql import functions as F

    from pipeline.spark.udf import METRICS_COLUMN, InferencePlan, apply_inference

    kind, task = _kind_and_task(config, task)
    plan = InferencePlan(
        task=config.task, model=config.model.model_copy(update={"path": model.path}), batching=config.batching,
        keep_columns=("content_hash", *config.source.keep_columns), input_columns=tuple(task.input_columns),
        job=config.job, progress_interval_s=config.run.progress_interval_s if config.run.progress else None,
        faults=tuple((faults or {}).items()), metrics_column=METRICS_COLUMN, task_class=kind.task,
    )
    scored = apply_inference(inputs.repartition(tasks, "id"), plan).withColumnRenamed("id", config.source.id_column)
    scored = scored.select(
        "*",
        F.lit(model.name).alias("model_name"),
        F.lit(model.revision).alias("model_revision"),
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
    """Failed rows with their error, lineage and original inputs (joined back by id and content hash)."""
    from pyspark.sql import functions as F

    id_col = config.source.id_column
    failed = scored.where(F.col("status") == "error").select(
        id_col, "content_hash", "status", "error", *LINEAGE_COLUMNS,
        *(["ds"] if "ds" in scored.columns else []),
    )
    originals = inputs.select(F.col("id").alias(id_col), "content_hash",
                              *[F.col(c).alias(f"input_{c}") for c in input_columns])
    return failed.join(originals, on=[id_col, "content_hash"], how="left")


def _rows_written(spark: "SparkSession", path: str, run_id: str, ds: dt.date | None) -> "DataFrame":
    from pipeline.io.sources import read_delta

    written = read_delta(spark, path).where(f"run_id = '{run_id}'")
    if ds is not None:
        written = written.where(f"ds = DATE'{ds.isoformat()}'")
    return written


def run_job(config: JobConfig, *, spark: "SparkSession | None" = None, out: TextIO = sys.stdout) -> RunSummary:
    """Run ``config`` end to end and return (and print) its summary.

    Rows whose scoring failed go to the quarantine table (``sink.quarantine_path``),
    the rest to the output; the summary checks rows in = rows out + rows quarantined.
    Every run, failed or not, leaves a row in the runs table (``pipeline.runs``).
    """
    # --- issue 13: every run on the record (runs table, report, MLflow); recording never fails the run ---
    from pipeline.runs import RunRecorder

    run = config.run.model_copy(update={"run_id": config.run.resolved_run_id(), "ds": config.run.resolved_ds()})
    config = config.model_copy(update={"run": run})  # one run id and ds for the record and the run
    recorder = RunRecorder.begin(config, run_id=run.run_id, ds=run.ds, out=out)
    try:
        summary = _run_job(config, spark=spark, out=out, recorder=recorder)
    except BaseException as exc:
        recorder.end(error=exc)
        raise
    recorder.end(summary=summary)
    return summary


def _run_job(config: JobConfig, *, spark: "SparkSession | None", out: TextIO, recorder: Any) -> RunSummary:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipeline import faults as fault_hooks
    from pipeline.io.paths import check_locations
    from pipeline.io.sinks import write_sink
    from pipeline.io.sources import SourceError, is_delta_table
    from pipeline.spark.progress import JobProgress, stage_source
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
    if config.model.path.startswith("models:/"):  # issue 13: an alias is pinned to one version for every worker
        from pipeline.tracking import pin_registry_model

        config = pin_registry_model(config)
    model = kind.job.model_info(config, task)  # before any Spark work: a bad model fails in seconds
    model_name, revision = model.name, model.revision
    recorder.note(model_name=model_name, model_revision=revision)  # issue 13
    spark = spark or get_session(config.spark)
    recorder.note(spark=spark)  # issue 13
    check_locations(spark, config)  # a remote path the session cannot reach fails here, before any work
    run_id = config.run.resolved_run_id()
    ds = config.run.resolved_ds()
    scored_at = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    faults = fault_hooks.from_env(config.run.faults)

    inputs = prepare_inputs(spark, config, revision=revision, task=task)
    rows_in = inputs.count()
    tasks = plan_inference_tasks(spark, config, rows_in, task)
    scored = score_inputs(inputs, config, tasks=tasks, run_id=run_id, ds=ds, scored_at=scored_at,
                          model=model, faults=faults, task=task)
    sink = config.sink
    if config.run.incremental and sink.mode != "append":
        # new rows join the run's partition; replacing it would drop the rows scored earlier today
        sink = sink.model_copy(update={"mode": "append"})
    mode_note = " incremental" if config.run.incremental else ""
    print(f"[{config.job}] run {run_id}: scoring {rows_in:,}{mode_note} rows in {tasks} tasks with {model_name} "
          f"@ {revision} -> {sink.path or sink.table} (ds {ds}, mode {sink.mode})", file=out, flush=True)

    # Scored rows feed two writes (output, quarantine): keep them so inference runs once.
    scored = scored.persist(StorageLevel.MEMORY_AND_DISK)
    # the tasks' counts are observed while the output is written, and their column never written
    to_write, observed = observe_counts(scored, METRICS_COLUMN)
    progress = (JobProgress(stage_source(spark), job=config.job, planned_tasks=tasks, rows_total=rows_in,
                            interval=config.run.progress_interval_s, out=out)
                if config.run.progress and rows_in else nullcontext())
    started = time.perf_counter()
    metadata = {"sbi.job": config.job, "sbi.run_id": run_id, "sbi.model_revision": revision}
    try:
        with progress:
            result = write_sink(
                kind.job.shape_output(to_write.where(F.col("status") != "error"), config), sink,
                partition_values={"ds": ds}, commit_metadata=metadata, faults=faults,
            )
        counts = observed.counts() if rows_in else {}
        errors = int(counts.get("status", {}).get("error", 0))
        quarantine_path = sink.resolved_quarantine_path()
        quarantine_version = None
        if errors or is_delta_table(spark, quarantine_path):
            # written even when empty once it exists, so a rerun replaces that day's failures too
            q = write_sink(_quarantine_rows(scored, inputs, config, tuple(task.input_columns)), sink,
                           partition_values={"ds": ds}, commit_metadata=metadata, path=quarantine_path)
            quarantine_version = q.version
    finally:
        scored.unpersist()
    seconds = time.perf_counter() - started

    partition_ds = ds if "ds" in sink.partition_by else None
    written = _rows_written(spark, result.output, run_id, partition_ds)
    rows_out = written.count()
    rows_quarantined = 0
    if quarantine_version is not None:
        try:
            rows_quarantined = _rows_written(spark, quarantine_path, run_id, partition_ds).count()
        except SourceError:
            rows_quarantined = 0
    sample_cols = [c for c in (config.source.id_column, "label", "score", "completion", "finish_reason",
                               "n_tokens", "status")
                   if c in written.columns]
    samples = [r.asDict() for r in written.select(*sample_cols).limit(config.run.sample_rows).collect()]

    incomplete = kind.job.check_complete(rows_in=rows_in, rows_out=rows_out, rows_quarantined=rows_quarantined,
                                         counts=counts)
    details = kind.job.after_commit(spark, config, output=result.output, run_id=run_id, ds=ds) if not incomplete else {}
    details = {**kind.job.summary_lines(spark, config, counts, model), **details}
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
        incomplete=incomplete, details=details,
        batch_metrics=batch_metrics(counts),
    )
    recorder.summary = summary  # issue 13: a run failing its row check below is recorded with its counts
    print(summary.render(), file=out, flush=True)
    if config.run.summary_path:
        Path(config.run.summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(config.run.summary_path).write_text(summary.to_json())
    if not summary.complete:
        raise JobError(f"{incomplete}; see the summary above")
    return summary
