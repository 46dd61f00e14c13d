"""Orchestrate one job: read -> infer on the executors -> write Delta -> report.

The only module that wires sources, the UDF glue, sinks and metrics together.
``run_job`` is what spark-submit entries, the CLI and notebooks call::

    from pipeline import load_config, run_job
    summary = run_job(load_config("conf/score_documents.yaml", overrides=["source.limit=100"]))
    assert summary.complete
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import time
from contextlib import contextmanager, nullcontext
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, TextIO

from pipeline.config import JobConfig, SinkConfig
from pipeline.errors import JobError
from pipeline.fingerprint import task_fingerprint
from pipeline.io.stores import using_settings
from pipeline.metrics import RunSummary, StageClock, batch_metrics
from pipeline.registry import ModelInfo, TaskKind, get_task_kind
from pipeline.rows import QUARANTINED_STATUSES

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
    from pipeline.io.sources import SourceError, read_delta, table_version

    if not config.sink.path:
        raise JobError("run.incremental needs sink.path (the output Delta table to compare against)")
    if not config.run.retry_quarantined:
        bad = _known_bad(spark, config, fingerprint)
        if bad is not None:
            on = inputs["id"].eqNullSafe(bad["_bad_id"]) & (inputs["content_hash"] == bad["_bad_hash"])
            if notes is not None:
                notes["known_bad"] = inputs.join(bad, on=on, how="left_semi")
            inputs = inputs.join(bad, on=on, how="left_anti")
    version = table_version(spark, config.sink.path)
    if notes is not None:  # the commit writes only keys no commit since this version wrote
        notes["read_version"] = version
    try:
        done = read_delta(spark, config.sink.path, version=version)
    except SourceError:
        return inputs  # no output yet: everything is new
    missing = [c for c in ("content_hash", "task_fingerprint") if c not in done.columns]
    if missing:
        raise JobError(f"output {config.sink.path} has no {' or '.join(missing)} column (written by an older "
                       "version); run once without run.incremental to rebuild it")
    done = (done.where(done["task_fingerprint"] == fingerprint)
            .select(done[config.source.id_column].alias("_done_id"), done["content_hash"].alias("_done_hash"))
            .hint("merge"))  # never broadcast: the output can hold millions of keys
    # null-safe on the id: a null-id row scored before is not new every night (it was, and grew the table)
    return inputs.join(done, on=inputs["id"].eqNullSafe(done["_done_id"])
                       & (inputs["content_hash"] == done["_done_hash"]), how="left_anti")


def _done_keys(spark: "SparkSession", path: str, id_column: str, ds: dt.date,
               version: int | None) -> "DataFrame | None":
    """The ids the table at ``path`` holds for run date ``ds`` (all its ids without a ``ds`` column) at
    ``version``; None when there is no table."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import SourceError, read_delta

    if version is None:
        return None
    try:
        table = read_delta(spark, path, version=version)
    except SourceError:
        return None
    if id_column not in table.columns:
        return None
    if "ds" in table.columns:
        table = table.where(F.col("ds") == F.lit(ds).cast("date"))
    return table.select(F.col(id_column).alias("_done_id"))


def _append_key_filter(spark: "SparkSession", inputs: "DataFrame", config: JobConfig, ds: dt.date,
                       notes: dict[str, Any]) -> tuple["DataFrame", int | None]:
    """``inputs`` without the rows whose key (id, ds) the output already holds; and the row count before
    (None when there was nothing to compare against). ``notes["read_version"]``: the output's version
    compared against, from which the commit checks what overlapping runs wrote since.

    An append is keyed on the row, not the run: a retry with another setting (a smaller batch after
    an out-of-memory error), or a rerun after part of the day went, writes only the keys missing.
    The id compares null-safely. (The quarantine is not consulted: a retry scores a failed row again,
    and its quarantine commit, keyed on the run, finds the earlier try's.)
    """
    from pipeline.io.sources import table_version

    notes["read_version"] = version = table_version(spark, config.sink.path) if config.sink.path else None
    done = _done_keys(spark, config.sink.path, config.source.id_column, ds, version) if config.sink.path else None
    if done is None:
        return inputs, None
    before = inputs.count()
    # a sort-merge join: a day of millions of ids must never be broadcast (10M ids ran the driver out of memory)
    done = done.hint("merge")
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
    staging_dir: str | None = None, try_id: str = "", max_tokens: int | None = None, rate_share: float = 1.0,
) -> "DataFrame":
    """The lazily scored rows with lineage, in ``tasks`` inference tasks of equal rows and mixed lengths.

    The rows are dealt out by :func:`pipeline.spark.planning.deal_rows` (deterministic across
    task retries), and the source's own split count never decides the parallelism. Each task's counts ride in
    ``METRICS_COLUMN`` (see ``pipeline.spark.run_metrics``); drop it before writing. With ``staging_dir``
    (a plan folder of :mod:`pipeline.io.staging`) each finished task stages its rows there, and a task
    a finished earlier try staged for the same input rows reuses them.
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
        id_column=config.source.id_column, progress_dir=progress_dir, staging_dir=staging_dir,
        calibration_rows=calibration_rows(inputs, config, task),
        try_id=try_id, max_tokens=max_tokens, rate_share=rate_share,
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


def calibration_rows(inputs: "DataFrame", config: JobConfig, task: Any) -> tuple[str, ...]:
    """Up to ``model.accuracy_gate.sample_rows`` texts of the job's own rows for the accuracy gate, or ().

    Drawn once on the driver, the same on every worker: the rows with the smallest
    ``xxhash64`` of their id and text (so the same rows for the same input, whatever the
    file layout), non-blank, each cut to ``batching.max_length`` x 16 characters like the
    tokenizer's clip. Only for tasks that calibrate (encoder kinds) at a precision the
    gate checks.
    """
    from pyspark.sql import functions as F

    gate = config.model.accuracy_gate
    if (not getattr(task, "calibrates_on_rows", False) or config.model.precision == "fp32" or not gate.enabled
            or gate.sample_rows == 0):
        return ()
    column = task.input_columns[0]
    text = F.substring(F.col(column).cast("string"), 1, config.batching.max_length * 16)
    rows = (inputs.select(text.alias("t"), F.xxhash64(F.col("id").cast("string"), text).alias("h"))
            .where(F.col("t").isNotNull() & (F.length(F.trim(F.col("t"))) > 0))
            .orderBy("h", "t").limit(gate.sample_rows).collect())
    return tuple(r["t"] for r in rows)


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
    source = _malformed_originals(inputs, input_columns)
    originals = (source
                 .select(F.col("id").alias("_q_id"), F.col("content_hash").alias("_q_hash"),
                         *_valid_text_and_bytes(source, input_columns))
                 .join(keys, on=(F.col("_q_id").eqNullSafe(F.col("_k_id"))) & (F.col("_q_hash") == F.col("_k_hash")),
                       how="left_semi")
                 .dropDuplicates(["_q_id", "_q_hash"]))
    joined = failed.join(originals, on=(failed[id_col].eqNullSafe(originals["_q_id"]))
                         & (failed["content_hash"] == originals["_q_hash"]), how="left")
    return joined.drop("_q_id", "_q_hash")


def _valid_text_and_bytes(inputs: "DataFrame", input_columns: tuple[str, ...]) -> list[Any]:
    """The quarantine's ``input_<c>`` columns: string inputs as valid UTF-8 (invalid bytes become U+FFFD, so any
    Delta reader opens the table), with the original bytes beside them in ``input_<c>_bytes`` (binary) for the
    rows whose bytes were not valid UTF-8 (null otherwise)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    out = []
    for c in input_columns:
        if isinstance(inputs.schema[c].dataType, StringType):
            out += [F.make_valid_utf8(F.col(c)).alias(f"input_{c}"),
                    F.when(~F.is_valid_utf8(F.col(c)), F.col(c).cast("binary")).alias(f"input_{c}_bytes")]
        else:
            out.append(F.col(c).alias(f"input_{c}"))
    return out


