"""The rows a run scores: read, hashed, checked, and left out where the output already holds them.

Every row gets a ``content_hash`` of its task inputs. An incremental run (``run.incremental``) keeps only
rows whose ``(id, content hash, task fingerprint)`` the output lacks, and skips the rows the quarantine
holds under the same key (known bad) unless ``run.retry_quarantined``; an append keeps only rows whose
key ``(id, ds)`` the output lacks. Both comparisons are anti-joins in Spark, null-safe on the id, and
never broadcast (the output can hold millions of keys). What they found travels as a :class:`NewInputs`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.config.fingerprint import task_fingerprint
from pipeline.core.rows import MALFORMED_COLUMN
from pipeline.stages.outcomes import kind_and_task

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pipeline.core.locations import Location

__all__ = ["NewInputs", "append_key_filter", "content_hash", "hashed_inputs", "malformed_input",
           "malformed_originals", "prepare_inputs", "read_new_inputs"]


@dataclass(frozen=True)
class NewInputs:
    """The rows to score, and what choosing them found.

    ``known_bad``: the rows left out because the quarantine holds them (lazy; counted by the planner);
    ``read_version``: the output's version the keys were compared at, from which the commit checks what
    overlapping runs wrote since (None: no table, or nothing compared); ``rows_before``: an append's rows
    before its key filter (None when there was nothing to compare against).
    """

    rows: "DataFrame"
    known_bad: "DataFrame | None" = None
    read_version: int | None = None
    rows_before: int | None = None


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
        quarantine = read_delta(spark, config.sink.quarantine_location)
    except SourceError:
        return None
    id_col = config.source.id_column
    if any(c not in quarantine.columns for c in (id_col, "content_hash", "task_fingerprint")):
        return None
    return (quarantine.where(quarantine["task_fingerprint"] == fingerprint)
            .select(quarantine[id_col].alias("_bad_id"), quarantine["content_hash"].alias("_bad_hash")).distinct())


def _sink_version(spark: "SparkSession", path: "str | Location | None", known: int | None) -> int | None:
    """The output's version to compare keys at: ``known`` (the plan's read of its log; -1: no table), else asked."""
    from pipeline.io.sources import table_version

    if known is not None:
        return None if known < 0 else known
    return table_version(spark, path)


def _incremental_filter(spark: "SparkSession", inputs: "DataFrame", config: JobConfig,
                        fingerprint: str, sink_version: int | None = None) -> NewInputs:
    """Rows whose (id, content hash, task fingerprint) the output lacks (an anti-join in Spark).

    ``fingerprint`` is this run's :func:`pipeline.config.fingerprint.task_fingerprint`: a row scored
    with another model revision or other result-changing settings is scored again. A row the
    quarantine holds under the same key failed before and would fail again: skipped (and returned in
    ``known_bad``, lazily, to be counted) unless ``run.retry_quarantined``, so one poison row
    left in the source neither fails every night's error budget nor grows the quarantine.
    """
    from pipeline.io.sources import SourceError, read_delta

    if not config.sink.path:
        raise JobError("run.incremental needs sink.path (the output Delta table to compare against)")
    known = None
    if not config.run.retry_quarantined:
        bad = _known_bad(spark, config, fingerprint)
        if bad is not None:
            on = inputs["id"].eqNullSafe(bad["_bad_id"]) & (inputs["content_hash"] == bad["_bad_hash"])
            known = inputs.join(bad, on=on, how="left_semi")
            inputs = inputs.join(bad, on=on, how="left_anti")
    version = _sink_version(spark, config.sink.location, sink_version)  # the commit writes only keys no commit since wrote
    if version is None:
        return NewInputs(inputs, known, None)  # no output yet: everything is new
    try:
        done = read_delta(spark, config.sink.location, version=version)
    except SourceError:
        return NewInputs(inputs, known, version)  # no output yet: everything is new
    missing = [c for c in ("content_hash", "task_fingerprint") if c not in done.columns]
    if missing:
        raise JobError(f"output {config.sink.path} has no {' or '.join(missing)} column (written by an older "
                       "version); run once without run.incremental to rebuild it")
    done = (done.where(done["task_fingerprint"] == fingerprint)
            .select(done[config.source.id_column].alias("_done_id"), done["content_hash"].alias("_done_hash"))
            .hint("merge"))  # never broadcast: the output can hold millions of keys
    # null-safe on the id: a null-id row scored before is not new every night (it was, and grew the table)
    new = inputs.join(done, on=inputs["id"].eqNullSafe(done["_done_id"])
                      & (inputs["content_hash"] == done["_done_hash"]), how="left_anti")
    return NewInputs(new, known, version)


def _done_keys(spark: "SparkSession", path: "str | Location | None", id_column: str, ds: dt.date,
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


def append_key_filter(spark: "SparkSession", inputs: NewInputs, config: JobConfig, ds: dt.date, *,
                      sink_version: int | None = None, rows_before: int | None = None) -> NewInputs:
    """``inputs`` without the rows whose key (id, ds) the output already holds, with the row count before
    and the output's version compared against.

    An append is keyed on the row, not the run: a retry with another setting (a smaller batch after
    an out-of-memory error), or a rerun after part of the day went, writes only the keys missing.
    The id compares null-safely. (The quarantine is not consulted: a retry scores a failed row again,
    and its quarantine commit, keyed on the run, finds the earlier try's.) ``sink_version``: the output's
    version as the plan read its log (-1: no table; None: asked here); ``rows_before``: the rows before the
    filter when the source's log counted them (None: counted here).
    """
    sink = config.sink.location
    version = _sink_version(spark, sink, sink_version) if sink else None
    done = _done_keys(spark, sink, config.source.id_column, ds, version) if sink else None
    if done is None:
        return replace(inputs, read_version=version)
    before = rows_before if rows_before is not None else inputs.rows.count()
    # a sort-merge join: a day of millions of ids must never be broadcast (10M ids ran the driver out of memory)
    done = done.hint("merge")
    rows = inputs.rows.join(done, on=inputs.rows["id"].eqNullSafe(done["_done_id"]), how="left_anti")
    return replace(inputs, rows=rows, read_version=version, rows_before=before)


def read_new_inputs(spark: "SparkSession", config: JobConfig, *, fingerprint: str, task: Any = None,
                    sink_version: int | None = None) -> NewInputs:
    """The validated rows to score: ``id``, the task's input columns, ``content_hash`` and the kept columns.

    The task kind reads them (:meth:`pipeline.tasks.job.TaskJob.read_inputs`). With ``run.incremental``
    only rows that are new, changed, or were scored with another task ``fingerprint`` remain (compared at
    the output's ``sink_version`` when the plan read it: -1 for no table).
    """
    kind, task = kind_and_task(config, task)
    inputs = hashed_inputs(kind.job.read_inputs(spark, config, task), config, task)
    if config.run.incremental:
        return _incremental_filter(spark, inputs, config, fingerprint, sink_version)
    return NewInputs(inputs)


def hashed_inputs(inputs: "DataFrame", config: JobConfig, task: Any) -> "DataFrame":
    """``inputs`` (``id``, the task's input columns, the kept columns) with each row's ``content_hash``, the ids
    checked first when ``source.unique_ids`` is set; a malformed line is keyed on its raw text. A batch run's
    rows and a stream's micro-batch get their keys here alike."""
    if config.source.unique_ids:
        _check_ids(_parsed_rows(inputs), config.source.id_column)
    return _key_malformed_lines(inputs.withColumn("content_hash", content_hash(tuple(task.input_columns))))


def prepare_inputs(spark: "SparkSession", config: JobConfig, *, revision: str, task: Any = None) -> "DataFrame":
    """:func:`read_new_inputs`' rows, for the model ``revision`` (another revision or result-changing settings
    give another task fingerprint, see :mod:`pipeline.config.fingerprint`: an incremental run scores those rows
    again)."""
    return read_new_inputs(spark, config, fingerprint=task_fingerprint(config, revision=revision), task=task).rows


# malformed source lines (JSON lines Spark could not parse): flagged by the task, quarantined raw
def malformed_input(inputs: "DataFrame") -> tuple[str, ...]:
    """The raw-line column for the task when the source has one (``pipeline.core.rows.MALFORMED_COLUMN``)."""
    return (MALFORMED_COLUMN,) if MALFORMED_COLUMN in inputs.columns else ()


def _parsed_rows(inputs: "DataFrame") -> "DataFrame":
    """``inputs`` without the malformed lines (those have no id to check)."""
    if not malformed_input(inputs):
        return inputs
    return inputs.where(inputs[malformed_input(inputs)[0]].isNull())


def _key_malformed_lines(inputs: "DataFrame") -> "DataFrame":
    """A malformed line has no id: its ``content_hash`` is its raw text's, so two bad lines stay apart."""
    from pyspark.sql import functions as F

    if not malformed_input(inputs):
        return inputs
    raw = F.col(malformed_input(inputs)[0])
    return inputs.withColumn("content_hash", F.when(raw.isNotNull(), F.sha2(raw, 256))
                             .otherwise(F.col("content_hash")))


def malformed_originals(inputs: "DataFrame", input_columns: tuple[str, ...]) -> "DataFrame":
    """``inputs`` with a malformed line's raw text in the first input column (``input_text`` in quarantine)."""
    from pyspark.sql import functions as F

    if not malformed_input(inputs) or not input_columns:
        return inputs
    raw, first = F.col(malformed_input(inputs)[0]), input_columns[0]
    return inputs.withColumn(first, F.when(raw.isNotNull(), raw.cast(inputs.schema[first].dataType))
                             .otherwise(F.col(first)))
