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
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config import JobConfig
from pipeline.metrics import RunSummary

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["JobError", "prepare_scores", "run_job"]

LINEAGE_COLUMNS = ("model_name", "model_revision", "run_id", "scored_at")


class JobError(RuntimeError):
    """A job could not run; the message says why and what to change."""


class _Progress(threading.Thread):
    """Prints task progress and rows scored every few seconds while the Spark job runs."""

    def __init__(self, spark: "SparkSession", acc: Any, job: str, interval: float, rows_in: int, out: TextIO) -> None:
        super().__init__(daemon=True)
        self.spark, self.acc, self.job, self.interval, self.rows_in, self.out = spark, acc, job, interval, rows_in, out
        self.stop = threading.Event()
        self.started = time.perf_counter()

    def run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self.stop.wait(self.interval):
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info:
                    done += info.numCompletedTasks
                    total += info.numTasks
            rows = int(self.acc.value.get("rows", 0))
            elapsed = time.perf_counter() - self.started
            pct = f" ({100 * rows / self.rows_in:.0f}%)" if self.rows_in else ""
            print(
                f"[{self.job}] {elapsed:6.0f}s  tasks {done}/{total}  rows scored {rows:,}/{self.rows_in:,}{pct}"
                f"  {rows / elapsed if elapsed else 0:,.0f} rows/s (counted as tasks finish)",
                file=self.out, flush=True,
            )


def _validate_model(config: JobConfig, task: Any) -> tuple[Path, str, str]:
    """Resolve and fingerprint the model on the driver, before any Spark work."""
    from pipeline.models.loading import check_model_kind, model_revision, resolve_model_path

    path = resolve_model_path(config.model.path)
    check_model_kind(path, getattr(task, "model_kind", task.kind))
    name = config.model.name or path.name
    return path, name, model_revision(path)


def prepare_scores(
    spark: "SparkSession", config: JobConfig, *, run_id: str, ds: dt.date, scored_at: dt.datetime,
    model_name: str, revision: str, counts_acc: Any,
) -> tuple["DataFrame", "DataFrame"]:
    """``(input, scored)``: the validated input DataFrame and the lazily scored output with lineage."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import read_source, select_input
    from pipeline.spark.udf import InferencePlan, apply_inference

    task = InferencePlan(config.task, config.model, config.batching).build_task()
    source = df = select_input(read_source(spark, config.source), config.source, task.input_columns)
    if config.source.repartition is None:
        parallelism = spark.sparkContext.defaultParallelism
        if df.rdd.getNumPartitions() < parallelism:
            # hash by id: deterministic across task retries, every core busy
            df = df.repartition(parallelism, "id")
    plan = InferencePlan(
        task=config.task, model=config.model, batching=config.batching,
        keep_columns=tuple(config.source.keep_columns), input_columns=tuple(task.input_columns),
    )
    scored = apply_inference(df, plan, counts_acc).withColumnRenamed("id", config.source.id_column)
    scored = scored.select(
        "*",
        F.lit(model_name).alias("model_name"),
        F.lit(revision).alias("model_revision"),
        F.lit(run_id).alias("run_id"),
        F.lit(scored_at).cast("timestamp").alias("scored_at"),
    )
    if "ds" in config.sink.partition_by:
        scored = scored.withColumn("ds", F.lit(ds).cast("date"))
    return source, scored


def run_job(config: JobConfig, *, spark: "SparkSession | None" = None, out: TextIO = sys.stdout) -> RunSummary:
    """Run ``config`` end to end and return (and print) its summary."""
    from pipeline.io.sinks import write_sink
    from pipeline.io.sources import read_delta
    from pipeline.spark.session import get_session
    from pipeline.spark.udf import CountsParam, InferencePlan

    other_parts = [c for c in config.sink.partition_by if c != "ds" and c not in config.source.keep_columns]
    if other_parts:
        raise JobError(
            f"sink.partition_by {other_parts} are neither 'ds' nor in source.keep_columns; "
            "partition by ds (the run date) or keep those source columns"
        )
    if config.sink.mode == "overwrite_partition" and config.sink.partition_by != ["ds"]:
        raise JobError("sink.mode overwrite_partition replaces one run date: use sink.partition_by: [ds]")

    task = InferencePlan(config.task, config.model, config.batching).build_task()
    _, model_name, revision = _validate_model(config, task)
    spark = spark or get_session(config.spark)
    run_id = config.run.resolved_run_id()
    ds = config.run.resolved_ds()
    scored_at = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    acc = spark.sparkContext.accumulator({}, CountsParam())

    inputs, scored = prepare_scores(
        spark, config, run_id=run_id, ds=ds, scored_at=scored_at,
        model_name=model_name, revision=revision, counts_acc=acc,
    )
    rows_in = inputs.count()
    print(f"[{config.job}] run {run_id}: scoring {rows_in:,} rows with {model_name} @ {revision} "
          f"-> {config.sink.path or config.sink.table} (ds {ds}, mode {config.sink.mode})", file=out, flush=True)

    progress = _Progress(spark, acc, config.job, config.run.progress_interval_s, rows_in, out)
    if config.run.progress:
        progress.start()
    started = time.perf_counter()
    try:
        result = write_sink(
            scored, config.sink, partition_values={"ds": ds},
            commit_metadata={"sbi.job": config.job, "sbi.run_id": run_id, "sbi.model_revision": revision},
        )
    finally:
        progress.stop.set()
    seconds = time.perf_counter() - started

    written = read_delta(spark, result.output).where(f"run_id = '{run_id}'")
    if "ds" in config.sink.partition_by:
        written = written.where(f"ds = DATE'{ds.isoformat()}'")
    rows_out = written.count()
    sample_cols = [c for c in (config.source.id_column, "label", "score", "completion", "finish_reason",
                               "n_tokens", "status")
                   if c in written.columns]
    samples = [r.asDict() for r in written.select(*sample_cols).limit(config.run.sample_rows).collect()]

    counts = acc.value
    summary = RunSummary(
        job=config.job, run_id=run_id, ds=ds.isoformat(), rows_in=rows_in, rows_out=rows_out,
        status={k: int(v) for k, v in counts.get("status", {}).items()}, seconds=seconds,
        tokens=int(counts.get("tokens", 0)), padded_tokens=int(counts.get("padded_tokens", 0)),
        batches=int(counts.get("batches", 0)),
        model_loads={w: int(counts.get("model_loads", {}).get(w, 0)) for w in counts.get("tasks_per_worker", {})},
        model_name=model_name, model_revision=revision, output=result.output,
        delta_version=result.version, writer=result.writer,
        batch_sizes={k: int(v) for k, v in counts.get("batch_sizes", {}).items()}, samples=samples,
    )
    print(summary.render(), file=out, flush=True)
    if config.run.summary_path:
        Path(config.run.summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(config.run.summary_path).write_text(summary.to_json())
    if not summary.complete:
        raise JobError(f"{rows_in} rows in but {rows_out} rows written; see the summary above")
    return summary