# --- malformed source lines (JSON lines Spark could not parse): flagged by the task, quarantined raw ---
def _malformed_input(inputs: "DataFrame") -> tuple[str, ...]:
    """The raw-line column for the task when the source has one (``pipeline.rows.MALFORMED_COLUMN``)."""
    from pipeline.rows import MALFORMED_COLUMN

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

    return _day_rows(spark, path, ds, version=version).where(F.col("run_id") == F.lit(run_id))


def _day_rows(spark: "SparkSession", path: str, ds: dt.date | None, *, version: int | None) -> "DataFrame":
    """The rows of run date ``ds`` (all rows when None) in the table at ``path``, as of ``version``."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import read_delta

    table = read_delta(spark, path, version=version)
    return table if ds is None else table.where(F.col("ds") == F.lit(ds).cast("date"))


def _check_quarantine_pair(run: _Run, plan: _Scoring, *, version: int, when: str) -> None:
    """An ``overwrite_partition`` run's output and quarantine replace the day in two commits: raise when
    another run replaced the day's quarantine after this run's (at ``version``), so the two tables never
    silently hold two runs' rows. A quarantine with no later commit passes without a scan."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import table_version

    spark, run_id, ds, path = run.spark, run.run_id, run.ds, plan.sink.resolved_quarantine_path()
    latest = table_version(spark, path)
    if latest == version:
        return
    now = _day_rows(spark, path, ds, version=latest)  # the version just compared, not resolved again
    others = sorted(r[0] for r in now.where(F.col("run_id") != F.lit(run_id)).select("run_id").distinct()
                    .limit(3).collect())
    if not others and now.count() == _day_rows(spark, path, ds, version=version).count():
        return
    by = f"run {', '.join(others)}" if others else "another job"
    raise JobError(f"conflict: {by} replaced the quarantine of ds {ds} in {path} after this run's quarantine "
                   f"commit; {when}")


def _commit_keys(config: JobConfig, sink: Any) -> tuple[str, ...]:
    """What makes an output row the same row, for the commit: (id, ds) for an append (the id alone when
    the table has no ds column, as the key filter before scoring compares); (id, content hash,
    task fingerprint) for an incremental run; none for the modes that replace (their commit is the
    replace). Rows whose output is not one row per input (recommendations) are not keyed."""
    if sink.mode != "append" or not sink.path:
        return ()
    if config.run.incremental:
        return (config.source.id_column, "content_hash", "task_fingerprint")
    return (config.source.id_column, "ds") if "ds" in sink.partition_by else (config.source.id_column,)


def _rows_of_keys(spark: "SparkSession", path: str, in_keys: "DataFrame", config: JobConfig,
                  ds: dt.date | None, *, version: int | None, fingerprint: str) -> "DataFrame":
    """The rows the table at ``path`` holds (at ``version``) for this run's input ids, whichever run wrote
    them: after an overlapping run committed some keys first, they stand for this run's."""
    from pyspark.sql import functions as F

    table = _day_rows(spark, path, ds, version=version)
    if config.run.incremental:
        table = table.where(F.col("task_fingerprint") == F.lit(fingerprint))
    ids = in_keys.select(F.col("_key_id").alias("_in_id")).distinct()  # key_counts' ids, as strings
    return table.join(ids, on=table[config.source.id_column].cast("string").eqNullSafe(ids["_in_id"]),
                      how="left_semi")


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
    from pipeline.recorder import RunRecorder

    run = config.run.model_copy(update={"run_id": config.run.resolved_run_id(), "ds": config.run.resolved_ds()})
    config = config.model_copy(update={"run": run})  # one run id and ds for the record and the run
    clock = StageClock()
    # the config's storage: section over the AWS_* environment for every table the job opens on S3
    with using_settings(config.storage.options()):
        recorder = RunRecorder.begin(config, run_id=run.run_id, ds=run.ds, out=out)
        clock.lap("runs table")
        try:
            from pipeline.spark.stopping import stop_on_sigterm

            with stop_on_sigterm(lambda: recorder.session) as stop:
                clock.between = stop.check
                try:
                    summary = _run_job(config, spark=spark, out=out, recorder=recorder, clock=clock, stop=stop)
                finally:
                    clock.between = lambda: None
        except BaseException as exc:
            recorder.end(error=exc)
            raise
        clock.skip()
        recorder.end(summary=summary)
        clock.lap("runs table")  # after the summary was printed: the returned summary has it, the printed one not
    summary.stage_seconds = dict(clock.seconds)
    return summary


