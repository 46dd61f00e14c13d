"""The Parquet data files a write of the ``sbi_delta`` data source makes, and taking them back.

Each Spark task writes its rows as Parquet files inside the table folder, one file per partition
value set (``ds=2026-11-29/part-00003-a0-<write id>-<12 hex>.snappy.parquet``), and describes each
as a Delta add action (path, size, partition values, statistics). The names carry the write id so
that a write can find and delete its own files (a failed or retried attempt, an abort) and a sweep
can tell whose a leftover is (:mod:`pipeline.io.delta.sweep`). Rows arrive in Spark's types and
are stored in Delta's (timestamps as microseconds UTC); partition values as the strings the Delta
log holds.

>>> partition_string(True), partition_string(None), partition_string(3)
('true', None, '3')
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterable, Iterator
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["TALLY_KEY", "PartFile", "add_action", "attempt_of", "check_partitioning", "delete_files", "partition_string", "split_partitions",
           "sweep_orphans", "to_delta_schema", "to_delta_types"]


# the key of an add action (as the tasks return it, never committed) holding the file's key tally
TALLY_KEY = "sbi_keys"


class PartFile:
    """One Parquet data file for one partition value set, written by one task attempt; with ``tally`` (the id
    and content hash columns) it tallies its rows' keys (:class:`pipeline.core.rows.KeyTally`) as it writes them."""

    def __init__(self, store: Any, partition_by: list[str], key: tuple, write_id: str, tag: str,
                 tally: tuple[str, ...] = ()) -> None:
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
        self.tally_columns = tuple(tally)
        self.keys: Any = _new_tally() if len(self.tally_columns) == 2 else None

    def write(self, table: pa.Table) -> None:
        if self.writer is None:
            where, filesystem = self.store.parquet_target(self.rel)
            self.writer = pq.ParquetWriter(where, table.schema, compression="snappy", filesystem=filesystem)
        self.writer.write_table(table)
        self.rows += table.num_rows
        self.stats.update(table)
        if self.keys is not None:
            self.keys = _add_tally(self.keys, table, self.tally_columns)

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
            TALLY_KEY: None if self.keys is None else self.keys.to_text(),
        }

    def discard(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:  # noqa: BLE001 - best effort on the failure path
                pass
        self.store.remove(self.rel)


def _new_tally() -> Any:
    from pipeline.core.rows import KeyTally

    return KeyTally()


def _add_tally(tally: Any, table: pa.Table, columns: tuple[str, ...]) -> Any:
    """``tally`` plus the keys of ``table``'s rows; None once a part cannot be tallied (a column missing, an id
    type with no agreed string form): the file then records no tally."""
    from pipeline.core.rows import KeyTally

    if any(c not in table.column_names for c in columns):
        return None
    part = KeyTally.of_keys(table[columns[0]].combine_chunks(), table[columns[1]].combine_chunks())
    return None if part is None else tally + part


def add_action(add: dict[str, Any]) -> Any:
    """A task's add action (a plain dict) as the ``deltalake`` action the commit carries: without the keys
    only this writer reads (the file's tally)."""
    from deltalake.transaction import AddAction

    return AddAction(**{k: v for k, v in add.items() if k != TALLY_KEY})


def attempt_of(rel: str) -> int | None:
    """The task attempt a data file of this writer came from (by its name), else None.

    >>> attempt_of("ds=1/part-00003-a1-3f2a9c-0123456789ab.snappy.parquet"), attempt_of("part-keyed-x.parquet")
    (1, None)
    """
    import re

    match = re.match(r"^part-\d{5}-a(\d+)-", rel.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def delete_files(store: Any, adds: Iterable[dict[str, Any]]) -> None:
    """Delete the files of these add actions (a write's own, never committed)."""
    for add in adds:
        store.remove(add["path"])


def sweep_orphans(store: Any, write_id: str, keep: set[str], *, folders: Iterable[str] | None = None) -> None:
    """Delete files this write made that no commit references (failed or speculative attempts): anywhere in
    the table folder, or only in ``folders`` (where its files went)."""
    for rel in list(store.files(containing=write_id, folders=folders)):
        if rel not in keep and _unquote_rel(rel) not in keep:
            store.remove(rel)


def to_delta_schema(schema: pa.Schema) -> pa.Schema:
    """Delta stores timestamps as microseconds UTC; Spark hands them in the session time zone."""
    return pa.schema(
        f.with_type(pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type) and f.type.tz is not None else f
        for f in schema
    )


def to_delta_types(table: pa.Table) -> pa.Table:
    """``table`` cast to :func:`to_delta_schema` (untouched when it already is)."""
    schema = to_delta_schema(table.schema)
    return table if schema == table.schema else table.cast(schema)


def split_partitions(table: pa.Table, partition_by: list[str]) -> Iterator[tuple[tuple, pa.Table]]:
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
        yield tuple(partition_string(key[c]) for c in partition_by), table.filter(mask).select(data_cols)


def partition_string(value: Any) -> str | None:
    """A partition value as the Delta log stores it (dates ISO, booleans lower case)."""
    if value is None:
        return None
    if hasattr(value, "isoformat") and not isinstance(value, str):
        return value.isoformat()
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_partitioning(table: Any, partition_by: list[str], path: str) -> None:
    """Refuse a write into a table partitioned otherwise, naming both partitionings."""
    existing = list(table.metadata().partition_columns)
    if existing != list(partition_by):
        raise ValueError(
            f"Delta table {path} is partitioned by {existing or 'nothing'} but this write is partitioned "
            f"by {partition_by or 'nothing'}; set sink.partition_by to {existing} or write to a new path"
        )


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


def _unquote_rel(rel: str) -> str:
    return unquote(rel)
