"""Write markers: what proves a file in a Delta table folder written by ``sbi_delta`` is ours, and dead.

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

The sweep that reads them is :mod:`pipeline.io.delta.sweep`. A marker goes only when its
content is one this module wrote (the owner fields of :func:`owner_fields`), whatever its name.
On S3 a marker is an object under ``_sbi_jobs/``; a "rename" is a put then a delete, not atomic,
so no sweep claims a write there: the markers tell the commit its write's facts and a straggler
that its write is over, as on a local folder.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pipeline.core.host import pid_alive

__all__ = ["MARKER_DIR", "MARKER_RETENTION_S", "STATES", "claim_for_commit", "finish_marker", "finished_facts",
           "is_given_up", "is_our_marker", "local_root", "marker_path", "owner_fields", "owner_gone", "read_marker",
           "remote_store", "running_marker", "write_id_of"]

MARKER_DIR = "_sbi_jobs"
STATES = ("running", "committing", "claimed", "finished")
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


def marker_path(root: str | Path, write_id: str, state: str) -> Path:
    """``<root>/_sbi_jobs/<write id>.<state>`` (a local table folder)."""
    return Path(root) / MARKER_DIR / f"{write_id}.{state}"


def _state_of(root: str | Path, write_id: str) -> tuple[str, Path] | None:
    for state in STATES:
        path = marker_path(root, write_id, state)
        if path.exists():
            return state, path
    return None


def read_marker(path: Path) -> dict[str, Any]:
    """A marker's JSON content; ``{}`` when it is gone or not JSON."""
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


def owner_gone(info: dict[str, Any]) -> bool:
    """Whether the process that started a write is known to be dead (same host, pid gone)."""
    return info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) and not pid_alive(info["pid"])


@contextmanager
def running_marker(root: Any, write_id: str, *, table_version: int | None, heartbeat_s: float) -> Iterator[Any]:
    """``_sbi_jobs/<write_id>.running`` for the duration of a write, its mtime refreshed every ``heartbeat_s``.

    On exit a marker still ``running`` (the write ended without reaching commit or abort) becomes ``finished``.
    ``root``: a local table folder, or a :class:`~pipeline.io.stores.TableStore` (on S3 the heartbeat
    rewrites the marker object).
    """
    store = remote_store(root)
    if store is not None:
        with _remote_running(store, write_id, table_version=table_version, heartbeat_s=heartbeat_s) as marker:
            yield marker
        return
    root = local_root(root)
    path = marker_path(root, write_id, "running")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(owner_fields(table_version)))

    def beat() -> None:
        for state in ("running", "committing"):
            try:
                os.utime(marker_path(root, write_id, state))
                break
            except FileNotFoundError:
                continue

    try:
        with _heartbeat(beat, every=heartbeat_s, write_id=write_id):
            yield path
    finally:
        try:
            os.rename(path, marker_path(root, write_id, "finished"))
        except FileNotFoundError:
            pass


def claim_for_commit(root: Any, write_id: str) -> dict[str, Any]:
    """Take ``running`` over to ``committing`` (atomic rename); returns the marker's content.

    Raises ``RuntimeError`` when the write can no longer commit: its marker was claimed by a
    sweep, or the process that started it is gone.
    """
    store = remote_store(root)
    if store is not None:
        return _remote_claim(store, write_id)
    root = local_root(root)
    running = marker_path(root, write_id, "running")
    info = read_marker(running)
    if owner_gone(info):
        raise RuntimeError(f"write {write_id} was started by process {info.get('pid')}, which is gone; "
                           "committing nothing (a rerun of the job writes its rows)")
    try:
        os.rename(running, marker_path(root, write_id, "committing"))
    except FileNotFoundError:
        state = _state_of(root, write_id)
        raise RuntimeError(
            f"write {write_id} was given up ({state[0] if state else 'no marker'}) by a leftover sweep "
            "that found its process dead or silent; committing nothing (a rerun of the job writes its rows)"
        ) from None
    return info


def finish_marker(root: Any, write_id: str, **facts: Any) -> None:
    """Mark a write ``finished`` (from any state), recording ``facts`` (version, sweep counts) in it."""
    store = remote_store(root)
    if store is not None:
        _remote_finish(store, write_id, facts)
        return
    root = local_root(root)
    target = marker_path(root, write_id, "finished")
    target.parent.mkdir(parents=True, exist_ok=True)
    current = _state_of(root, write_id)
    info = read_marker(current[1]) if current else {}
    if not {"host", "pid"} <= set(info):  # the owner fields are what lets a sweep remove this marker later
        info = {**owner_fields(info.get("table_version")), **info}
    info.update(facts)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(info, default=str))
    os.replace(tmp, target)
    for state in ("running", "committing", "claimed"):
        try:
            os.remove(marker_path(root, write_id, state))
        except FileNotFoundError:
            pass


def finished_facts(root: Any, write_id: str) -> dict[str, Any]:
    """What the ``finished`` marker of a write records (version, sweep counts, an error); ``{}`` if none."""
    store = remote_store(root)
    if store is not None:
        return store.read_json(_rel(write_id, "finished"))
    return read_marker(marker_path(local_root(root), write_id, "finished"))


def is_given_up(root: Any, write_id: str) -> bool:
    """Whether nobody will ever commit this write's files any more (a straggler takes its file back)."""
    store = remote_store(root)
    if store is not None:
        return store.exists(_rel(write_id, "finished"))
    root = local_root(root)
    return marker_path(root, write_id, "finished").exists() or marker_path(root, write_id, "claimed").exists()


# ---------------------------------------------------------------- object stores
def remote_store(root: Any) -> Any:
    """``root`` when it is a :class:`~pipeline.io.stores.TableStore` on an object store, else None."""
    return root if getattr(root, "remote", False) else None


def local_root(root: Any) -> Any:
    """The local folder of ``root``: a local TableStore's folder, or the path itself."""
    return root.root if hasattr(root, "remote") else root  # a local TableStore, a path (str or Path)


def _rel(write_id: str, state: str) -> str:
    return f"{MARKER_DIR}/{write_id}.{state}"


def _remote_state(store: Any, write_id: str) -> str | None:
    return next((s for s in STATES if store.exists(_rel(write_id, s))), None)


@contextmanager
def _remote_running(store: Any, write_id: str, *, table_version: int | None, heartbeat_s: float) -> Iterator[Any]:
    store.write_json(_rel(write_id, "running"), owner_fields(table_version))

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


def is_our_marker(path: Path) -> bool:
    """A marker file this module wrote: JSON carrying the owner fields of :func:`owner_fields`."""
    info = read_marker(path)
    return isinstance(info, dict) and {"host", "pid"} <= set(info)


def owner_fields(table_version: int | None) -> dict[str, Any]:
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