@dataclass
class _Run:
    """What the stages of one run hand each other: the config, its kind and task, the checked model,
    the session, the run's identity and where its lines go."""

    config: JobConfig
    kind: TaskKind
    task: Any
    model: ModelInfo
    spark: "SparkSession"
    run_id: str
    ds: dt.date
    scored_at: dt.datetime
    faults: dict[str, Any]
    out: TextIO
    clock: StageClock
    # a small job (pipeline.small_jobs): its session was built light and its commits run in the driver
    small: bool = False
    app_id: str = ""
    # the logical run's key (its Delta transaction id before any per-try suffix) and its source version
    run_key: str = ""
    source_version: str | None = None
    # why the source is a new input though its version looks the same (a rebuilt table); None: nothing to say
    source_note: str | None = None
    # the plan folder of staged task output once planned (None: none), and whether the commits have begun
    staging_dir: str | None = None
    committing: bool = False
    # this try of the run (a fresh id per run_job call): the token ledger of run.max_tokens is per try
    try_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


@dataclass
class _Scoring:
    """The rows to score and the lazily scored rows, planned before any inference runs."""

    inputs: "DataFrame"
    scored: "DataFrame"
    sink: SinkConfig
    rows_in: int
    tasks: int
    known_bad: int
    # the output version the keys were compared at: the commit writes only keys no commit since wrote
    read_version: int | None = None
    # where the workers on this host report rows done inside a task (progress); None: not reported
    rows_dir: str | None = None
    # the plan folder of staged task output (None: no staging), the tasks staged there before this try
    # started, and why staged output of an earlier try is not reused (None: nothing to say)
    staging_dir: str | None = None
    staged_before: int = 0
    resume_note: str | None = None


@dataclass
class _Committed:
    """What the commits left: the output's write result, the quarantine's version and run, the counts."""

    result: Any
    counts: dict[str, Any]
    seconds: float
    quarantine_version: int | None
    quarantine_run: str


@dataclass
class _ReadBack:
    """The committed rows read back at their versions, and the counts they add up to."""

    written: "DataFrame"
    rows_out: int
    rows_quarantined: int
    incomplete: str | None
    partition_ds: dt.date | None


def _run_job(config: JobConfig, *, spark: "SparkSession | None", out: TextIO, recorder: Any,
             clock: StageClock, stop: Any = False) -> RunSummary:
    """The stages of one run, in order: prepare, idempotency, plan, score and commit, read back, summary.

    ``stop``: true once a SIGTERM asked the run to stop (``pipeline.spark.stopping.StopRequest``)."""
    from pipeline.errors import RunStopped

    run = _prepare(config, spark=spark, out=out, recorder=recorder, clock=clock)
    try:
        done = _check_idempotency(run)
        if done is not None:
            return done
        plan = _plan_scoring(run)
        run.staging_dir = plan.staging_dir
        committed = _score_and_commit(run, plan)
    except Exception as exc:
        if isinstance(exc, RunStopped) or stop:  # a cancelled Spark job surfaces as its error
            raise RunStopped(_stopped_message(run)) from None
        raise
    if isinstance(committed, RunSummary):
        return committed
    commit, read = committed
    summary = _summarize(run, plan, committed=commit, read=read)
    return _finish(run, summary, recorder=recorder)


def _stopped_message(run: _Run) -> str:
    """What a run stopped by SIGTERM says: whether anything may have committed, what is staged, how to resume."""
    from pipeline.io.staging import staged_tasks

    if run.committing:
        return ("stopped by SIGTERM during its commit: the commit may have landed. Rerun the same command: a commit "
                "that landed is found and nothing is written twice")
    staged = len(staged_tasks(run.staging_dir))
    where = (f"{staged} finished inference task(s) are staged in {run.staging_dir}, and a rerun of the same command "
             "reuses them" if run.staging_dir else "nothing is staged (staging off), so a rerun scores every row again")
    return f"stopped by SIGTERM before its commit: nothing was committed; {where}. Resume: rerun the same command"


def _check_partitioning(config: JobConfig) -> None:
    other_parts = [c for c in config.sink.partition_by if c != "ds" and c not in config.source.keep_columns]
    if other_parts:
        raise JobError(
            f"sink.partition_by {other_parts} are neither 'ds' nor in source.keep_columns; "
            "partition by ds (the run date) or keep those source columns"
        )
    if config.sink.mode == "overwrite_partition" and config.sink.partition_by != ["ds"]:
        raise JobError("sink.mode overwrite_partition replaces one run date: use sink.partition_by: [ds]")


