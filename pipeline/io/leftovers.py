"""Write markers and the sweep of crash leftovers in a Delta table folder written by ``sbi_delta``.

Every write of the deltalake writer has a write id; its Parquet files carry it in
their names (``part-00003-a0-<write id>-<12 hex>.snappy.parquet``) and its commit
carries it in the commit info (``sbi.write_id``). The Python process that starts
the write keeps a marker ``_sbi_jobs/<write id>.<state>`` in the table folder:

``running``     created before any file is written; its mtime is a heartbeat, refreshed
                while the write runs; the content says host, pid, start time, table version
``committing``  the commit (in Spark's driver-side Python worker) took it over from
                ``running`` by an atomic rename, just before committing
``claimed``     a sweep took it over from a dead ``running`` by the same atomic rename:
                the write can never commit any more (its commit finds no ``running``)
``finished``    the commit or the abort is done

A write is **dead** when its marker is ``finished`` or ``claimed``; when it is
``running`` and its heartbeat is older than the grace, or its process (on this
host) is gone; when it is ``committing`` and either its commit is in the log or
its heartbeat is older than the grace. A file whose write has no marker is never
deleted: nothing proves it ours (its name alone does not); the sweep names it in
``unproven`` and leaves it. Markers of dead writes are kept for
``MARKER_RETENTION_S`` (7 days) so that a straggler's file finds its write's proof.
**Leftovers** are the Parquet files of dead writes that no Delta version
references (no ``add`` or ``remove`` in any commit file or checkpoint, not in the
current snapshot). Files whose name carries no write id, files of live writes and
files any version references (time travel: Delta's own ``vacuum`` handles those)
are never touched. A marker goes only when its content is one this module wrote
(the owner fields of :func:`_owner`), whatever its name.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

__all__ = ["MARKER_DIR", "REMOTE_SWEEP", "SweepReport", "claim_for_commit", "finish_marker", "is_given_up", "running_marker",
           "sweep_leftovers", "table_data_files", "write_id_of"]

MARKER_DIR = "_sbi_jobs"
STATES = ("running", "committing", "claimed", "finished")
# an object store has no atomic rename to claim a dead write's marker by, and no local pid to check
REMOTE_SWEEP = ("not swept on an object store: a crashed write's files stay (no version references them, "
                "no reader sees them) until a sweep on a local mount or DeltaTable.vacuum(full=True)")
# a dead write's marker is the proof its files are ours: kept a week, far past any straggler attempt
MARKER_RETENTION_S = 7 * 24 * 3600.0
_FILE_NAME = re.compile(r"^part-\d{5}-a\d+-(?P<write_id>.+)-[0-9a-f]{12}\.snappy\.parquet$")


def write_id_of(name: str) -> str | None:
    """The write id in a data file name written by ``sbi_delta``, else None.

    >>> write_id_of("part-00003-a1-3f2a9c-0123456789ab.snappy.parquet")
    '3f2a9c'
    >>> write_id_of("part-00000-ea0c89cc-1967-4658-91dd-6eaf95683cb7-c000.snappy.parquet") is None
    True
    """
    match = _FILE_NAME.match(name)
    return match.group("write_id") if match else None


def _marker(root: str | Path, write_id: str, state: str) -> Path:
    return Path(root) / MARKER_DIR / f"{write_id}.{state}"


def _state_of(root: str | Path, write_id: str) -> tuple[str, Path] | None:
    for state in STATES:
        path = _marker(root, write_id, state)
        if path.exists():
            return state, path
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_gone(info: dict[str, Any]) -> bool:
    """Whether the process that started a write is known to be dead (same host, pid gone)."""
    return info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) and not _pid_alive(info["pid"])


@contextmanager
def running_marker(root: Any, write_id: str, *, table_version: int | None, heartbeat_s: float) -> Iterator[Any]:
    """``_sbi_jobs/<write_id>.running`` for the duration of a write, its mtime refreshed every ``heartbeat_s``.

    On exit a marker still ``running`` (the write ended without reaching commit or abort) becomes ``finished``.
    ``root``: a local table folder, or a :class:`~pipeline.io.stores.TableStore` (on S3 the heartbeat
    rewrites the marker object).
    """
    store = _remote(root)
    if store is not None:
        with _remote_running(store, write_id, table_version=table_version, heartbeat_s=heartbeat_s) as marker:
            yield marker
        return
    root = _local(root)
    path = _marker(root, write_id, "running")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_owner(table_version)))

    def beat() -> None:
        for state in ("running", "committing"):
            try:
                os.utime(_marker(root, write_id, state))
                break
            except FileNotFoundError:
                continue

    try:
        with _heartbeat(beat, every=heartbeat_s, write_id=write_id):
            yield path
    finally:
        try:
            os.rename(path, _marker(root, write_id, "finished"))
        except FileNotFoundError:
            pass


def claim_for_commit(root: Any, write_id: str) -> dict[str, Any]:
    """Take ``running`` over to ``committing`` (atomic rename); returns the marker's content.

    Raises ``RuntimeError`` when the write can no longer commit: its marker was claimed by a
    sweep, or the process that started it is gone.
    """
    store = _remote(root)
    if store is not None:
        return _remote_claim(store, write_id)
    root = _local(root)
    running = _marker(root, write_id, "running")
    info = _read_json(running)
    if owner_gone(info):
        raise RuntimeError(f"write {write_id} was started by process {info.get('pid')}, which is gone; "
                           "committing nothing (a rerun of the job writes its rows)")
    try:
        os.rename(running, _marker(root, write_id, "committing"))
    except FileNotFoundError:
        state = _state_of(root, write_id)
        raise RuntimeError(
            f"write {write_id} was given up ({state[0] if state else 'no marker'}) by a leftover sweep "
            "that found its process dead or silent; committing nothing (a rerun of the job writes its rows)"
        ) from None
    return info


def finish_marker(root: Any, write_id: str, **facts: Any) -> None:
    """Mark a write ``finished`` (from any state), recording ``facts`` (version, sweep counts) in it."""
    store = _remote(root)
    if store is not None:
        _remote_finish(store, write_id, facts)
        return
    root = _local(root)
    target = _marker(root, write_id, "finished")
    target.parent.mkdir(parents=True, exist_ok=True)
    current = _state_of(root, write_id)
    info = _read_json(current[1]) if current else {}
    if not {"host", "pid"} <= set(info):  # the owner fields are what lets a sweep remove this marker later
        info = {**_owner(info.get("table_version")), **info}
    info.update(facts)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(info, default=str))
    os.replace(tmp, target)
    for state in ("running", "committing", "claimed"):
        try:
            os.remove(_marker(root, write_id, state))
        except FileNotFoundError:
            pass


def finished_facts(root: Any, write_id: str) -> dict[str, Any]:
    store = _remote(root)
    if store is not None:
        return store.read_json(_rel(write_id, "finished"))
    return _read_json(_marker(_local(root), write_id, "finished"))


def is_given_up(root: Any, write_id: str) -> bool:
    """Whether nobody will ever commit this write's files any more (a straggler takes its file back)."""
    store = _remote(root)
    if store is not None:
        return store.exists(_rel(write_id, "finished"))
    root = _local(root)
    return _marker(root, write_id, "finished").exists() or _marker(root, write_id, "claimed").exists()


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

    def line(self) -> str:
        unproven = (f"; {len(self.unproven)} file(s) named like ours but with no marker of ours left alone"
                    if self.unproven else "")
        return (f"{len(self.files)} leftover file(s), {self.bytes / 1e6:.1f} MB; {len(self.markers)} marker(s); "
                f"{len(self.live_writes)} write(s) still running left alone{unproven}")


