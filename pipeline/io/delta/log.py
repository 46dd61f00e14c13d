"""A Delta table's log read by hand, where delta-rs offers nothing in Python: the actions of one commit.

Each version's record is ``_delta_log/<version, 20 digits>.json``, one JSON action a line (``add``,
``remove``, ``metaData``, ``commitInfo``, ...; the Delta protocol's account of what the version did), and
the paths its ``add`` and ``remove`` actions name are URL-quoted. Three readers share this one:
the commit a write made and what it added (:mod:`pipeline.io.delta.history`), what each commit after a
stream's offset added (:mod:`pipeline.io.delta.stream_source`) and every file any version names (the
sweep, :mod:`pipeline.io.delta.sweep`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping
from urllib.parse import unquote

from pipeline.core.locations import DELTA_LOG

__all__ = ["LOG_DIR", "action_path", "entry_name", "log_entry", "parse_entry"]

LOG_DIR = DELTA_LOG  # the log folder under a table's root


def entry_name(version: int) -> str:
    """The log entry of ``version``, relative to the table's folder.

    >>> entry_name(7)
    '_delta_log/00000000000000000007.json'
    """
    return f"{LOG_DIR}/{int(version):020d}.json"


def parse_entry(raw: bytes | str) -> list[dict[str, Any]]:
    """The actions of one log entry's text (blank lines skipped).

    >>> parse_entry(b'{"commitInfo": {"operation": "WRITE"}}\\n\\n{"add": {"path": "a%20b.parquet"}}\\n')
    [{'commitInfo': {'operation': 'WRITE'}}, {'add': {'path': 'a%20b.parquet'}}]
    """
    text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def log_entry(store: Any, version: int) -> list[dict[str, Any]] | None:
    """The actions of version ``version`` of the table in ``store`` (a :class:`~pipeline.io.stores.TableStore`),
    read from its one log file; None when there is no such file (not committed yet, or cleaned up)."""
    raw = store.read_bytes(entry_name(version))
    return None if raw is None else parse_entry(raw)


def action_path(action: Mapping[str, Any]) -> str:
    """The file an ``add`` or ``remove`` action names, relative to the table's folder and unquoted.

    >>> action_path({"path": "ds=2024-01-01/part%20one.parquet"})
    'ds=2024-01-01/part one.parquet'
    """
    return unquote(action["path"])
