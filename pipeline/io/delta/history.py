"""A Delta table's history, read the same way for both writers: which commit a write made, and whether a
run already committed (its transaction id, the run key of :func:`pipeline.config.identity.run_key`).

Local tables and S3 are read through deltalake (:func:`consistent_history`, whose versions stay right
while other jobs commit); a catalog table or a location only the session reaches is read through the
connector's ``DESCRIBE HISTORY``. Never a table's latest version: a concurrent commit (another job, the
other day's run) may have landed on top of a write, and reading that version back would miss its rows.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.io.delta.log import log_entry
from pipeline.io.delta.options import APP_ID_KEY, KEYS_KEY, WRITE_ID_KEY
from pipeline.io.sources import has_delta_connector
from pipeline.io.stores import open_table
from pipeline.core.locations import Location

__all__ = [
    "CommitEntry", "commit_entry", "commit_metadata", "committed_run", "committed_run_via", "connector_commit", "connector_commits",
    "connector_version", "consistent_history", "deltalake_table_version", "deltalake_version",
]


def commit_metadata(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A commit's ``sbi.*`` keys from either writer: top-level commitInfo keys (deltalake) or the JSON
    ``userMetadata`` string the connector records (``option("userMetadata", ...)``).

    >>> commit_metadata({"sbi.run_id": "r1", "userMetadata": '{"sbi.app_id": "a", "other": 1}', "version": 3})
    {'sbi.run_id': 'r1', 'sbi.app_id': 'a'}
    """
    found = {k: v for k, v in entry.items() if str(k).startswith("sbi.")}
    raw = entry.get("userMetadata")
    if isinstance(raw, str) and raw.startswith("{"):
        try:
            found.update({k: v for k, v in json.loads(raw).items() if str(k).startswith("sbi.")})
        except ValueError:
            pass
    return found


@dataclass(frozen=True)
class CommitEntry:
    """What one commit's own log entry (``_delta_log/<version>.json``) says it added: the rows of its add
    actions (None when a file has no ``numRecords``) and the key tally its writer recorded (None: none)."""

    version: int
    rows_added: int | None
    keys_added: Any
    # the commit's operation metrics (the connector's: numOutputRows, a MERGE's numTargetRowsInserted...)
    metrics: Mapping[str, Any] | None = None


def entry_facts(version: int, actions: list[dict[str, Any]]) -> CommitEntry:
    """:class:`CommitEntry` of a log entry's ``actions``."""
    from pipeline.core.rows import KeyTally

    rows: int | None = 0
    for action in actions:
        add = action.get("add")
        if add is None:
            continue
        try:
            count = json.loads(add.get("stats") or "{}").get("numRecords")
        except ValueError:
            count = None
        rows = None if rows is None or count is None else rows + int(count)
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    keys = KeyTally.from_text(info.get(KEYS_KEY)) if info.get(KEYS_KEY) else None
    return CommitEntry(version, rows, keys, dict(info.get("operationMetrics") or {}))


def commit_entry(store: Any, write_id: str, *, after: int | None, limit: int = 50) -> CommitEntry | None:
    """The log entry of the commit carrying ``write_id``: the first of the versions after ``after`` (the
    version the commit read the table at; None: it created the table) whose commit info names it. Reads one
    entry, a few more when other commits landed in between; None when none of ``limit`` names it."""
    version = 0 if after is None else int(after) + 1
    for _ in range(limit):
        actions = log_entry(store, version)
        if actions is None:
            return None
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if commit_metadata(info).get(WRITE_ID_KEY) == write_id:  # either writer's (the connector's userMetadata)
            return entry_facts(version, actions)
        version += 1
    return None


def consistent_history(path: str, *, limit: int | None = None, table: Any = None) -> list[dict[str, Any]]:
    """``DeltaTable(path).history(limit)`` with versions that are right while other jobs commit
    (``path``: a local folder or an S3 URI).

    deltalake labels the commit infos it lists by counting down from the version the table
    object was loaded at, but lists commits that landed after the load too: a commit made by
    another job in between shifts every label by one (measured on deltalake 1.6: a table loaded
    at version 1 reported versions 1, 0, -1 for the commits 2, 1, 0). A listing is kept only
    when a fresh load afterwards is at the version the listing starts from.
    """
    for _ in range(50):
        table = table or open_table(path)
        entries = table.history(limit)
        top = entries[0]["version"] if entries else table.version()
        if top == table.version() == open_table(path).version():
            return entries
        table = None
    raise RuntimeError(f"could not read a stable history of {path}: it kept changing during 50 reads")