def _log_facts(root: Path) -> tuple[set[str], set[str]]:
    """(every path any ``add``/``remove`` in the log or a checkpoint names, write ids of commits)."""
    referenced: set[str] = set()
    committed: set[str] = set()
    log = root / "_delta_log"
    if not log.is_dir():
        return referenced, committed
    for entry in log.iterdir():
        if entry.suffix == ".json" and entry.stem.isdigit():
            for line in entry.read_text().splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                for kind in ("add", "remove"):
                    if kind in action:
                        referenced.add(unquote(action[kind]["path"]))
                info = action.get("commitInfo")
                if info and info.get("sbi.write_id"):
                    committed.add(str(info["sbi.write_id"]))
        elif ".checkpoint" in entry.name and entry.suffix == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(entry, columns=["add", "remove"])
            for kind in ("add", "remove"):
                for item in table[kind].to_pylist():
                    if item and item.get("path"):
                        referenced.add(unquote(item["path"]))
    return referenced, committed


def _current_files(root: Path) -> set[str]:
    if not (root / "_delta_log").is_dir():
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
                         and not (here / d / "_delta_log").is_dir())
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
            if state in STATES and write_id not in keep_write_ids and entry.is_file() and _is_our_marker(entry):
                markers[write_id] = (state, entry)
    return files, markers


