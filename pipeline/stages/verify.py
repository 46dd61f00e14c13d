"""Verify: what a run committed, checked against its input by the commits' own log entries, and read back at
the versions committed when those disagree.

Each commit's log entry says what it added: the rows of its add actions (``numRecords``) and, from the
``deltalake`` writer, the :class:`~pipeline.core.rows.KeyTally` of their keys that the writer tallied file by file
(:class:`pipeline.io.delta.plan.WriteResult`). When the output's and the quarantine's match the tallies the
scoring pass took of the rows sent to each, every input key is there once and nothing is read. Otherwise
(or after an overlapping run wrote some keys first, or when a tally is missing) both tables are read as of
the commits this run made (never the latest version: another job may have committed on top) and every
input key must be there once: in the output, in the quarantine, or in the overlapping run's rows.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig
from pipeline.core.rows import Status
from pipeline.stages.outcomes import Committed, Prepared, ReadBack, RunPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipeline.io.delta.plan import CommitOptions

__all__ = ["check_written", "day_rows", "read_back", "rows_written", "write_tallied"]


def rows_written(spark: "SparkSession", path: str, run_id: str, ds: dt.date | None,
                  version: int | None = None) -> "DataFrame":
    """This run's rows in the table at ``path``, as of ``version`` (the commit this run made; None: latest)."""
    from pyspark.sql import functions as F

    return day_rows(spark, path, ds, version=version).where(F.col("run_id") == F.lit(run_id))


def day_rows(spark: "SparkSession", path: str, ds: dt.date | None, *, version: int | None) -> "DataFrame":
    """The rows of run date ``ds`` (all rows when None) in the table at ``path``, as of ``version``."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import read_delta

    table = read_delta(spark, path, version=version)
    return table if ds is None else table.where(F.col("ds") == F.lit(ds).cast("date"))


def _rows_of_keys(spark: "SparkSession", path: str, in_keys: "DataFrame", config: JobConfig,
                  ds: dt.date | None, *, version: int | None, fingerprint: str) -> "DataFrame":
    """The rows the table at ``path`` holds (at ``version``) for this run's input ids, whichever run wrote
    them: after an overlapping run committed some keys first, they stand for this run's."""
    from pyspark.sql import functions as F

    table = day_rows(spark, path, ds, version=version)
    if config.run.incremental:
        table = table.where(F.col("task_fingerprint") == F.lit(fingerprint))
    ids = in_keys.select(F.col("_key_id").alias("_in_id")).distinct()  # key_counts' ids, as strings
    return table.join(ids, on=table[config.source.id_column].cast("string").eqNullSafe(ids["_in_id"]),
                      how="left_semi")


def _scored_at(rows: "DataFrame", scored_at: dt.datetime | None) -> "DataFrame":
    """A micro-batch's ``rows`` among its run's: those scored at ``scored_at`` (each micro-batch has its own, to the
    microsecond); None: the latest of them (the micro-batch an earlier try committed last, replayed now)."""
    from pyspark.sql import functions as F

    if scored_at is None:
        scored_at = rows.agg(F.max("scored_at")).first()[0]
    return rows.where(F.col("scored_at") == F.lit(scored_at))


