"""The sweep of crash leftovers in a Delta table folder written by ``sbi_delta``.

A write is **dead** when its marker (:mod:`pipeline.io.delta.markers`) is ``finished`` or
``claimed``; when it is ``running`` and its heartbeat is older than the grace, or its process (on
this host) is gone; when it is ``committing`` and either its commit is in the log or its heartbeat
is older than the grace. A file whose write has no marker is never deleted: nothing proves it ours
(its name alone does not); the sweep names it in ``unproven`` and leaves it. Markers of dead writes
are kept for ``MARKER_RETENTION_S`` (7 days) so that a straggler's file finds its write's proof.
**Leftovers** are the Parquet files of dead writes that no Delta version references (no ``add`` or
``remove`` in any commit file or checkpoint, not in the current snapshot). Files whose name carries
no write id, files of live writes and files any version references (time travel: Delta's own
``vacuum`` handles those) are never touched.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from pipeline.io.delta.log import LOG_DIR, action_path, parse_entry
from pipeline.io.delta.markers import (MARKER_DIR, MARKER_RETENTION_S, STATES, finish_marker, is_our_marker, local_root,
                                       marker_path, owner_gone, read_marker, remote_store, write_id_of)

from pipeline.io.delta.options import WRITE_ID_KEY
from pipeline.core.locations import has_delta_log

__all__ = ["REMOTE_SWEEP", "SWEPT_STAMP", "SweepReport", "sweep_due", "sweep_leftovers", "table_data_files"]

# in the marker folder: its modification time is when a commit last swept the table (a file, not a marker)
SWEPT_STAMP = "_swept"

# an object store has no atomic rename to claim a dead write's marker by, and no local pid to check
REMOTE_SWEEP = ("not swept on an object store: a crashed write's files stay (no version references them, "
                "no reader sees them) until a sweep on a local mount or DeltaTable.vacuum(full=True)")


@dataclass
class SweepReport:
    """What a sweep removed (or, with ``dry_run``, would remove)."""

    files: list[str] = field(default_factory=list)
    bytes: int = 0
    markers: list[str] = field(default_factory=list)
    live_writes: list[str] = field(default_factory=list)
    # files named like ours whose write left no marker of ours: nothing proves them ours, so they stay
    unproven: list[str] = field(default_factory=list)
    skipped: str = ""  # why no sweep ran (an object store)
    # the log files (commit entries and checkpoints) the sweep read to learn which files a version references
    log_entries: int = 0

    def line(self) -> str:
        unproven = (f"; {len(self.unproven)} file(s) named like ours but with no marker of ours left alone"
                    if self.unproven else "")
        return (f"{len(self.files)} leftover file(s), {self.bytes / 1e6:.1f} MB; {len(self.markers)} marker(s); "
                f"{len(self.live_writes)} write(s) still running left alone{unproven}")


def _log_facts(root: Path) -> tuple[set[str], set[str], int]:
    """(every path any ``add``/``remove`` in the log or a checkpoint names, write ids of commits, log files read)."""
    referenced: set[str] = set()
    committed: set[str] = set()
    log = root / LOG_DIR
    read = 0
    if not log.is_dir():
        return referenced, committed, read
    for entry in log.iterdir():
        read += entry.suffix in (".json", ".parquet")
        if entry.suffix == ".json" and entry.stem.isdigit():
            for action in parse_entry(entry.read_bytes()):
                referenced.update(action_path(action[kind]) for kind in ("add", "remove") if kind in action)
                info = action.get("commitInfo")
                if info and info.get(WRITE_ID_KEY):
                    committed.add(str(info[WRITE_ID_KEY]))
        elif ".checkpoint" in entry.name and entry.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(entry, columns=["add", "remove"])
            for kind in ("add", "remove"):
                referenced.update(action_path(item) for item in table[kind].to_pylist() if item and item.get("path"))
    return referenced, committed, read


def _current_files(root: Path) -> set[str]:
    if not has_delta_log(root):
        return set()
    from deltalake import DeltaTable

    paths = DeltaTable(str(root)).get_add_actions(flatten=True).column("path").to_pylist()
    return {unquote(p) for p in paths}


def table_data_files(root: str | Path) -> list[Path]:
    """The Parquet files of the table at ``root``: never inside a folder that holds another table.

    A quarantine or runs table kept inside the output folder (``<sink.path>/quarantine``) has its own
    ``_delta_log``; its files are that table's, and a sweep of the outer table must not judge them.
    Folders starting with ``_`` or ``.`` (the log, markers, Spark's staging) are skipped too.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for rel in ("ds=1/a.parquet", "inner/_delta_log/0.json", "inner/b.parquet", "_tmp/c.parquet"):
    ...     (root / rel).parent.mkdir(parents=True, exist_ok=True); _ = (root / rel).write_text("")
    >>> [p.relative_to(root).as_posix() for p in table_data_files(root)]
    ['ds=1/a.parquet']
    """
    root = Path(root)
    found: list[Path] = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", "."))
                         and not has_delta_log(here / d))
        found.extend(here / n for n in sorted(names) if n.endswith(".parquet"))
    return found


def _writes_found(root: Path, keep_write_ids: frozenset[str]) -> tuple[dict[str, list[Path]],
                                                                     dict[str, tuple[str, Path]]]:
    """``(data files by write id, (state, marker) by write id)`` under ``root``, the kept writes left out."""
    files: dict[str, list[Path]] = {}
    for file in table_data_files(root):
        write_id = write_id_of(file.name)
        if write_id and write_id not in keep_write_ids:
            files.setdefault(write_id, []).append(file)
    markers: dict[str, tuple[str, Path]] = {}
    marker_dir = root / MARKER_DIR
    if marker_dir.is_dir():
        for entry in marker_dir.iterdir():
            write_id, _, state = entry.name.rpartition(".")
            if state in STATES and write_id not in keep_write_ids and entry.is_file() and is_our_marker(entry):
                markers[write_id] = (state, entry)
    return files, markers


def _close(root: Path, write_id: str, markers: dict[str, tuple[str, Path]], *, dry_run: bool) -> None:
    """A dead write's ``claimed`` or ``committing`` marker made ``finished`` (still the proof its files are ours,
    kept as long): no later commit takes it for a torn write (:func:`sweep_due`) and sweeps again for it."""
    state, path = markers.get(write_id, ("", None))
    if dry_run or state not in ("claimed", "committing") or path is None:
        return
    try:
        last_heard = path.stat().st_mtime
    except FileNotFoundError:
        return
    finish_marker(root, write_id, closed_by_sweep=state)
    closed = marker_path(root, write_id, "finished")
    os.utime(closed, (last_heard, last_heard))  # its age stays the write's: retention counts from its last sign
    markers[write_id] = ("finished", closed)


def sweep_due(root: Any, *, own: str, grace_s: float) -> str | None:
    """Why a commit of write ``own`` should sweep the table at ``root`` now; None when nothing asks for it.

    A sweep reads every entry of the table's log, so a commit runs one only when its markers say some write
    did not finish (``running``, ``committing`` or ``claimed``: a write torn by a crash, or one running beside
    this one), or when the last sweep (``_sbi_jobs/_swept``) is older than the grace (a leftover nothing marks:
    a speculative attempt's, a file named like ours with no marker), or when other writes finished and no
    commit swept yet. One listing of the marker folder's names; nothing read. On an object store, where
    :func:`sweep_leftovers` only says why it does not sweep, it is always due.
    """
    if remote_store(root) is not None:
        return "an object store"
    folder = Path(local_root(root)) / MARKER_DIR
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None
    others = False
    for name in names:
        write_id, _, state = name.rpartition(".")
        if write_id == own or state not in STATES:
            continue
        if state != "finished":
            return f"write {write_id} is {state}"
        others = True
    try:
        age = time.time() - (folder / SWEPT_STAMP).stat().st_mtime
    except FileNotFoundError:
        return "other writes finished since the table was made, and no commit swept it" if others else None
    return f"the last sweep was {age:,.0f} s ago (grace {grace_s:g} s)" if age > grace_s else None


def stamp_swept(root: Any) -> None:
    """Record that a commit swept the table at ``root`` now (:func:`sweep_due` reads it)."""
    if remote_store(root) is not None:
        return
    stamp = Path(local_root(root)) / MARKER_DIR / SWEPT_STAMP
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.touch()
    os.utime(stamp)


def sweep_leftovers(root: Any, *, grace_s: float, dry_run: bool = False,
                    keep_write_ids: frozenset[str] = frozenset(),
                    marker_retention_s: float = MARKER_RETENTION_S) -> SweepReport:
    """Delete the Parquet files of dead writes that no Delta version references, and old dead markers.

    ``keep_write_ids``: writes never to judge (the caller's own). A dead write's marker is removed once
    older than ``marker_retention_s`` (and the grace). Safe beside concurrent writers:
    a live write is never touched, and a ``running`` write is claimed (atomically) before any of its
    files goes, so it can no longer commit them.
    """
    if remote_store(root) is not None:
        return SweepReport(skipped=REMOTE_SWEEP)
    root = Path(local_root(root))
    report = SweepReport()
    if not root.is_dir():
        return report
    now = time.time()
    files, markers = _writes_found(root, keep_write_ids)
    referenced, committed, report.log_entries = _log_facts(root)
    referenced |= _current_files(root)

    def mtime(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return now

    dead: set[str] = set()
    for write_id in set(files) | set(markers):
        state, marker = markers.get(write_id, (None, None))
        if state in ("finished", "claimed"):
            dead.add(write_id)
        elif state == "running":
            stale = now - mtime(marker) > grace_s
            if stale or owner_gone(read_marker(marker)):
                if dry_run:
                    dead.add(write_id)
                    continue
                claimed = marker_path(root, write_id, "claimed")
                try:  # the same atomic rename the commit uses: exactly one of the two wins
                    os.rename(marker, claimed)
                    markers[write_id] = ("claimed", claimed)
                    dead.add(write_id)
                except FileNotFoundError:
                    report.live_writes.append(write_id)
            else:
                report.live_writes.append(write_id)
        elif state == "committing":
            if write_id in committed or now - mtime(marker) > grace_s:
                dead.add(write_id)
            else:
                report.live_writes.append(write_id)
        else:  # no marker of ours names this write: its files are not proven ours, whatever their name
            report.unproven += [f.relative_to(root).as_posix() for f in files.get(write_id, [])]
    for write_id in sorted(dead):
        _close(root, write_id, markers, dry_run=dry_run)
        for file in files.get(write_id, []):
            rel = file.relative_to(root).as_posix()
            if rel in referenced or unquote(rel) in referenced:
                continue
            size = file.stat().st_size if file.exists() else 0
            if not dry_run:
                try:
                    os.remove(file)
                except FileNotFoundError:
                    continue
            report.files.append(rel)
            report.bytes += size
        if write_id in markers and now - mtime(markers[write_id][1]) > max(grace_s, marker_retention_s):
            if not dry_run:
                try:
                    os.remove(markers[write_id][1])
                except FileNotFoundError:
                    continue
            report.markers.append(markers[write_id][1].name)
    return report