def _prepare(config: JobConfig, *, spark: "SparkSession | None", out: TextIO, recorder: Any,
             clock: StageClock) -> _Run:
    """Checks that fail in seconds before any Spark work: partitioning, the model, addresses, locations."""
    from pipeline import faults as fault_hooks
    from pipeline.io.preflight import check_locations
    from pipeline.small_jobs import small_job
    from pipeline.spark.reach import check_job_addresses
    from pipeline.spark.session import get_session

    _check_partitioning(config)
    kind, task = _kind_and_task(config)
    if config.model.path.startswith("models:/"):  # an alias is pinned to one version for every worker
        from pipeline.models.mlflow_registry import pin_registry_model

        config = pin_registry_model(config)
    model = kind.job.model_info(config, task)  # before any Spark work: a bad model fails in seconds
    recorder.note(model_name=model.name, model_revision=model.revision)
    clock.lap("model check")
    if spark is None:  # a metastore or object store endpoint nobody answers fails in seconds, not minutes
        check_job_addresses(config, timeout_s=config.spark.connect_timeout_s)
    small = small_job(config, spark=spark)
    if small:
        print(f"[{config.job}] small job ({small.why}): a light local session, committed from the driver "
              "(spark.small_job_rows: 0 turns this off)", file=out, flush=True)
    spark = spark or get_session(config.spark, object_stores=_uses_object_store(config),
                                 storage=config.storage.options(), small=small.small)
    if small:  # the model loads in a worker while the driver plans (pipeline.spark.warmup)
        from pipeline.spark.warmup import start_warm_up, warm_up_plan

        if (warm := warm_up_plan(config, model_path=model.path, task_class=kind.task)) is not None:
            start_warm_up(spark, warm)
    recorder.note(spark=spark)
    clock.lap("session")
    check_locations(spark, source=config.source, sink=config.sink)  # a remote path the session cannot reach fails here, before any work
    _check_staging_root(config)
    clock.lap("pre-flight")
    return _Run(config=config, kind=kind, task=task, model=model, spark=spark, small=small.small,
                run_id=config.run.resolved_run_id(), ds=config.run.resolved_ds(),
                scored_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
                faults=fault_hooks.from_env(config.run.faults), out=out, clock=clock)


def _check_idempotency(run: _Run) -> RunSummary | None:
    """The summary of a retry whose commit already landed (its rows still in the output), else None.

    Sets the run's Delta transaction id (``run.app_id``) either way.
    """
    from pipeline.io.sinks import committed_run_via, resolve_writer, source_snapshot

    config, spark, run_id, ds, out = run.config, run.spark, run.run_id, run.ds, run.out
    # one Delta transaction id per logical run: a fast path for a retry whose commit landed, taken only while
    # that run's rows are still in the output (appends are keyed on the rows themselves below)
    run.source_version = source_snapshot(config.source)
    run.source_note = _rebuilt_source_note(config, run.source_version)
    if run.source_note:
        print(f"[{config.job}] run {run_id}: {run.source_note}", file=out, flush=True)
    from pipeline.identity import run_key, run_settings

    app_id = run_key(config.job, run_settings(config), model_revision=run.model.revision,
                     source_snapshot=run.source_version)
    run.run_key = app_id
    if config.run.incremental or config.sink.mode == "append":
        done = committed_run_via(spark, config.sink.path, app_id) if config.sink.path else None
        if done and _run_rows_remain(spark, config, by=done[1], ds=ds):
            _remove_staging(run)  # a try killed after its commit left it; nothing will read it again
            return _already_committed(config, run_id=run_id, ds=ds, model=run.model, version=done[0], by=done[1],
                                      out=out, writer=resolve_writer(spark, config.sink))
        if done:
            # the transaction id outlived the rows (the day deleted, restored or overwritten since): the rows
            # missing by key are scored, under this try's own transaction id, or the commit would be skipped
            print(f"[{config.job}] run {run_id}: run {done[1]} committed at version {done[0]} but its rows are no "
                  f"longer in {config.sink.path}; scoring the rows missing by key", file=out, flush=True)
            app_id = f"{app_id}-{run_id}"
    run.app_id = app_id
    run.clock.lap("idempotency")
    return None


def _rebuilt_source_note(config: JobConfig, snapshot: str | None) -> str | None:
    """A line when the source table was dropped and rebuilt since this job's last finished run (its Delta
    table id changed, whatever its version says): its rows are a new input."""
    from pipeline.io.sinks import source_rebuilt
    from pipeline.runs import read_runs

    runs_path = config.resolved_runs_path()
    if not snapshot or not snapshot.startswith("delta:") or not runs_path:
        return None
    try:
        rows = [r for r in read_runs(runs_path, job=config.job) if r["outcome"] == "ok" and r["summary_json"]]
    except Exception:  # noqa: BLE001 - no runs table yet (a first run): nothing to compare with
        return None
    for row in reversed(rows):
        before = json.loads(row["summary_json"]).get("source_snapshot")
        if before:
            change = source_rebuilt(before, snapshot)
            return (f"the source {config.source.path} was rebuilt since run {row['run_id']} ({change}): a new "
                    "input, scored as such (keys the output holds are not scored again)") if change else None
    return None


def _plan_scoring(run: _Run) -> _Scoring:
    """The rows to score (new ones only for incremental runs and appends), their inference tasks, the
    lazily scored rows and the sink they go to."""
    config, spark, run_id, ds, out = run.config, run.spark, run.run_id, run.ds, run.out
    notes: dict[str, Any] = {}
    inputs = prepare_inputs(spark, config, revision=run.model.revision, task=run.task, notes=notes)
    known_bad = notes["known_bad"].count() if "known_bad" in notes else 0
    rows_before = None
    if config.sink.mode == "append" and not config.run.incremental:
        inputs, rows_before = _append_key_filter(spark, inputs, config, ds, notes)
    rows_in = inputs.count()
    if rows_before is not None and rows_before > rows_in:
        print(f"[{config.job}] run {run_id}: {rows_before - rows_in:,} of {rows_before:,} row(s) already in "
              f"{config.sink.path} for ds {ds} (key: id, ds): not scored again", file=out, flush=True)
    _check_shrink(run, rows_in + known_bad)
    tasks = plan_inference_tasks(spark, config, rows_in, run.task)
    from pipeline.spark.progress import rows_folder

    rows_dir = rows_folder(spark) if config.run.progress and rows_in else None  # workers' rows done, same host
    staging_dir, staged_before, resume_note = _open_staging(run, rows=rows_in, tasks=tasks)
    requests = _request_settings(run, staging_dir=staging_dir, tasks=tasks, rows=rows_in)
    scored = score_inputs(inputs, config, tasks=tasks, run_id=run_id, ds=ds, scored_at=run.scored_at,
                          model=run.model, faults=run.faults, task=run.task, progress_dir=rows_dir,
                          staging_dir=staging_dir, **requests)
    sink = config.sink
    if config.run.incremental and sink.mode != "append":
        # new rows join the run's partition; replacing it would drop the rows scored earlier today
        sink = sink.model_copy(update={"mode": "append"})
    _check_output_schema(run, scored, sink)
    mode_note = " incremental" if config.run.incremental else ""
    print(f"[{config.job}] run {run_id}: scoring {rows_in:,}{mode_note} rows in {tasks} tasks with {run.model.name} "
          f"@ {run.model.revision} -> {sink.path or sink.table} (ds {ds}, mode {sink.mode})", file=out, flush=True)
    if staged_before:
        print(f"[{config.job}] run {run_id}: resuming: {staged_before} of {tasks} task(s) finished by an earlier try "
              f"are staged in {staging_dir}; those whose input rows are the same are reused", file=out, flush=True)
    return _Scoring(inputs=inputs, scored=scored, sink=sink, rows_in=rows_in, tasks=tasks, known_bad=known_bad,
                    read_version=notes.get("read_version"), rows_dir=rows_dir, staging_dir=staging_dir,
                    staged_before=staged_before, resume_note=resume_note)