def sweep_leftovers(root: Any, *, grace_s: float, dry_run: bool = False,
                    keep_write_ids: frozenset[str] = frozenset(),
                    marker_retention_s: float = MARKER_RETENTION_S) -> SweepReport:
    """Delete the Parquet files of dead writes that no Delta version references, and old dead markers.

    ``keep_write_ids``: writes never to judge (the caller's own). A dead write's marker is removed once
    older than ``marker_retention_s`` (and the grace). Safe beside concurrent writers:
    a live write is never touched, and a ``running`` write is claimed (atomically) before any of its
    files goes, so it can no longer commit them.
    """
    if _remote(root) is not None:
        return SweepReport(skipped=REMOTE_SWEEP)
    root = Path(_local(root))
    report = SweepReport()
    if not root.is_dir():
        return report
    now = time.time()
    files, markers = _writes_found(root, keep_write_ids)
    referenced, committed = _log_facts(root)
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
            if stale or owner_gone(_read_json(marker)):
                if dry_run:
                    dead.add(write_id)
                    continue
                claimed = _marker(root, write_id, "claimed")
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


# ---------------------------------------------------------------- object stores
# On S3 a marker is an object under ``_sbi_jobs/``; a "rename" is a put then a delete, not atomic,
# so no sweep claims a write there (``sweep_leftovers`` skips): the markers tell the commit its
# write's facts and a straggler that its write is over, as on a local folder.

def _remote(root: Any) -> Any:
    return root if getattr(root, "remote", False) else None


def _local(root: Any) -> Any:
    return root.root if hasattr(root, "remote") else root  # a local TableStore, a path (str or Path)


def _rel(write_id: str, state: str) -> str:
    return f"{MARKER_DIR}/{write_id}.{state}"


def _remote_state(store: Any, write_id: str) -> str | None:
    return next((s for s in STATES if store.exists(_rel(write_id, s))), None)


@contextmanager
def _remote_running(store: Any, write_id: str, *, table_version: int | None, heartbeat_s: float) -> Iterator[Any]:
    store.write_json(_rel(write_id, "running"), _owner(table_version))

    def beat() -> None:
        state = _remote_state(store, write_id)
        if state in ("running", "committing"):
            marker = _rel(write_id, state)
            store.write_json(marker, {**store.read_json(marker), "heartbeat": time.time()})

    try:
        with _heartbeat(beat, every=heartbeat_s, write_id=write_id):
            yield store
    finally:
        if store.exists(_rel(write_id, "running")):
            _remote_finish(store, write_id, {})


def _is_our_marker(path: Path) -> bool:
    """A marker file this module wrote: JSON carrying the owner fields of :func:`_owner`."""
    info = _read_json(path)
    return isinstance(info, dict) and {"host", "pid"} <= set(info)


def _owner(table_version: int | None) -> dict[str, Any]:
    """What a running marker records of the write's process (read by :func:`owner_gone` and the sweep)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "table_version": table_version}


@contextmanager
def _heartbeat(beat: Any, *, every: float, write_id: str) -> Iterator[None]:
    """``beat()`` every ``every`` seconds in a daemon thread while the block runs; stopped and joined after."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            beat()

    thread = threading.Thread(target=loop, name=f"sbi-heartbeat-{write_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _remote_claim(store: Any, write_id: str) -> dict[str, Any]:
    info = store.read_json(_rel(write_id, "running"))
    if not store.exists(_rel(write_id, "running")):
        raise RuntimeError(f"write {write_id} has no running marker ({_remote_state(store, write_id) or 'none'}); "
                           "committing nothing (a rerun of the job writes its rows)")
    if owner_gone(info):
        raise RuntimeError(f"write {write_id} was started by process {info.get('pid')}, which is gone; "
                           "committing nothing (a rerun of the job writes its rows)")
    store.write_json(_rel(write_id, "committing"), info)
    store.remove(_rel(write_id, "running"))
    return info


def _remote_finish(store: Any, write_id: str, facts: dict[str, Any]) -> None:
    info: dict[str, Any] = {}
    for state in ("finished", "committing", "running", "claimed"):
        if store.exists(_rel(write_id, state)):
            info = store.read_json(_rel(write_id, state))
            break
    info.update(facts)
    store.write_json(_rel(write_id, "finished"), info)
    for state in ("running", "committing", "claimed"):
        store.remove(_rel(write_id, state))
