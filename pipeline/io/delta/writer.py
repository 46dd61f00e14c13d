"""The ``sbi_delta`` data source's writer: executors write Parquet files, the driver commits or aborts them.

Spark builds one :class:`DeltaLakeArrowWriter` on the driver and pickles it to every task. Each
task's :meth:`~DeltaLakeArrowWriter.write` writes its rows' files (:mod:`pipeline.io.delta.files`)
and returns their add actions; the driver's :meth:`~DeltaLakeArrowWriter.commit` commits them in
one transaction (:mod:`pipeline.io.delta.commit`), its :meth:`~DeltaLakeArrowWriter.abort` marks the
write aborted and deletes every file it made. What to write comes typed from
:class:`~pipeline.io.delta.options.DeltaLakeOptions`, read once here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from pipeline.io.delta import markers
from pipeline.io.delta.files import PartFile, delete_files, split_partitions, sweep_orphans, to_delta_types
from pipeline.io.delta.options import DeltaLakeOptions

__all__ = ["DeltaLakeArrowWriter", "DeltaWriteMessage"]


@dataclass
class DeltaWriteMessage(WriterCommitMessage):
    """What one successful task attempt wrote: add actions as plain dicts (picklable)."""

    adds: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0


class DeltaLakeArrowWriter(DataSourceArrowWriter):
    """Executors: :meth:`write` Parquet files. Driver: :meth:`commit` or :meth:`abort` them."""

    def __init__(self, options: dict[str, str], *, schema: pa.Schema, overwrite: bool) -> None:
        lake = DeltaLakeOptions.from_options(options)  # refuses a write without a path
        from pipeline.io.stores import TableStore, is_object_store, reachable

        path = lake.path
        if not reachable(path):
            raise ValueError(
                f"the sbi_delta writer writes local or mounted paths and s3:// (s3a://) locations, not {path!r}; "
                "write other object stores through the Delta Spark connector (format 'delta')"
            )
        # S3 settings resolved on the driver (pipeline.io.stores.storage_options): the Python workers Spark
        # starts have the environment of its JVM, which may predate them
        self.store = TableStore(path, lake.storage_options if is_object_store(path) else None)
        self.lake = replace(lake, write_id=lake.write_id or uuid.uuid4().hex)
        self.partition_by = list(lake.partition_by)
        self.overwrite = overwrite
        self.schema_bytes = schema.serialize().to_pybytes()
        if lake.replace_where and sorted(lake.replace_where) != sorted(self.partition_by):
            raise ValueError(
                f"replace_where {dict(lake.replace_where)} must name exactly the partition columns {self.partition_by}"
            )

    @property
    def write_id(self) -> str:
        return self.lake.write_id

    # ---------------------------------------------------------------- executors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaWriteMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{ctx.partitionId():05d}-a{ctx.attemptNumber()}" if ctx else "00000-a0"
        writers: dict[tuple, PartFile] = {}
        message = DeltaWriteMessage()
        late = None
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                if self.lake.faults and not writers:  # before its first file: a drill may hold the task here
                    late = self._late_close(ctx)
                table = to_delta_types(pa.Table.from_batches([batch]))
                for key, part in split_partitions(table, self.partition_by):
                    current = writers.get(key)
                    if current is None or current.rows >= self.lake.target_file_rows:
                        if current is not None:
                            message.adds.append(current.close())
                        current = writers[key] = PartFile(self.store, self.partition_by, key, self.write_id, tag,
                                                          tally=self.lake.tally_columns)
                    current.write(part)
                    message.rows += part.num_rows
                    if self.lake.faults and ctx is not None and message.rows == part.num_rows:  # the first part: once
                        from pipeline.core import faults

                        faults.on_write(ctx.partitionId(), ctx.attemptNumber(), self.lake.faults)
            for current in writers.values():
                message.adds.append(current.close())
            if late is not None:
                late()
            if self._job_finished():
                # a straggler (speculative or killed-late attempt) finishing after the driver's
                # commit or abort: nobody will reference these files, so take them back
                delete_files(self.store, message.adds)
                return DeltaWriteMessage()
        except BaseException:
            for current in writers.values():
                current.discard()
            delete_files(self.store, message.adds)
            raise
        return message

    def _late_close(self, ctx: Any) -> Any:
        """The ``late_close`` fault's hook for this task (:func:`pipeline.core.faults.closes_late`), or None."""
        if not self.lake.faults or ctx is None:
            return None
        from pipeline.core import faults

        probe = f"part-{ctx.partitionId():05d}-probe-{self.write_id}.parquet"  # the abort's sweep takes it
        return faults.closes_late(ctx.partitionId(), ctx.attemptNumber(), self.lake.faults,
                                  plant=lambda: self.store.write_json(probe, {}),
                                  planted=lambda: self.store.exists(probe))

    # ---------------------------------------------------------------- driver
    def commit(self, messages: Sequence[DeltaWriteMessage | None]) -> None:
        from pipeline.io.delta.commit import commit_write

        adds = [a for m in messages if m is not None for a in m.adds]
        schema = pa.ipc.read_schema(pa.py_buffer(self.schema_bytes))
        commit_write(self.store, adds, self.lake, schema=schema, overwrite=self.overwrite)

    def abort(self, messages: Sequence[DeltaWriteMessage | None]) -> None:
        markers.finish_marker(self.store, self.write_id, aborted=True)
        delete_files(self.store, [a for m in messages if m is not None for a in m.adds])
        sweep_orphans(self.store, self.write_id, keep=set())

    # The driver marks the job finished BEFORE it sweeps, and each task checks the mark AFTER
    # closing its files: a file made before the sweep is swept, one made after the mark is
    # deleted by its own task. Either way no stray file of this job outlives it.
    def _job_finished(self) -> bool:
        return markers.is_given_up(self.store, self.write_id)