def check_written(in_keys: "DataFrame", written: "DataFrame", quarantined: "DataFrame | None",
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
        held = held.unionByName(quarantined.select(id_column, "content_hash", F.lit(Status.ERROR.value).alias("status")))
    return identity_check(in_keys, key_counts(held, id_column=id_column, status_column="status"))


def write_tallied(prep: Prepared, df: "DataFrame", sink: Any, *, commit: "CommitOptions", **options: Any) -> Any:
    """:func:`pipeline.io.delta.sink.write_sink` of ``df`` with ``commit``, keyed rows tallied on the way: the
    deltalake writer tallies what each file holds and its commit records it; for a writer that records none (the
    connector) the tally of the rows handed to its write, observed in that write's own job, stands in
    (``keys_added``)."""
    import dataclasses

    from pipeline.io.delta.sink import write_sink
    from pipeline.spark.checks import observe_input_tally

    id_column = prep.config.source.id_column
    keyed = {id_column, "content_hash"} <= set(df.columns)
    observed, handed = observe_input_tally(df, id_column=id_column) if keyed else (df, None)
    tally = (id_column, "content_hash") if keyed else ()
    result = write_sink(observed, sink, commit=dataclasses.replace(commit, tally_columns=tally), **options)
    if handed is not None and result.keys_added is None and result.rows_added is not None:
        result = dataclasses.replace(result, keys_added=handed.get())
    return result


def read_back(prep: Prepared, plan: RunPlan, committed: Committed) -> ReadBack:
    """Both commits checked by their own log entries against the scoring pass's tallies; read back at their
    versions and checked by key against the input when those disagree."""
    prep.stage("read-back")
    logged = _from_log_entries(prep, plan, committed)
    if logged is not None:
        return logged
    return _read_and_check(prep, plan, committed)


def _from_log_entries(prep: Prepared, plan: RunPlan, committed: Committed) -> ReadBack | None:
    """The counts when the commits' log entries add up to what the scoring pass sent each table (rows, and
    the key tally where the writer recorded one); None when they do not, or cannot say."""
    result, written, quarantined = committed.result, committed.written, committed.quarantined
    if written is None or quarantined is None or result.overlapped or not _keyed_output(prep, plan):
        return None
    if not _adds_up(result, written):
        return None
    if committed.quarantine_version is None:
        return ReadBack(None, written.rows, 0, None) if quarantined.rows == 0 else None
    q = committed.quarantine_result
    if committed.quarantine_run != plan.identity.run_id or q is None or not _adds_up(q, quarantined):
        return None
    return ReadBack(None, written.rows, quarantined.rows, None)


def _adds_up(result: Any, sent: Any) -> bool:
    """Whether a commit's log entry added the rows sent (and, where its writer tallied them, the same keys)."""
    if result.rows_added is None or result.rows_added != sent.rows:
        return False
    return result.keys_added is None or result.keys_added == sent


def _keyed_output(prep: Prepared, plan: RunPlan) -> bool:
    """Whether the output holds one row per input row, keyed by id and content hash (not recommendations)."""
    from pipeline.spark.udf import internal_columns

    shaped = prep.kind.job.shape_output(plan.scored.drop(*internal_columns(plan.scored)), prep.config)
    return {prep.config.source.id_column, "content_hash", "status"} <= set(shaped.columns)


def _read_and_check(prep: Prepared, plan: RunPlan, committed: Committed) -> ReadBack:
    """Both commits read back at their versions and checked by key against the input (read again)."""
    from pipeline.spark.checks import key_counts

    config, spark, result, ident = prep.config, prep.spark, committed.result, plan.identity
    in_keys = key_counts(plan.inputs, id_column="id")
    partition_ds = plan.partition_ds
    written = rows_written(spark, result.output, ident.run_id, partition_ds, version=result.version)
    if plan.micro_batch is not None:  # the run's earlier micro-batches are there too: this one's scored_at
        written = _scored_at(written, prep.scored_at)
    if result.overlapped:  # keys an overlapping run wrote first: their rows stand for this run's
        prep.say(f"{result.overlapped:,} row(s) were committed meanwhile by an overlapping run (key: "
                 f"{', '.join(plan.key_columns)}); written once, by that run", ident)
        written = _rows_of_keys(spark, result.output, in_keys, config, partition_ds, version=result.version,
                                fingerprint=ident.task_fingerprint)
    quarantined = None
    if committed.quarantine_version is not None:
        earlier = committed.quarantine_run != ident.run_id  # a replayed micro-batch: its earlier try's rows
        quarantined = rows_written(spark, plan.quarantine_path, committed.quarantine_run,
                                   None if earlier and plan.micro_batch is not None else partition_ds,
                                   version=committed.quarantine_version)
        if plan.micro_batch is not None:
            quarantined = _scored_at(quarantined, None if earlier else prep.scored_at)
    written_check = check_written(in_keys, written, quarantined, config.source.id_column)
    if written_check is not None:
        rows_out, rows_quarantined = written_check.rows_out - written_check.errors, written_check.errors
    else:  # output rows are not one per input row (e.g. recommendations): counted, and checked by the kind
        rows_out = written.count()
        rows_quarantined = quarantined.count() if quarantined is not None else 0
    incomplete = None
    if written_check is not None and not written_check.ok:
        incomplete = "read back after the commit: " + written_check.describe(what="written")
    return ReadBack(written=written, rows_out=rows_out, rows_quarantined=rows_quarantined, incomplete=incomplete)