def _check_shrink(run: _Run, rows: int) -> None:
    """Refuse, before any work, to replace a day (or a table) with far fewer rows than it holds now: an empty or
    shrunk source is almost always an upstream failure (``run.min_rows_fraction``; ``--allow-empty`` to go on)."""
    from pipeline.io.delta_tables import rows_held

    config = run.config
    sink = config.sink
    if config.run.allow_empty or config.run.incremental or sink.mode == "append" or not config.run.min_rows_fraction:
        return
    where = {"ds": run.ds} if sink.mode == "overwrite_partition" else None
    held = rows_held(run.spark, path=sink.path, table=sink.table, partition=where)
    per_input = run.kind.job.output_rows_per_input(config)  # e.g. a user's top k recommendations
    need = config.run.min_rows_fraction * held / per_input
    if held and rows < need:
        what = f"ds {run.ds}" if where else "the table"
        holds = f"{held:,}" if per_input == 1 else f"{held:,} ({held / per_input:,.0f} input rows' worth)"
        raise JobError(
            f"refusing to replace {what} of {sink.path or sink.table}: the source gives {rows:,} row(s) where it holds "
            f"{holds} now (run.min_rows_fraction {config.run.min_rows_fraction:g} needs at least {need:,.0f}); an empty "
            "or shrunk source is usually an upstream failure, so nothing was scored or written. Check the source, "
            "or rerun with --allow-empty (run.allow_empty: true) to replace it anyway")


def _check_output_schema(run: _Run, scored: "DataFrame", sink: SinkConfig) -> None:
    """Before any row is scored: the output table can take this job's columns (a column someone else added
    stays and gets nulls; one of ours that the table holds with another type is refused, named)."""
    from pipeline.io.delta_schema import check_output_schema, delta_schema_of, existing_schema
    from pipeline.spark.udf import METRICS_COLUMN

    existing = existing_schema(run.spark, path=sink.path, table=sink.table)
    if existing is None:
        return
    ours = delta_schema_of(run.kind.job.shape_output(scored.drop(METRICS_COLUMN), run.config).schema)
    check_output_schema(existing, ours, target=sink.path or sink.table)


def _request_settings(run: _Run, *, staging_dir: str | None, tasks: int, rows: int) -> dict[str, Any]:
    """For a task that sends rows to a server: this try's id, the token budget and each task's share of the
    rates; refused without a staging folder (its request journal lives there). Empty for other tasks."""
    config = run.config
    if not getattr(run.task, "journals_requests", False):
        if config.run.max_tokens is not None:
            raise JobError(f"run.max_tokens is set but task.kind {config.task.kind} does not send rows to a server; "
                           "it applies to task.backend: endpoint")
        return {}
    if staging_dir is None and rows:
        raise JobError(
            "the endpoint backend journals every answer in the run's staging folder, so that no row is paid for "
            f"twice by a retry or a rerun, and there is none: {_no_staging_reason(config)}")
    from pipeline.spark.planning import count_cores

    at_once = max(1, min(tasks, count_cores(run.spark)))
    return {"try_id": run.try_id, "max_tokens": config.run.max_tokens, "rate_share": 1.0 / at_once}


def _no_staging_reason(config: JobConfig) -> str:
    if not config.run.staging:
        return "run.staging is off; turn it on"
    return (f"{config.sink.path or config.sink.table} is not a local or mounted path; set run.staging_path to a "
            "folder every executor reaches")


def _staging_root(config: JobConfig) -> str | None:
    """Where this job's staged task output lives (None: staging off, or no local place for it)."""
    from pipeline.io.staging import staging_root

    return staging_root(config.sink.path, config.run.staging_path) if config.run.staging else None


def _check_staging_root(config: JobConfig) -> None:
    """Refuse, before any work, a staging root that holds a Delta table or files no run of ours wrote."""
    from pipeline.io.staging import StagingLayoutError, check_root

    check = check_root(_staging_root(config))
    if check is not None and (why := check.refusal()):
        raise StagingLayoutError(why)


