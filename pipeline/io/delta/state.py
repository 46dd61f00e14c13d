"""What a run knows of a Delta table from one read of its log: its version, id, schema, partitioning and the
rows each data file holds (``numRecords``), read once per table per run and shared by every check that asks.

The source's version pins what the run reads (:func:`pipeline.io.sources.pinned_versions`) and its row count
plans the tasks without a Spark job; the output's answers the shrink guard (the rows a partition holds), the
schema check and the version a keyed append compares its keys at; the quarantine's whether it exists. Read
through ``deltalake`` wherever it reaches the table (local and mounted folders, S3 with keys or an endpoint
set), whichever writer the run uses: nothing but the log is read, and no Spark job runs. Elsewhere (a catalog
table, a location only the session reaches) :func:`read_state` returns None and the callers ask Spark, as
before.

>>> s = TableState("/t", exists=True, version=3, table_id="abc", partition_columns=("ds",),
...                files=(({"ds": "2026-11-28"}, 4), ({"ds": "2026-11-29"}, 6)))
>>> s.rows(), s.rows({"ds": "2026-11-29"}), s.snapshot
(10, 6, 'delta:abc:3')
>>> TableState("/t", exists=True, version=0, files=(({}, None),)).rows() is None
True
>>> TableState("/t", exists=True, files=(({}, 4),), unreadable=("deletionVectors",)).rows() is None
True
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.core.locations import Location

__all__ = ["TableState", "UNSUPPORTED_READER_FEATURES", "read_state", "unreadable_features"]


# Reader features whose semantics a plain Parquet read would get wrong.
UNSUPPORTED_READER_FEATURES = {
    "deletionVectors": "rows deleted through deletion vectors would reappear",
    "columnMapping": "physical column names differ from the logical ones",
    "v2Checkpoint": "the snapshot cannot be resolved reliably",
}


def unreadable_features(table: Any) -> list[str]:
    """The features of the deltalake ``table`` the deltalake-backed reader cannot honour (deletion vectors,
    column mapping: what Databricks turns on by default); only the Delta connector reads such a table right."""
    features = set(table.protocol().reader_features or [])
    config = table.metadata().configuration or {}
    if config.get("delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")
    return sorted(features & set(UNSUPPORTED_READER_FEATURES))


@dataclass(frozen=True)
class TableState:
    """One read of a table's log. ``files``: each data file's partition values (as the log holds them) and rows
    (None when the file has no ``numRecords``; ``files`` None: not read); ``unreadable``: the features the
    deltalake reader cannot honour (deletion vectors, column mapping: its row counts are not the rows read)."""

    location: str
    exists: bool
    version: int | None = None
    table_id: str | None = None
    schema: Any = None
    partition_columns: tuple[str, ...] = ()
    files: tuple[tuple[Mapping[str, str | None], int | None], ...] | None = ()
    unreadable: tuple[str, ...] = ()

    def rows(self, partition: Mapping[str, Any] | None = None) -> int | None:
        """Rows in the table (in ``partition``, ``{column: value}``) by the log's counts; None when a file's
        count is missing or does not count rows. 0 when there is no table."""
        if not self.exists:
            return 0
        if self.files is None or self.unreadable:
            return None
        wanted = {c: _log_string(v) for c, v in (partition or {}).items()}
        total = 0
        for values, rows in self.files:
            if all(values.get(c) == v for c, v in wanted.items()):
                if rows is None:
                    return None
                total += rows
        return total

    @property
    def snapshot(self) -> str | None:
        """``delta:<table id>:<version>``: what identifies the content (:mod:`pipeline.io.snapshots`)."""
        return f"delta:{self.table_id}:{self.version}" if self.exists and self.table_id else None


def _log_string(value: Any) -> str | None:
    """A partition value as the log writes it (dates ISO)."""
    if value is None:
        return None
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value).lower() if isinstance(value, bool) else str(value)


def log_reachable(location: "str | Location | None") -> bool:
    """Whether ``deltalake`` reads the log at ``location`` here: a local folder, or S3 with keys or an
    endpoint set (no lookup of instance credentials)."""
    from pipeline.io.stores import configured

    if not location:
        return False
    loc = Location.of(location)
    if loc.local:
        return True
    return loc.object_store and configured(loc)


def read_state(location: "str | Location | None", *, table: str | None = None, files: bool = True) -> TableState | None:
    """The log of the Delta table at ``location``, read once; ``TableState(exists=False)`` when there is no
    table; None when it cannot be read here (a catalog ``table``, an unreachable location, a log deltalake
    refuses): the caller asks Spark instead. ``files=False``: a local table's existence only (its log unread)."""
    from deltalake.exceptions import TableNotFoundError

    from pipeline.io.stores import open_table

    if table or not log_reachable(location):
        return None
    assert location is not None
    loc = Location.of(location)
    if loc.local:
        if not loc.is_delta_table():
            return TableState(loc.raw, exists=False)
        if not files:
            return TableState(loc.raw, exists=True, files=None)
    try:
        opened = open_table(loc)
        return _state_of(loc.raw, opened)
    except TableNotFoundError:
        return TableState(loc.raw, exists=False)
    except Exception:  # noqa: BLE001 - a log deltalake cannot read: Spark answers instead
        return None


def _state_of(location: str, opened: Any) -> TableState:
    import pyarrow as pa

    metadata = opened.metadata()
    partitions = tuple(metadata.partition_columns)
    actions = pa.table(opened.get_add_actions(flatten=True)).to_pylist()
    files = tuple(({c: _log_string(a.get(f"partition.{c}")) for c in partitions},
                   None if a.get("num_records") is None else int(a["num_records"])) for a in actions)
    return TableState(location, exists=True, version=opened.version(), table_id=metadata.id,
                      schema=opened.schema(), partition_columns=partitions, files=files,
                      unreadable=tuple(unreadable_features(opened)))
