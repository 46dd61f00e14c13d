"""A Spark Python data source that writes Delta tables through ``deltalake`` (delta-rs).

For sessions without the Delta Spark connector (no cached jars, ``SBI_NO_JARS=1``,
or ``sink.writer: deltalake``). Two-phase commit:

1. each Spark task writes its rows as Parquet files inside the table folder
   (named with this job's write id and the task attempt) and returns their add
   actions in a commit message (:mod:`pipeline.io.delta.writer`, :mod:`pipeline.io.delta.files`);
2. the driver commits the add actions of the successful attempts in ONE Delta
   transaction (:mod:`pipeline.io.delta.commit`). Files of failed or retried attempts
   are never referenced and are deleted after the commit; a failed job commits nothing
   and deletes its files.

Idempotent: with ``txn_app_id`` the commit carries a Delta transaction
(``txn {appId, version 0}``) for the logical run; an append whose app id the
table already holds commits nothing (a retry of a run that did commit). Crash
safe: with ``require_marker`` the commit first takes the write's marker over
(:mod:`pipeline.io.delta.markers`) and refuses if a sweep claimed it; after a commit,
leftovers of dead writes are swept (:mod:`pipeline.io.delta.sweep`).

The table lives in a local (or mounted) folder or on S3 (``s3://``, ``s3a://``):
files go through :class:`pipeline.io.stores.TableStore` (pyarrow's ``S3FileSystem``
there), commits through delta-rs's object store with conditional puts. On S3 the
markers are objects and no sweep of other writes runs.

The result is a standard Delta table that any Delta reader opens. Usage (the
sink does this, with :class:`~pipeline.io.delta.options.DeltaLakeOptions`)::

    spark.dataSource.register(DeltaLakeDataSource)
    (df.write.format("sbi_delta").mode("overwrite")
       .option("path", "/data/scores").option("partition_by", "ds")
       .option("replace_where", '{"ds": "2026-11-29"}').save())

Spark pickles the data source and its writer by reference: both stay importable from these modules.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from pipeline.io.delta.files import to_delta_schema
from pipeline.io.delta.options import FORMAT_NAME
from pipeline.io.delta.writer import DeltaLakeArrowWriter, DeltaWriteMessage

__all__ = ["DeltaLakeDataSource", "write_from_driver"]


class DeltaLakeDataSource(DataSource):
    """``format("sbi_delta")``: write-only Delta data source backed by deltalake."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema: Any, overwrite: bool) -> DeltaLakeArrowWriter:
        from pipeline.arrow_types import to_arrow_schema

        arrow_schema = to_delta_schema(to_arrow_schema(schema))
        return DeltaLakeArrowWriter(dict(self.options), schema=arrow_schema, overwrite=overwrite)


def write_from_driver(df: Any, options: dict[str, str], *, overwrite: bool) -> None:
    """What ``df.write.format("sbi_delta").options(**options).save()`` does, with its one task run here.

    For small jobs on a local master (``pipeline.stages.small_jobs``): the rows come to this process as
    Arrow, one :meth:`DeltaLakeArrowWriter.write` writes their files and :meth:`~DeltaLakeArrowWriter.commit`
    commits them, the same two phases, markers and transaction as through Spark, without the three
    Python processes Spark starts for a data source write (its planning, the task, the commit: about
    5 s of a 100-row job on 2 cores). As through Spark, a failed write or commit aborts: its marker is
    marked aborted and its files deleted.
    """
    writer = DeltaLakeDataSource(dict(options)).writer(df.schema, overwrite)
    messages: list[DeltaWriteMessage] = []
    try:
        messages.append(writer.write(iter(df.toArrow().to_batches())))
        writer.commit(messages)
    except BaseException:
        try:
            writer.abort(messages)
        except Exception:  # noqa: BLE001 - the write's own error is the one to report; a sweep takes the rest
            pass
        raise