def _open_staging(run: _Run, *, rows: int, tasks: int) -> tuple[str | None, int, str | None]:
    """``(plan folder, tasks staged there already, why an earlier try's staged output is not reused)``.

    Owned plans of other runs untouched for ``run.staging_max_age_hours`` are removed first; entries no
    run wrote are left alone and named in one line. A root that cannot be written (a full or read-only
    disk) turns staging off for this run with one line: staging never fails a run.
    """
    from pipeline.io.staging import StagePlan, explain_unused, open_plan, staged_tasks, sweep_staging

    config = run.config
    root = _staging_root(config)
    if root is None or not rows:
        note = None
        if config.run.staging and rows and config.sink.path:
            note = (f"no staging: {config.sink.path} is not a local or mounted path; set run.staging_path to a "
                    "folder every executor reaches to resume a killed run")
        return None, 0, note
    from pipeline.faults import RESULT_FAULTS

    drills = {k: run.faults[k] for k in RESULT_FAULTS if k in run.faults}
    plan = StagePlan(run_key=run.run_key, source_version=run.source_version,
                     task_fingerprint=task_fingerprint(config, revision=run.model.revision), rows=rows, tasks=tasks,
                     job=config.job, ds=run.ds.isoformat(), drills=json.dumps(drills, sort_keys=True) if drills else "")
    try:
        swept = sweep_staging(root, max_age_s=config.run.staging_max_age_hours * 3600, keep=[plan.key()])
        folder = open_plan(root, plan)
    except OSError as exc:
        print(f"[{config.job}] warning: staging off for this run: {root} cannot be written "
              f"({type(exc).__name__}: {exc}); the run goes on, but a killed run will score every row again",
              file=run.out, flush=True)
        return None, 0, None
    if warning := swept.warning(root):
        print(f"[{config.job}] warning: {warning}", file=run.out, flush=True)
    return folder, len(staged_tasks(folder)), explain_unused(root, plan)


def _remove_staging(run: _Run) -> None:
    """Remove every staged plan of this run's key (its commit landed); what is not ours stays, named."""
    from pipeline.io.staging import remove_run

    root = _staging_root(run.config)
    if root is not None and run.run_key:
        try:
            left = remove_run(root, run.run_key)
        except OSError as exc:  # the commit landed; an unremovable plan is swept by a later run
            print(f"[{run.config.job}] warning: staged output in {root} not removed ({exc})", file=run.out, flush=True)
            return
        if left:
            print(f"[{run.config.job}] warning: left alone in staging folder {root}: {', '.join(left[:5])} "
                  "(not written by this project)", file=run.out, flush=True)


def _score_and_commit(run: _Run, plan: _Scoring) -> "RunSummary | tuple[_Committed, _ReadBack]":
    """Inference and the check before any commit, the quarantine commit, the output commit, and the
    read-back of both at the versions committed; a retry that finds its commit landed gets its summary."""
    from pyspark import StorageLevel

    from pipeline import faults as fault_hooks
    from pipeline.spark.checks import identity_check, key_counts
    from pipeline.spark.progress import JobProgress, stage_source
    from pipeline.spark.run_metrics import observe_counts
    from pipeline.spark.udf import METRICS_COLUMN

    config, clock = run.config, run.clock
    # Scored rows feed the checks and two writes (quarantine, output): keep them so inference runs once.
    scored = plan.scored.persist(StorageLevel.MEMORY_AND_DISK)
    # the input keys feed the check before the commits and the one after them
    in_keys = key_counts(plan.inputs, id_column="id").persist(StorageLevel.MEMORY_AND_DISK)
    # the tasks' counts are observed on the first action over the scored rows (the check, which runs
    # inference and fills the cache); their column is never written
    observed_scored, observed = observe_counts(scored, METRICS_COLUMN)
    progress = (JobProgress(stage_source(run.spark, rows_dir=plan.rows_dir), job=config.job,
                            planned_tasks=plan.tasks, rows_total=plan.rows_in, interval=config.run.progress_interval_s,
                            out=run.out, reused_tasks=plan.staged_before)
                if config.run.progress and plan.rows_in else nullcontext())
    clock.lap("planning")
    started = time.perf_counter()
    metadata = {"sbi.job": config.job, "sbi.run_id": run.run_id, "sbi.model_revision": run.model.revision}
    try:
        try:
            with progress, _budget_stop(run, plan):
                scored_check = identity_check(
                    in_keys, key_counts(observed_scored, id_column=config.source.id_column, status_column="status"))
            counts = observed.counts() if plan.rows_in else {}
            try:
                _check_before_commit(scored_check, scored, config)
            except JobError:
                _remove_staging(run)  # rows judged bad: a rerun scores them again, never replays them
                raise
            clock.lap("inference and check")
            run.committing = True
            fault_hooks.before_commits(run.faults)
            quarantine_version, quarantine_run = _commit_quarantine(
                run, plan, scored, errors=scored_check.errors, metadata=metadata)
            if pairs := (plan.sink.mode == "overwrite_partition" and quarantine_version is not None):
                _check_quarantine_pair(run, plan, version=quarantine_version,
                                       when="this run committed no output, so the pair agrees once that run's "
                                            "output commit lands")
            result = _commit_output(
                config, kind=run.kind, scored=scored, sink=plan.sink, ds=run.ds, metadata=metadata, faults=run.faults,
                app_id=run.app_id, clock=clock, run_id=run.run_id, model=run.model, out=run.out,
                read_version=plan.read_version, in_driver=run.small)
            if pairs and not isinstance(result, RunSummary):
                _check_quarantine_pair(run, plan, version=quarantine_version,
                                       when=f"this run's output (version {result.version}) and that quarantine "
                                            f"now hold different runs' rows: rerun ds {run.ds}")
            _remove_staging(run)  # the commit landed: no try of this run reads the staged output again
            if isinstance(result, RunSummary):
                return result
        finally:
            scored.unpersist()
        committed = _Committed(result=result, counts=counts, seconds=time.perf_counter() - started,
                               quarantine_version=quarantine_version, quarantine_run=quarantine_run)
        return committed, _read_back(run, plan, committed, in_keys)
    finally:
        in_keys.unpersist()
        if plan.rows_dir:  # the workers' rows-done files are read while the job runs, and only then
            shutil.rmtree(plan.rows_dir, ignore_errors=True)


