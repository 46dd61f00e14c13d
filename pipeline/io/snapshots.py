"""The identity of what a run read: a source snapshot, cheap to know on the driver, that the run key
(:func:`pipeline.config.identity.run_key`) rests on, and what changed when a Delta source was rebuilt.

A table dropped and rebuilt starts at version 0 again under a new table id: a new input, never
mistaken for the old one.
"""

from __future__ import annotations

import hashlib
import json
import os

from pipeline.config import SourceConfig
from pipeline.io.delta.state import read_state

__all__ = ["source_rebuilt", "source_snapshot"]


def source_rebuilt(before: str | None, now: str | None) -> str | None:
    """What changed when a Delta source's table id changed between two snapshots, else None.

    >>> source_rebuilt("delta:aaaa1111:3", "delta:bbbb2222:0")
    'table id aaaa1111 -> bbbb2222 (version 3 -> 0)'
    >>> source_rebuilt("delta:aaaa1111:3", "delta:aaaa1111:4") is None
    True
    """
    parts = [str(x).split(":") for x in (before, now)]
    if any(len(p) != 3 or p[0] != "delta" for p in parts) or parts[0][1] == parts[1][1]:
        return None
    (_, old_id, old_v), (_, new_id, new_v) = parts
    return f"table id {old_id} -> {new_id} (version {old_v} -> {new_v})"


def source_snapshot(source: SourceConfig) -> str | None:
    """What identifies the source's content, where it can be known cheaply on the driver.

    A local Delta source: ``delta:<table id>:<version>`` (a table dropped and rebuilt starts at version 0
    again under a new id: a new input, never mistaken for the old one). A local file source (parquet, json, text,
    binary_file): ``files:<hash of names, sizes and mtimes>``. A Delta source on S3 whose keys or endpoint the environment names: its version too.
    A catalog table or another remote URI:
    None (unknown; the run key then rests on the config, the model revision and ``ds``).
    """
    loc = source.location
    if loc is None:
        return None
    if source.format == "delta":  # its log, where deltalake reads it here (local, S3 with keys or an endpoint)
        state = read_state(loc)
        return state.snapshot if state is not None else None
    if not loc.local:
        return None
    path = loc.path
    listing = []
    if os.path.isfile(path):
        stat = os.stat(path)
        listing.append((os.path.basename(path), stat.st_size, stat.st_mtime_ns))
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            if name.startswith((".", "_")):
                continue
            stat = os.stat(os.path.join(folder, name))
            listing.append((os.path.relpath(os.path.join(folder, name), path), stat.st_size, stat.st_mtime_ns))
    if not listing:
        return None
    return "files:" + hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:32]
