"""Row keys at commit time for the deltalake writer: what other commits took since a run read its keys.

A keyed write (an append keyed on ``(id, ds)``, an incremental run keyed on ``(id, content_hash,
task_fingerprint)``) left out, before scoring, the keys the table held at the version it read.
Another run that committed since then may have written some of the same keys (two overlapping
nightly runs, a backfill during the nightly run). Before its own commit the writer therefore:

1. lists the data files added since the version it read (:func:`files_added_since`): a file added
   and removed again in between is not there, its rows are gone;
2. reads their key columns only, and drops those keys from its own staged files
   (:func:`drop_taken`), rewriting just the files that hold one;
3. commits with a conflict token (:func:`key_token`) in the transaction: delta-rs rejects the commit
   when a commit that carries the same token landed after the version checked, and the writer
   checks again from there. So each key is written once, whichever run commits first.

Key values compare as Arrow values; partition columns (``ds``) compare as the strings the Delta log
stores. Null keys never match (the output holds no null ids: they are quarantined).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["key_token", "files_added_since", "taken_keys", "drop_taken"]

TOKEN_PREFIX = "sbi.keys"


def key_token(key_columns: Sequence[str], partition_values: dict[str, Any]) -> str:
    """The conflict token of a keyed commit: one per value of the partition columns in the key.

    Two runs whose keys could collide carry the same token; runs on other days do not block each other.

    >>> key_token(["id", "ds"], {"ds": "2026-11-30"})
    'sbi.keys:ds=2026-11-30'
    >>> key_token(["id", "content_hash", "task_fingerprint"], {"ds": "2026-11-30"})
    'sbi.keys'
    """
    parts = [f"{c}={partition_values.get(c)}" for c in key_columns if c in partition_values]
    return TOKEN_PREFIX + (":" + ",".join(parts) if parts else "")


def files_added_since(table: Any, store: Any, base_version: int | None) -> list[dict[str, Any]]:
    """Data files in ``table``'s snapshot that the snapshot at ``base_version`` did not have, as
    ``{"path": <relative, unquoted>, "partition_values": {...}}``. ``base_version`` None (no table when
    the run read its keys): every file. A base version whose log is gone: every file too (safe).
    ``store``: the table's :class:`~pipeline.io.stores.TableStore` (local or S3)."""
    store = _as_store(store)
    before: set[str] = set()
    if base_version is not None and base_version >= 0:
        try:
            before = {unquote(a["path"]) for a in _add_actions(store.table(version=base_version))}
        except Exception:  # noqa: BLE001 - log cleaned up past that version: compare against every file
            before = set()
    added = []
    for action in _add_actions(table):
        rel = unquote(action["path"])
        if rel not in before:
            added.append({"path": rel, "partition_values": dict(action.get("partition") or {})})
    return added


def _add_actions(table: Any) -> list[dict[str, Any]]:
    actions = pa.table(table.get_add_actions(flatten=False))
    return actions.select([c for c in ("path", "partition") if c in actions.column_names]).to_pylist()


def taken_keys(store: Any, files: Iterable[dict[str, Any]], key_columns: Sequence[str],
               partition_by: Sequence[str]) -> dict[tuple, pa.Table]:
    """The key columns of ``files``, grouped by the values of the key's partition columns."""
    store = _as_store(store)
    part_keys = [c for c in key_columns if c in partition_by]
    data_keys = [c for c in key_columns if c not in partition_by]
    groups: dict[tuple, list[pa.Table]] = defaultdict(list)
    for file in files:
        values = file["partition_values"]
        group = tuple(_as_str(values.get(c)) for c in part_keys)
        if not store.exists(file["path"]):
            continue
        keys = store.read_parquet(file["path"], columns=data_keys)
        if keys.num_rows:
            groups[group].append(keys)
    return {g: pa.concat_tables(tables, promote_options="permissive") for g, tables in groups.items()}


def drop_taken(store: Any, adds: list[dict[str, Any]], taken: dict[tuple, pa.Table],
               key_columns: Sequence[str], partition_by: Sequence[str],
               rewrite: Any) -> tuple[list[dict[str, Any]], int]:
    """``adds`` without the rows whose key is in ``taken``; and how many rows were dropped.

    A staged file holding no taken key is kept as it is; one that does is rewritten by
    ``rewrite(partition_values, table) -> add action | None`` (None: no row left), and its old file
    is left to the caller's orphan sweep.
    """
    if not taken:
        return adds, 0
    store = _as_store(store)
    part_keys = [c for c in key_columns if c in partition_by]
    data_keys = [c for c in key_columns if c not in partition_by]
    kept: list[dict[str, Any]] = []
    dropped = 0
    for add in adds:
        group = tuple(_as_str(add["partition_values"].get(c)) for c in part_keys)
        theirs = taken.get(group)
        if theirs is None:
            kept.append(add)
            continue
        mine = store.read_parquet(unquote(add["path"]), columns=data_keys)
        hit = _rows_with_keys(mine, theirs, data_keys)
        if not len(hit):
            kept.append(add)
            continue
        rows = store.read_parquet(unquote(add["path"]))
        keep = pc.invert(pc.is_in(pa.array(range(rows.num_rows), pa.int64()), value_set=hit))
        rows = rows.filter(keep)
        dropped += len(hit)
        if rows.num_rows:
            new = rewrite(add["partition_values"], rows)
            if new is not None:
                kept.append(new)
    return kept, dropped


def _rows_with_keys(mine: pa.Table, theirs: pa.Table, data_keys: Sequence[str]) -> pa.Array:
    """Row numbers of ``mine`` whose key columns equal some row of ``theirs``."""
    theirs = theirs.select(list(data_keys))
    theirs = theirs.cast(pa.schema([mine.schema.field(c) for c in data_keys]))
    indexed = mine.append_column("_sbi_row", pa.array(range(mine.num_rows), pa.int64()))
    hits = indexed.join(theirs.group_by(list(data_keys)).aggregate([]), keys=list(data_keys),
                        join_type="left semi")
    return hits["_sbi_row"].combine_chunks()


def _as_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _as_store(store: Any) -> Any:
    """A :class:`~pipeline.io.stores.TableStore`; a plain local path is made one."""
    from pipeline.io.stores import TableStore, table_store

    return store if isinstance(store, TableStore) else table_store(str(store))