@contextmanager
def _budget_stop(run: _Run, plan: _Scoring) -> Iterator[None]:
    """A Spark job failed by ``run.max_tokens`` (a task's :class:`TokenBudgetReached`) ends the run as that
    error, with what this try spent and what is kept for the rerun; any other failure passes unchanged."""
    from pipeline.errors import TokenBudgetReached
    from pipeline.error_text import python_error_line

    try:
        yield
    except TokenBudgetReached:
        raise
    except Exception as exc:  # noqa: BLE001 - only the budget's stop is rewritten
        line = python_error_line(str(exc)) or ""
        if not line.startswith("TokenBudgetReached"):
            raise
        from pipeline.io.request_log import try_usage
        from pipeline.io.staging import staged_tasks

        spent = try_usage(plan.staging_dir, run.try_id)
        staged = len(staged_tasks(plan.staging_dir))
        raise TokenBudgetReached(
            f"run.max_tokens {run.config.run.max_tokens:,} reached: this try spent {spent:,} tokens on the server; "
            f"nothing was committed. Kept for the rerun in {plan.staging_dir}: {staged} of {plan.tasks} task(s) "
            "staged and every answer of the others in the request journal, so the same command again (with a "
            "budget for the rest) pays only for the rows not answered yet", tokens=spent) from None


def _commit_quarantine(run: _Run, plan: _Scoring, scored: "DataFrame", *, errors: int,
                       metadata: dict[str, str]) -> tuple[int | None, str]:
    """The quarantine commit, before the output's: ``(version, run id of its rows)``; version None
    when there is nothing to commit and no quarantine table yet."""
    from pipeline import faults as fault_hooks
    from pipeline.io.sinks import committed_run_via, write_sink
    from pipeline.io.sources import is_delta_table

    config, spark, sink, ds = run.config, run.spark, plan.sink, run.ds
    quarantine_path = sink.resolved_quarantine_path()
    quarantine_version = None
    quarantine_run = run.run_id
    # quarantine first: a crash before the output commit leaves a partition a rerun replaces
    if errors or is_delta_table(spark, quarantine_path):
        # written even when empty once it exists, so a rerun replaces that day's failures too
        q = write_sink(_quarantine_rows(scored, plan.inputs, config, tuple(run.task.input_columns)), sink,
                       partition_values={"ds": ds}, commit_metadata=metadata, path=quarantine_path,
                       txn_app_id=run.app_id, in_driver=run.small)
        _say_swept(config.job, q, run.out)
        quarantine_version = q.version
        if q.already_committed:  # an earlier try of this run committed them: read back its rows
            earlier = committed_run_via(spark, quarantine_path, run.app_id)
            quarantine_run = (earlier and earlier[1]) or run.run_id
        fault_hooks.after_quarantine_commit(run.faults, version=q.version, run_id=run.run_id)
        run.clock.lap("quarantine commit")
    return quarantine_version, quarantine_run


def _commit_output(config: JobConfig, *, kind: TaskKind, scored: "DataFrame", sink: SinkConfig, ds: dt.date,
                   metadata: dict[str, str], faults: dict[str, Any], app_id: str, clock: StageClock, run_id: str,
                   model: ModelInfo, out: TextIO, read_version: int | None, in_driver: bool = False) -> Any:
    """The output commit: the write result, or the summary of a concurrent try of this run that committed first.
    Appends are keyed on their rows (:func:`_commit_keys`) from ``read_version`` on; ``in_driver``: a small
    job's commit, written from this process."""
    from pipeline import faults as fault_hooks
    from pyspark.sql import functions as F

    from pipeline.io.sinks import write_sink
    from pipeline.spark.udf import METRICS_COLUMN

    to_write = scored.drop(METRICS_COLUMN).where(~F.col("status").isin(*QUARANTINED_STATUSES))
    if (lost := fault_hooks.lost_at_output_commit(faults)) is not None:  # a drill: the commit loses a row
        to_write = to_write.where(~F.col(config.source.id_column).eqNullSafe(F.lit(lost)))
    result = write_sink(
        kind.job.shape_output(to_write, config), sink,
        partition_values={"ds": ds}, commit_metadata=metadata, faults=faults, txn_app_id=app_id,
        key_columns=_commit_keys(config, sink), read_version=read_version, in_driver=in_driver,
    )
    clock.lap("commit")
    if result.already_committed:  # a concurrent try of this very run committed first
        return _already_committed(config, run_id=run_id, ds=ds, model=model, version=result.version,
                                  by=None, out=out, writer=result.writer)
    _say_swept(config.job, result, out)
    return result


def _say_swept(job: str, result: Any, out: TextIO) -> None:
    """One line for the leftovers a write's sweep removed, one for the files it kept because nothing
    proves them ours."""
    if result.swept.get("files"):
        print(f"[{job}] swept {result.swept['files']} leftover file(s) "
              f"({result.swept['bytes'] / 1e6:.1f} MB) of crashed writes from {result.output}", file=out, flush=True)
    if left := result.swept.get("left_alone"):
        print(f"[{job}] warning: left alone in {result.output}: {result.swept.get('left_alone_count')} "
              f"file(s) named like this project's but no marker of ours names their write "
              f"({', '.join(left[:5])}); nothing proves them ours, so the sweep keeps them", file=out, flush=True)


def _read_back(run: _Run, plan: _Scoring, committed: _Committed, in_keys: "DataFrame") -> _ReadBack:
    """Both commits read back at their versions and checked by key against the input."""
    config, spark, ds, result = run.config, run.spark, run.ds, committed.result
    partition_ds = ds if "ds" in plan.sink.partition_by else None
    written = _rows_written(spark, result.output, run.run_id, partition_ds, version=result.version)
    if result.overlapped:  # keys an overlapping run wrote first: their rows stand for this run's
        print(f"[{config.job}] run {run.run_id}: {result.overlapped:,} row(s) were committed meanwhile by an "
              f"overlapping run (key: {', '.join(_commit_keys(config, plan.sink))}); written once, by that run",
              file=run.out, flush=True)
        written = _rows_of_keys(spark, result.output, in_keys, config, partition_ds, version=result.version,
                                fingerprint=task_fingerprint(config, revision=run.model.revision))
    quarantined = None
    if committed.quarantine_version is not None:
        quarantined = _rows_written(spark, plan.sink.resolved_quarantine_path(), committed.quarantine_run,
                                    partition_ds, version=committed.quarantine_version)
    written_check = _check_written(in_keys, written, quarantined, config.source.id_column)
    if written_check is not None:
        rows_out, rows_quarantined = written_check.rows_out - written_check.errors, written_check.errors
    else:  # output rows are not one per input row (e.g. recommendations): counted, and checked by the kind
        rows_out = written.count()
        rows_quarantined = quarantined.count() if quarantined is not None else 0
    incomplete = None
    if written_check is not None and not written_check.ok:
        incomplete = "read back after the commit: " + written_check.describe(what="written")
    return _ReadBack(written=written, rows_out=rows_out, rows_quarantined=rows_quarantined, incomplete=incomplete,
                     partition_ds=partition_ds)


