"""A Spark Python data source that writes Delta tables through ``deltalake`` (delta-rs).

For sessions without the Delta Spark connector (no cached jars, ``SBI_NO_JARS=1``,
or ``sink.writer: deltalake``). Two-phase commit:

1. each Spark task writes its rows as Parquet files inside the table folder
   (named with this job's write id and the task attempt) and returns their add
   actions in a commit message;
2. the driver commits the add actions of the successful attempts in ONE Delta
   transaction. Files of failed or retried attempts are never referenced and are
   deleted after the commit; a failed job commits nothing and deletes its files.

Idempotent: with ``txn_app_id`` the commit carries a Delta transaction
(``txn {appId, version 0}``) for the logical run; an append whose app id the
table already holds commits nothing (a retry of a run that did commit). Crash
safe: with ``require_marker`` the commit first takes the write's marker over
(``pipeline.io.leftovers``) and refuses if a sweep claimed it; after a commit,
leftovers of dead writes are swept.

The table lives in a local (or mounted) folder or on S3 (``s3://``, ``s3a://``):
files go through :class:`pipeline.io.stores.TableStore` (pyarrow's ``S3FileSystem``
there), commits through delta-rs's object store with conditional puts. On S3 the
markers are objects and no sweep of other writes runs (``pipeline.io.leftovers``).

The result is a standard Delta table that any Delta reader opens. Usage (the
sink module does this)::

    spark.dataSource.register(DeltaLakeDataSource)
    (df.write.format("sbi_delta").mode("overwrite")
       .option("path", "/data/scores").option("partition_by", "ds")
       .option("replace_where", '{"ds": "2026-11-29"}').save())
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

__all__ = ["DeltaLakeDataSource", "DeltaWriteMessage", "FORMAT_NAME", "write_from_driver"]

FORMAT_NAME = "sbi_delta"
_KEYED_ATTEMPTS = 5
WRITE_ID_KEY = "sbi.write_id"
APP_ID_KEY = "sbi.app_id"


@dataclass
class DeltaWriteMessage(WriterCommitMessage):
    """What one successful task attempt wrote: add actions as plain dicts (picklable)."""

    adds: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0


class DeltaLakeDataSource(DataSource):
    """``format("sbi_delta")``: write-only Delta data source backed by deltalake."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def writer(self, schema: Any, overwrite: bool) -> "DeltaLakeArrowWriter":
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow_schema = _to_delta_schema(to_arrow_schema(schema, timezone="UTC"))
        return DeltaLakeArrowWriter(dict(self.options), schema=arrow_schema, overwrite=overwrite)