def deltalake_version(path: str, write_id: str) -> int | None:
    """The version of the commit carrying ``write_id`` (None if it is not in recent history)."""
    for entry in consistent_history(path, limit=50):  # a local path or an S3 URI
        if commit_metadata(entry).get(WRITE_ID_KEY) == write_id:
            return int(entry["version"])
    return None


def deltalake_table_version(path: str) -> int | None:
    """The current version of the Delta table at ``path`` read through deltalake; None when there is none."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_table(path).version()
    except TableNotFoundError:
        return None


def committed_run(path: "str | Location", app_id: str) -> tuple[int, str | None] | None:
    """``(version, run id)`` of the commit carrying transaction ``app_id`` in the local Delta table at ``path``.

    None when the table does not exist or holds no such transaction. A keyed connector append (an
    insert-only MERGE) records no transaction action, only ``sbi.app_id`` in its commit info: without
    the action the last 1,000 commits are searched for it.
    """
    from deltalake.exceptions import TableNotFoundError

    loc = Location.of(path)
    if not app_id or (not loc.object_store and not os.path.isdir(loc.raw)):
        return None
    try:
        table = open_table(path)
    except TableNotFoundError:
        return None
    recorded = table.transaction_version(app_id) is not None
    for entry in consistent_history(path, table=table, limit=None if recorded else 1000):
        meta = commit_metadata(entry)
        if meta.get(APP_ID_KEY) == app_id:
            return int(entry["version"]), meta.get("sbi.run_id")
    return (table.version(), None) if recorded else None


def connector_commits(spark: Any, name: str, needle: str, *,
                      limit: int) -> list[tuple[int, dict[str, Any], dict[str, str]]]:
    """``(version, sbi.* metadata, operation metrics)`` of the last ``limit`` commits of ``name`` whose
    userMetadata holds ``needle``, newest first, read through the connector; [] when there is no such table."""
    from pyspark.sql import functions as F

    try:
        rows = (spark.sql(f"DESCRIBE HISTORY {name} LIMIT {int(limit)}")
                .where(F.col("userMetadata").contains(needle))
                .select("version", "userMetadata", "operationMetrics").collect())
    except Exception:  # noqa: BLE001 - no table (nothing committed) or no history
        return []
    return sorted(((int(r["version"]), commit_metadata(r.asDict()), dict(r["operationMetrics"] or {}))
                   for r in rows), key=lambda c: -c[0])


def connector_commit(spark: Any, table: str | None, target: str, key: str, value: str,
                     *, limit: int = 100) -> tuple[int, dict[str, str]] | None:
    """``(version, operation metrics)`` of the commit whose ``userMetadata`` carries ``key: value``, read
    through the connector (one history read); None when the last ``limit`` commits hold none."""
    name = table or f"delta.`{target}`"
    return next(((v, metrics) for v, meta, metrics in connector_commits(spark, name, value, limit=limit)
                 if str(meta.get(key)) == value), None)


def connector_version(spark: Any, table: str | None, target: str, key: str, value: str,
                      *, limit: int = 100) -> int | None:
    """The version of the commit whose ``userMetadata`` carries ``key: value``, read through the connector.

    Never the table's latest version: a concurrent commit (another job, the other day's run) may
    have landed on top of this write, and reading that version back would miss this run's rows.
    """
    found = connector_commit(spark, table, target, key, value, limit=limit)
    return found[0] if found else None


def committed_run_via(spark: Any, location: "str | Location", app_id: str) -> tuple[int, str | None] | None:
    """:func:`committed_run` for any location the session reaches: local tables through deltalake,
    the rest (``s3a://``, a catalog table) through the connector's history."""
    if not app_id:
        return None
    loc = Location.of(location)
    if loc.local:
        return committed_run(loc.path or "", app_id)
    if loc.object_store and not has_delta_connector(spark):
        return committed_run(loc, app_id)
    found = [(v, meta) for v, meta, _ in connector_commits(spark, f"delta.`{location}`", app_id, limit=1000)
             if meta.get(APP_ID_KEY) == app_id]
    return (found[0][0], found[0][1].get("sbi.run_id")) if found else None