def _summary_details(run: _Run, plan: _Scoring, counts: dict[str, Any]) -> dict[str, str]:
    """The summary's extra lines: the kind's own, known-bad rows skipped, malformed input, torch threads."""
    details: dict[str, str] = {}
    if plan.known_bad:
        details["known-bad rows skipped"] = (f"{plan.known_bad:,} (quarantined earlier with the same content and "
                                             "task fingerprint; --retry-quarantined scores them again)")
    malformed = int(counts.get("status", {}).get("malformed", 0))
    if malformed:
        details["malformed input"] = (f"{malformed:,} source line(s) could not be parsed; quarantined with their "
                                      f"raw text in input_{run.task.input_columns[0]}")
    if counts.get("torch_threads"):  # {threads: tasks}: spark.task.cpus, or model.torch_threads
        details["torch threads"] = ", ".join(f"{t} ({n} tasks)" for t, n in sorted(counts["torch_threads"].items()))
    return details


def _summarize(run: _Run, plan: _Scoring, *, committed: _Committed, read: _ReadBack) -> RunSummary:
    """The run's summary: counts, samples, whether every row is accounted for, and what replaced the output."""
    from pipeline.io.delta_tables import replaced_by

    config, spark, kind, ds, run_id = run.config, run.spark, run.kind, run.ds, run.run_id
    result, counts = committed.result, committed.counts
    sample_cols = [c for c in (config.source.id_column, "label", "score", "completion", "finish_reason",
                               "n_tokens", "status")
                   if c in read.written.columns]
    run.clock.lap("read-back")
    samples = [r.asDict() for r in read.written.select(*sample_cols).limit(config.run.sample_rows).collect()]
    incomplete = read.incomplete or kind.job.check_complete(
        rows_in=plan.rows_in, rows_out=read.rows_out, rows_quarantined=read.rows_quarantined, counts=counts)
    replaced = None
    if not incomplete and result.version is not None and read.rows_out:
        replaced = replaced_by(spark, result.output, run_id=run_id, version=result.version,
                               partition={"ds": ds} if read.partition_ds is not None else {})
    details = kind.job.after_commit(spark, config, output=result.output, run_id=run_id, ds=ds) if not incomplete else {}
    details = {**kind.job.summary_lines(spark, config, counts, run.model), **details,
               **_summary_details(run, plan, counts)}
    quarantine_path = plan.sink.resolved_quarantine_path()
    return RunSummary(
        job=config.job, run_id=run_id, ds=ds.isoformat(), rows_in=plan.rows_in, rows_out=read.rows_out,
        rows_quarantined=read.rows_quarantined,
        quarantine=quarantine_path if committed.quarantine_version is not None else None,
        status={k: int(v) for k, v in counts.get("status", {}).items()}, seconds=committed.seconds,
        tokens=int(counts.get("tokens", 0)), padded_tokens=int(counts.get("padded_tokens", 0)),
        batches=int(counts.get("batches", 0)),
        model_loads={w: int(counts.get("model_loads", {}).get(w, 0)) for w in counts.get("tasks_per_worker", {})},
        model_name=run.model.name, model_revision=run.model.revision, output=result.output,
        delta_version=result.version, writer=result.writer,
        batch_sizes={k: int(v) for k, v in counts.get("batch_sizes", {}).items()}, samples=samples,
        incremental=config.run.incremental,
        retries={k: int(counts.get(k, 0)) for k in ("oom_splits", "adaptive_splits", "poison_bisections",
                                                     "task_retries") if counts.get(k)},
        precision_used=counts.get("precision_used", {}), precision_fallbacks=counts.get("precision_fallbacks", {}),
        precision_checks=counts.get("precision_checks", {}), precision_auto=counts.get("precision_auto", {}),
        generation_backend=counts.get("generation_backend", {}),
        load_seconds=float(counts.get("load_seconds", 0.0)), infer_seconds=float(counts.get("infer_seconds", 0.0)),
        tasks=plan.tasks, rows_per_worker={w: int(n) for w, n in counts.get("rows_per_worker", {}).items()},
        incomplete=incomplete, details=details, replaced=replaced,
        batch_metrics=batch_metrics(counts), resumed_tasks=int(counts.get("resumed_tasks", 0)),
        rows_reused=int(counts.get("rows_reused", 0)), rows_scored=plan.rows_in - int(counts.get("rows_reused", 0)),
        resume_note=plan.resume_note, source_snapshot=run.source_version, source_note=run.source_note,
        prompt_tokens=int(counts.get("prompt_tokens", 0)), completion_tokens=int(counts.get("completion_tokens", 0)),
        endpoint={k: (round(v, 3) if isinstance(v, float) else v) for k, v in counts.get("endpoint", {}).items()},
    )


def _finish(run: _Run, summary: RunSummary, *, recorder: Any) -> RunSummary:
    """Print (and write) the summary; a run whose rows do not add up fails here, with its counts recorded."""
    config = run.config
    run.clock.lap("summary")
    summary.stage_seconds = dict(run.clock.seconds)
    recorder.summary = summary  # a run failing its row check below is recorded with its counts
    print(summary.render(), file=run.out, flush=True)
    if config.run.summary_path:
        Path(config.run.summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(config.run.summary_path).write_text(summary.to_json())
    if not summary.complete:
        raise JobError(f"{summary.incomplete}; see the summary above")
    return summary