def write_from_driver(df: Any, options: dict[str, str], *, overwrite: bool) -> None:
    """What ``df.write.format("sbi_delta").options(**options).save()`` does, with its one task run here.

    For small jobs on a local master (``pipeline.small_jobs``): the rows come to this process as
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


def _option_list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


class DeltaLakeArrowWriter(DataSourceArrowWriter):
    """Executors: :meth:`write` Parquet files. Driver: :meth:`commit` or :meth:`abort` them."""

    def __init__(self, options: dict[str, str], *, schema: pa.Schema, overwrite: bool) -> None:
        path = options.get("path")
        if not path:
            raise ValueError("the sbi_delta writer needs .option('path', <table folder>)")
        from pipeline.io.stores import TableStore, is_object_store, reachable

        if not reachable(path):
            raise ValueError(
                f"the sbi_delta writer writes local or mounted paths and s3:// (s3a://) locations, not {path!r}; "
                "write other object stores through the Delta Spark connector (format 'delta')"
            )
        # S3 settings resolved on the driver (pipeline.io.stores.storage_options): the Python workers Spark
        # starts have the environment of its JVM, which may predate them
        store_options = json.loads(options.get("storage_options_secret") or "null") if is_object_store(path) else None
        self.store = TableStore(path, store_options)
        self.path = self.store.uri
        self.partition_by = _option_list(options.get("partition_by"))
        self.overwrite = overwrite
        self.schema_bytes = schema.serialize().to_pybytes()
        # {column: value}: with overwrite, replace only this partition (like Delta's replaceWhere)
        self.replace_where: dict[str, Any] = json.loads(options.get("replace_where") or "{}")
        if self.replace_where and sorted(self.replace_where) != sorted(self.partition_by):
            raise ValueError(
                f"replace_where {self.replace_where} must name exactly the partition columns {self.partition_by}"
            )
        self.commit_metadata = json.loads(options.get("commit_metadata", "{}"))
        self.write_id = options.get("write_id") or uuid.uuid4().hex
        self.target_file_rows = int(options.get("target_file_rows", "1000000"))
        self.faults = json.loads(options.get("faults") or "{}")
        self.txn_app_id = options.get("txn_app_id") or None
        self.require_marker = options.get("require_marker") == "true"
        self.leftover_grace_s = float(options.get("leftover_grace_s", "900"))
        # a keyed append: commit only the keys no commit since ``read_version`` wrote (pipeline.io.delta_keys)
        self.key_columns: list[str] = json.loads(options.get("key_columns") or "[]")
        read_version = options.get("read_version", "")
        self.read_version = int(read_version) if read_version not in ("", "none", "None") else None

    # ---------------------------------------------------------------- executors
    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaWriteMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{ctx.partitionId():05d}-a{ctx.attemptNumber()}" if ctx else "00000-a0"
        writers: dict[tuple, _PartFile] = {}
        message = DeltaWriteMessage()
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                table = _to_delta_types(pa.Table.from_batches([batch]))
                for key, part in _split_partitions(table, self.partition_by):
                    current = writers.get(key)
                    if current is None or current.rows >= self.target_file_rows:
                        if current is not None:
                            message.adds.append(current.close())
                        current = writers[key] = _PartFile(self.store, self.partition_by, key, self.write_id, tag)
                    current.write(part)
                    message.rows += part.num_rows
                    if self.faults and ctx is not None and message.rows == part.num_rows:  # the first part: once
                        from pipeline import faults

                        faults.on_write(ctx.partitionId(), ctx.attemptNumber(), self.faults)
            for current in writers.values():
                message.adds.append(current.close())
            if self._job_finished():
                # a straggler (speculative or killed-late attempt) finishing after the driver's
                # commit or abort: nobody will reference these files, so take them back
                self._delete_files(message.adds)
                return DeltaWriteMessage()
        except BaseException:
            for current in writers.values():
                current.discard()
            for add in message.adds:
                self.store.remove(add["path"])
            raise
        return message

    # ---------------------------------------------------------------- driver
    def commit(self, messages: Sequence[DeltaWriteMessage | None]) -> None:
        from deltalake import CommitProperties
        from deltalake.exceptions import TableNotFoundError
        from deltalake.transaction import AddAction, Transaction

        from pipeline.io import leftovers

        adds = [a for m in messages if m is not None for a in m.adds]
        actions = [AddAction(**a) for a in adds]
        schema = pa.ipc.read_schema(pa.py_buffer(self.schema_bytes))
        metadata = {**self.commit_metadata, WRITE_ID_KEY: self.write_id}
        if self.txn_app_id:
            metadata[APP_ID_KEY] = self.txn_app_id
        props = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(self.txn_app_id, 0)] if self.txn_app_id else None,
        )
        facts: dict[str, Any] = {}
        try:
            try:
                table = self.store.table()
            except TableNotFoundError:
                table = None
            if self.replace_where:
                self._check_inside_partition(adds)
            if self.faults:
                from pipeline import faults

                faults.on_commit(self.write_id, self.faults)
            if not self.overwrite and table is not None and self._holds_this_run(table):
                # this logical run already committed (its driver died after the commit): a retry adds nothing
                self._delete_files(adds)
                facts["already_committed"] = True
                return
            if self.require_marker:
                leftovers.claim_for_commit(self.store, self.write_id)
            if self.key_columns and not self.overwrite:
                adds, facts["overlap_rows"] = self._commit_keyed(table, adds, schema, metadata, props)
            elif not self._commit_plain(table, actions, schema, props):
                self._delete_files(adds)  # a concurrent try of this very run created the table first
                facts["already_committed"] = True
                return
        except BaseException as exc:
            self._delete_files(adds)
            facts["error"] = f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            leftovers.finish_marker(self.store, self.write_id, **facts)
            self._sweep_orphans(keep={a["path"] for a in adds} if "error" not in facts else set())
        try:
            report = leftovers.sweep_leftovers(self.store, grace_s=self.leftover_grace_s)
            swept = {"files": len(report.files), "bytes": report.bytes, "markers": len(report.markers),
                     **({"skipped": report.skipped} if report.skipped else {}),
                     **({"left_alone": report.unproven[:20], "left_alone_count": len(report.unproven)}
                        if report.unproven else {})}
        except Exception as exc:  # noqa: BLE001 - the commit landed; a failed sweep is retried by the next job
            swept = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        leftovers.finish_marker(self.store, self.write_id, swept=swept)

    def _commit_plain(self, table: Any, actions: list[Any], schema: pa.Schema, props: Any) -> bool:
        """Append ``actions``, or replace the table (or the partition) with them; False when a concurrent try
        of this very run created the table first (nothing committed). ``table`` None: there was none."""
        from deltalake.exceptions import CommitFailedError

        from pipeline.errors import SinkError, lost_commit_message

        if table is None:
            if self._create_table(schema, actions, props):
                return True
            if self.overwrite:  # another job created the table after this one looked
                raise SinkError(lost_commit_message(self.path, "it created the table first", winner=self._winner(None)))
            table = self.store.table()  # an append goes into the table that won
            if self._holds_this_run(table):
                return False
        _check_partitioning(table, self.partition_by, self.path)
        mode = "overwrite" if self.overwrite else "append"
        filters = None
        read_version = table.version()
        if self.overwrite and self.replace_where:
            filters = [(c, "=", _partition_string(v)) for c, v in self.replace_where.items()]
            # A replace of a partition that has no files yet removes nothing, and delta-rs lets two such
            # commits both land (every row twice). The partition's token makes them conflict, like two
            # replaces of a partition that has files.
            props = _with_transactions(props, [self._replace_token()], read_version + 1)
        try:
            table.create_write_transaction(
                actions, mode, self._kept_schema(table, schema), partition_by=self.partition_by or None,
                partition_filters=filters, commit_properties=props,
            )
        except CommitFailedError as exc:
            where = f" partition {self.replace_where}" if self.replace_where else ""
            raise SinkError(lost_commit_message(f"{self.path}{where}", str(exc).splitlines()[0],
                                                winner=self._winner(read_version))) from None
        return True

    def _kept_schema(self, table: Any, schema: pa.Schema) -> Any:
        """The table's schema with this write's new columns added: a column someone else added stays
        (``pipeline.io.delta_schema``); a type clash fails the commit, naming the column."""
        from deltalake import Schema as DeltaSchema

        from pipeline.errors import SinkError
        from pipeline.io.delta_schema import merge_schemas

        try:
            return merge_schemas(table.schema(), DeltaSchema.from_arrow(schema))
        except ValueError as exc:
            raise SinkError(f"Delta table {self.path}: {exc}") from None

    def _replace_token(self) -> str:
        """The conflict token of a partition replace: one per replaced partition of this table.

        >>> w = DeltaLakeArrowWriter.__new__(DeltaLakeArrowWriter); w.replace_where = {"ds": "2026-11-28"}
        >>> w._replace_token()
        'sbi.replace:ds=2026-11-28'
        """
        return "sbi.replace:" + ",".join(f"{c}={_partition_string(v)}" for c, v in sorted(self.replace_where.items()))

    def _winner(self, read_version: int | None) -> str | None:
        """Who committed after ``read_version``, as its commit says (``run X, version N``); None if unknown."""
        try:
            table = self.store.table()
            newer = [e for e in table.history(limit=max(1, table.version() - (read_version or -1)))
                     if int(e.get("version", -1)) > (-1 if read_version is None else read_version)]
        except Exception:  # noqa: BLE001 - the conflict stands without a name
            return None
        for entry in sorted(newer, key=lambda e: -int(e["version"])):
            run = entry.get("sbi.run_id")
            if entry.get(WRITE_ID_KEY) != self.write_id:
                return f"run {run}, version {entry['version']}" if run else f"version {entry['version']}"
        return None

    def _holds_this_run(self, table: Any) -> bool:
        """The table already holds this logical run's transaction (an earlier or concurrent try committed it)."""
        return bool(self.txn_app_id) and table.transaction_version(self.txn_app_id) is not None

    def _commit_keyed(self, table: Any, adds: list[dict[str, Any]], schema: pa.Schema,
                      metadata: dict[str, Any], props: Any) -> tuple[list[dict[str, Any]], int]:
        """Append ``adds`` without the keys that commits since ``read_version`` wrote; returns the adds
        committed and the rows dropped. The commit carries the key's conflict token: when an overlapping
        run's commit with the same token lands first, delta-rs rejects this one and the keys are checked
        again against that commit (``pipeline.io.delta_keys``)."""
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, Transaction

        from pipeline.errors import SinkError
        from pipeline.io import delta_keys

        base, dropped = self.read_version, 0
        for attempt in range(_KEYED_ATTEMPTS):
            if table is not None:
                _check_partitioning(table, self.partition_by, self.path)
                current = table.version()
                if base is None or current > base:
                    added = delta_keys.files_added_since(table, self.store, base)
                    taken = delta_keys.taken_keys(self.store, added, self.key_columns, self.partition_by)
                    adds, n = delta_keys.drop_taken(self.store, adds, taken, self.key_columns, self.partition_by,
                                                    rewrite=self._rewrite)
                    dropped += n
                base = current
            tokens = sorted({delta_keys.key_token(self.key_columns, a["partition_values"]) for a in adds}
                            or {delta_keys.key_token(self.key_columns, {})})
            keyed = CommitProperties(
                custom_metadata=metadata,
                app_transactions=[*(props.app_transactions or []),
                                  *(Transaction(t, (base or 0) + 1) for t in tokens)],
            )
            actions = [AddAction(**a) for a in adds]
            try:
                if table is None:
                    if not self._create_table(schema, actions, keyed):
                        raise CommitFailedError("another job created the table first")
                else:
                    table.create_write_transaction(actions, "append", self._kept_schema(table, schema),
                                                   partition_by=self.partition_by or None, commit_properties=keyed)
                return adds, dropped
            except Exception as exc:  # noqa: BLE001 - a commit that lost the race: check the winner's keys
                lost = isinstance(exc, CommitFailedError) or (table is None and self.store.is_table())
                if not lost or attempt == _KEYED_ATTEMPTS - 1:
                    if lost:
                        raise SinkError(f"conflict: {_KEYED_ATTEMPTS} overlapping commits to {self.path} won the "
                                        "race in a row; this job committed nothing. Rerun it: the keys already "
                                        "written are not scored again") from None
                    raise
                table = self.store.table()
        raise AssertionError("unreachable")

    def _create_table(self, schema: pa.Schema, actions: list[Any], props: Any) -> bool:
        """Create the table with ``actions`` as its version 0; False when another job created it first.

        delta-rs retries a create that lost the race for version 0 as a second ``CREATE TABLE`` at the
        next version, rows included: two overlapping first runs left every row twice. Without commit
        retries the losing create fails instead, and the caller writes into the table that won.
        """
        from deltalake import CommitProperties
        from deltalake import Schema as DeltaSchema
        from deltalake.transaction import create_table_with_add_actions

        once = CommitProperties(custom_metadata=props.custom_metadata, app_transactions=props.app_transactions,
                                max_commit_retries=0)
        try:
            create_table_with_add_actions(
                self.path, DeltaSchema.from_arrow(schema), actions, mode="append",
                partition_by=self.partition_by or None, commit_properties=once,
                storage_options=self.store.options or None,
            )
        except Exception:
            if self.store.is_table():  # lost the race: the caller decides (check keys, append, or conflict)
                return False
            raise
        return True

    def _rewrite(self, partition_values: dict[str, Any], rows: pa.Table) -> dict[str, Any]:
        """A staged file again, with fewer rows (its old file is swept as an orphan after the commit)."""
        key = tuple(partition_values.get(c) for c in self.partition_by)
        part = _PartFile(self.store, self.partition_by, key, self.write_id, "keyed")
        part.write(rows)
        return part.close()

    def _check_inside_partition(self, adds: list[dict[str, Any]]) -> None:
        want = {c: _partition_string(v) for c, v in self.replace_where.items()}
        for add in adds:
            if add["partition_values"] != want:
                raise ValueError(
                    f"rows for partition {add['partition_values']} were written while replacing only {want}; "
                    "every row must belong to the replaced partition"
                )

    def abort(self, messages: Sequence[DeltaWriteMessage | None]) -> None:
        from pipeline.io import leftovers

        leftovers.finish_marker(self.store, self.write_id, aborted=True)
        self._delete_files([a for m in messages if m is not None for a in m.adds])
        self._sweep_orphans(keep=set())

    # ---------------------------------------------------------------- helpers
    def _delete_files(self, adds: list[dict[str, Any]]) -> None:
        for add in adds:
            self.store.remove(add["path"])

    # The driver marks the job finished BEFORE it sweeps, and each task checks the mark AFTER
    # closing its files: a file made before the sweep is swept, one made after the mark is
    # deleted by its own task. Either way no stray file of this job outlives it.
    def _job_finished(self) -> bool:
        from pipeline.io import leftovers

        return leftovers.is_given_up(self.store, self.write_id)

    def _sweep_orphans(self, keep: set[str]) -> None:
        """Delete files this job wrote that no commit references (failed or speculative attempts)."""
        for rel in list(self.store.files(containing=self.write_id)):
            if rel not in keep and _unquote_rel(rel) not in keep:
                self.store.remove(rel)


class _PartFile:
    """One Parquet data file for one partition value set, written by one task attempt."""

    def __init__(self, store: Any, partition_by: list[str], key: tuple, write_id: str, tag: str) -> None:
        self.partition_values = {c: (None if v is None else str(v)) for c, v in zip(partition_by, key)}
        folder = "/".join(
            f"{c}={quote('__HIVE_DEFAULT_PARTITION__' if v is None else str(v), safe='')}"
            for c, v in self.partition_values.items()
        )
        name = f"part-{tag}-{write_id}-{uuid.uuid4().hex[:12]}.snappy.parquet"
        self.rel = f"{folder}/{name}" if folder else name
        from pipeline.io.stores import TableStore

        self.store = store if isinstance(store, TableStore) else TableStore(str(store))  # a local folder
        self.writer: pq.ParquetWriter | None = None
        self.rows = 0
        self.stats = _FileStats()

    def write(self, table: pa.Table) -> None:
        if self.writer is None:
            where, filesystem = self.store.parquet_target(self.rel)
            self.writer = pq.ParquetWriter(where, table.schema, compression="snappy", filesystem=filesystem)
        self.writer.write_table(table)
        self.rows += table.num_rows
        self.stats.update(table)

    def close(self) -> dict[str, Any]:
        assert self.writer is not None
        self.writer.close()
        self.writer = None
        size, mtime = self.store.stat(self.rel)
        return {
            "path": self.rel,
            "size": size,
            "partition_values": self.partition_values,
            "modification_time": int(mtime * 1000),
            "data_change": True,
            "stats": json.dumps(self.stats.to_delta(self.rows)),
        }

    def discard(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - best effort on the failure path
                pass
        self.store.remove(self.rel)


def _with_transactions(props: Any, tokens: list[str], version: int) -> Any:
    """``props`` with ``tokens`` added as app transactions (delta-rs rejects a commit when one that landed
    since it read the table carries one of them)."""
    from deltalake import CommitProperties
    from deltalake.transaction import Transaction

    return CommitProperties(custom_metadata=props.custom_metadata,
                            app_transactions=[*(props.app_transactions or []), *(Transaction(t, version) for t in tokens)])


def _to_delta_schema(schema: pa.Schema) -> pa.Schema:
    """Delta stores timestamps as microseconds UTC; Spark hands them in the session time zone."""
    return pa.schema(
        f.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) and f.type.tz is not None else f
        for f in schema
    )


def _to_delta_types(table: pa.Table) -> pa.Table:
    schema = _to_delta_schema(table.schema)
    return table if schema == table.schema else table.cast(schema)


def _split_partitions(table: pa.Table, partition_by: list[str]) -> Iterator[tuple[tuple, pa.Table]]:
    """``(partition values, rows without the partition columns)`` per distinct partition value set."""
    if not partition_by:
        yield (), table
        return
    missing = [c for c in partition_by if c not in table.column_names]
    if missing:
        raise ValueError(f"partition columns {missing} are not in the data (columns: {table.column_names})")
    data_cols = [c for c in table.column_names if c not in partition_by]
    keys = table.select(partition_by).group_by(partition_by).aggregate([]).to_pylist()
    for key in keys:
        mask = None
        for c in partition_by:
            value = key[c]
            cond = pc.is_null(table[c]) if value is None else pc.equal(table[c], value)
            mask = cond if mask is None else pc.and_(mask, cond)
        yield tuple(_partition_string(key[c]) for c in partition_by), table.filter(mask).select(data_cols)


def _partition_string(value: Any) -> str | None:
    if value is None:
        return None
    if hasattr(value, "isoformat") and not isinstance(value, str):
        return value.isoformat()
    return str(value).lower() if isinstance(value, bool) else str(value)


# min/max only where they are exact: floats (NaN) and timestamps (Delta keeps milliseconds) are left out.
_STAT_TYPES = (pa.types.is_integer, pa.types.is_date)


class _FileStats:
    """Delta file statistics, updated batch by batch: nullCount, min/max of numeric/date/timestamp columns."""

    def __init__(self) -> None:
        self.nulls: dict[str, int] = {}
        self.lo: dict[str, Any] = {}
        self.hi: dict[str, Any] = {}

    def update(self, table: pa.Table) -> None:
        for name in table.column_names:
            col = table[name]
            if pa.types.is_nested(col.type):
                continue
            self.nulls[name] = self.nulls.get(name, 0) + col.null_count
            if not any(check(col.type) for check in _STAT_TYPES):
                continue
            if col.null_count == len(col):
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            self.lo[name] = lo if name not in self.lo else min(self.lo[name], lo)
            self.hi[name] = hi if name not in self.hi else max(self.hi[name], hi)

    def to_delta(self, rows: int) -> dict[str, Any]:
        return {
            "numRecords": rows,
            "minValues": {k: _json_value(v) for k, v in self.lo.items()},
            "maxValues": {k: _json_value(v) for k, v in self.hi.items()},
            "nullCount": self.nulls,
        }


def _json_value(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def _check_partitioning(table: Any, partition_by: list[str], path: str) -> None:
    existing = list(table.metadata().partition_columns)
    if existing != list(partition_by):
        raise ValueError(
            f"Delta table {path} is partitioned by {existing or 'nothing'} but this write is partitioned "
            f"by {partition_by or 'nothing'}; set sink.partition_by to {existing} or write to a new path"
        )


def _unquote_rel(rel: str) -> str:
    from urllib.parse import unquote

    return unquote(rel)

