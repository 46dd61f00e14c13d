"""Staged inference output: each finished task's rows kept on disk, so a rerun of a killed run resumes.

A nightly run commits once, at the end. Without staging a driver killed at 90%
throws away every finished task. With it, each inference task writes its
output rows to ``<root>/<plan key>/`` as it ends, and a rerun of the same run
reuses them instead of scoring those rows again; the commit is still one, at
the end, keyed on the rows. The root is ``<sink path>_staging`` beside the
output table (like its ``_quarantine`` and ``_runs`` tables), so the table's
folder holds nothing but the table.

What makes a staged task reusable, and by whom:

- The folder is named by the **plan key** (:func:`pipeline.identity.plan_key`): the run key
  (the Delta transaction id of the logical run, which covers the config
  minus per-try settings, the model revision, the run date and the source
  snapshot), the task fingerprint, the number of rows and of tasks. Another
  run (another key, source version, fingerprint or plan) never opens it.
- A task's marker ``task-<n>.done.json`` is written last, atomically (a temp
  file, fsync, ``os.replace``), after the rows file it names. A task killed
  while writing leaves no marker, and its half-written file is never read.
- The marker records a digest of the task's input rows (:class:`InputDigest`:
  the row count and an order-free hash of ``id`` and ``content_hash``). A
  rerun reuses the task only when the rows dealt to it now digest the same,
  so a plan that dealt rows differently scores them again.
- A retried or speculative attempt writes a rows file of its own and then
  its marker: the marker always names a whole file of one attempt.

What may be deleted, and the proof it is ours: nothing is removed because of its
name, its place or its age alone. A root is **ours** when it holds the owner file
``_sbi_staging.json`` this module writes when it creates (or adopts an empty)
root; a plan folder is ours when its ``plan.json`` hashes back to the folder's
own name (:func:`pipeline.identity.plan_key` of the values it records); inside an owned plan
folder only the files this module names (``plan.json``, ``task-<n>.done.json``,
``task-<n>.<12 hex>.arrow`` and their temp files) are removed. A folder that
holds a Delta table, or entries no run wrote, is refused as a root before any
work (:func:`check_root`); entries that appear in an owned root later are left
alone and named in one warning line.

Plain values in (paths, keys); no Spark. The worker side is
:class:`TaskStage`; the driver side :func:`open_plan`, :func:`staged_tasks`,
:func:`explain_unused`, :func:`remove_run` and :func:`sweep_staging`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa

from pipeline.errors import SinkError
from pipeline.identity import plan_key

__all__ = ["OWNER_FILE", "PLAN_FILE", "STAGING_SUFFIX", "InputDigest", "RootCheck", "StagePlan", "StagingLayoutError", "StagingSweep",
           "TaskStage", "check_root", "explain_unused", "open_plan", "remove_run", "staged_tasks",
           "staging_root", "sweep_staging"]

# the staging folder beside a local sink's table folder: <sink path>_staging
STAGING_SUFFIX = "_staging"
PLAN_FILE = "plan.json"
# written into a staging root this module created or adopted empty: the root's proof of ownership
OWNER_FILE = "_sbi_staging.json"
_MARKER_SUFFIX = ".done.json"
# the only paths removed inside an owned plan folder (relative to it): what open_plan, _write_atomic and
# TaskStage write, and the request journal and token ledger of pipeline.io.request_log
_OUR_FILES = re.compile(
    r"^(plan\.json|task-\d+\.done\.json|task-\d+\.[0-9a-f]{12}\.arrow"
    r"|\.(plan\.json|task-\d+\.done\.json)\.[0-9a-f]{8}\.tmp|\.task-\d+\.[0-9a-f]{12}\.arrow\.tmp"
    r"|requests/task-\d+/[0-9a-f]{12}\.jsonl|usage/[\w-]+/\.?\d+-[0-9a-f]{12}\.json(\.tmp)?)$")
# the folders those live in, removed once empty
_OUR_FOLDERS = re.compile(r"^(requests|requests/task-\d+|usage|usage/[\w-]+)$")


class StagingLayoutError(SinkError):
    """A staging root holds a Delta table or files no run of this project wrote (refused before any work)."""


def staging_root(sink_path: str | None, override: str | None = None) -> str | None:
    """The local folder staged output goes to: ``override``, else ``<sink_path>_staging``.

    None when there is no local place for it (a catalog table, an ``s3a://`` sink without a
    ``run.staging_path``): the run then commits all or nothing, as without staging.

    >>> staging_root("/lake/scores"), staging_root("s3a://b/scores"), staging_root(None, "/mnt/stage")
    ('/lake/scores_staging', None, '/mnt/stage')
    """
    from pipeline.io.paths import is_local, local_path

    location = override or (f"{sink_path.rstrip('/')}{STAGING_SUFFIX}" if sink_path else None)
    if not location or not is_local(location):
        return None
    return local_path(location)


@dataclass(frozen=True)
class StagePlan:
    """What one plan of one run is: staged output is reused only under exactly the same values."""

    run_key: str
    source_version: str | None
    task_fingerprint: str
    rows: int
    tasks: int
    job: str = ""
    ds: str = ""
    # the fault drills that change a task's output, as JSON ("" in production)
    drills: str = ""

    def key(self) -> str:
        return plan_key(self.run_key, self.source_version, self.task_fingerprint, rows=self.rows, tasks=self.tasks,
                        drills=self.drills)


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: a temp file, fsync, then a rename over it."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written temp file stays behind
        raise


def open_plan(root: str, plan: StagePlan) -> str:
    """The folder of ``plan`` under ``root``, created with its ``plan.json`` when new; its path.

    A root this creates (or finds empty) gets the owner file first: the proof a later sweep needs.
    """
    rootp = Path(root)
    rootp.mkdir(parents=True, exist_ok=True)
    if not (rootp / OWNER_FILE).exists():
        _write_atomic(rootp / OWNER_FILE, json.dumps({"owner": "spark-batch-inference", "kind": "staging root",
                                                      "created": time.time()}).encode())
    folder = rootp / plan.key()
    folder.mkdir(exist_ok=True)
    if not (folder / PLAN_FILE).exists():
        _write_atomic(folder / PLAN_FILE, json.dumps({**asdict(plan), "created": time.time()}).encode())
    return str(folder)


@dataclass(frozen=True)
class RootCheck:
    """What a staging root holds: whether it is ours, a Delta table, and the entries no run wrote."""

    root: str
    owned: bool
    delta_table: bool
    foreign: tuple[str, ...]

    def refusal(self) -> str | None:
        """Why no run may stage here (None: it may): a Delta table, or foreign entries in a root not ours."""
        if self.delta_table:
            what = "a Delta table (it has a _delta_log folder)"
        elif self.foreign and not self.owned:
            what = f"{len(self.foreign)} entr(ies) no run of this project wrote ({_names(self.foreign)})"
        else:
            return None
        return (f"run.staging_path {self.root} already holds {what}; staging there could delete them, so nothing "
                f"was run. Set run.staging_path to an empty or new folder (e.g. {self.root.rstrip('/')}/sbi_staging), "
                "or run.staging: false")


def _names(names: Iterable[str], most: int = 5) -> str:
    names = sorted(names)
    return ", ".join(names[:most]) + (f", ... ({len(names) - most} more)" if len(names) > most else "")


def check_root(root: str | None) -> RootCheck | None:
    """What ``root`` holds (None: no root, or it does not exist yet: a new root is ours).

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> check_root(str(root)).refusal() is None  # empty: a run may adopt it
    True
    >>> _ = (root / "results.csv").write_text("a,b")
    >>> "1 entr(ies) no run of this project wrote (results.csv)" in check_root(str(root)).refusal()
    True
    """
    if not root or not os.path.isdir(root):
        return None
    owned = os.path.isfile(os.path.join(root, OWNER_FILE))
    foreign = []
    for entry in sorted(Path(root).iterdir()):
        if entry.name == OWNER_FILE or (entry.name.startswith(f".{OWNER_FILE}.") and entry.name.endswith(".tmp")):
            continue
        if entry.is_dir() and not entry.is_symlink() and (_owned_plan(entry) is not None or _empty(entry)):
            continue
        foreign.append(entry.name + ("/" if entry.is_dir() else ""))
    return RootCheck(root=str(root), owned=owned or not foreign, delta_table=os.path.isdir(os.path.join(root, "_delta_log")),
                     foreign=tuple(foreign))


def _empty(folder: Path) -> bool:
    try:
        return not any(folder.iterdir())
    except OSError:
        return False


def _owned_plan(folder: Path) -> dict[str, Any] | None:
    """``plan.json`` of ``folder`` when it proves the folder ours (it hashes back to the folder's name)."""
    found = _read_json(folder / PLAN_FILE)
    if not isinstance(found, dict):
        return None
    try:
        plan = StagePlan(**{k: found[k] for k in StagePlan.__dataclass_fields__ if k in found})
    except TypeError:
        return None
    return found if plan.key() == folder.name else None


def _remove_plan(folder: Path, *, dry_run: bool = False) -> list[str]:
    """Remove the files this project wrote in the owned plan ``folder`` (``_OUR_FILES``), then its folders and,
    once nothing else is left, its ``plan.json`` and the folder itself; the paths left alone (someone else's).
    While anything foreign remains the folder keeps its ``plan.json``, so a later sweep can finish the job."""
    left = []
    for here, dirs, names in os.walk(folder, topdown=False):
        rel_dir = Path(here).relative_to(folder).as_posix()
        for name in sorted(names):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = Path(here) / name
            if rel == PLAN_FILE:
                continue  # the proof goes last, once nothing else is left: until then the folder stays provably ours
            if _OUR_FILES.match(rel) and not path.is_symlink():
                if not dry_run:
                    path.unlink(missing_ok=True)
            else:
                left.append(f"{folder.name}/{rel}")
        for name in dirs:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not _OUR_FOLDERS.match(rel) and not _left_inside(left, folder.name, rel):
                left.append(f"{folder.name}/{rel}/")
            elif not dry_run:
                try:
                    (Path(here) / name).rmdir()  # only when empty: what someone else put there keeps it
                except OSError:
                    pass
    if not left and not dry_run:
        try:
            (folder / PLAN_FILE).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            pass
    return sorted(left)


def _left_inside(left: list[str], plan: str, rel: str) -> bool:
    """Whether ``left`` already names something inside ``<plan>/<rel>/`` (so the folder is not named again)."""
    prefix = f"{plan}/{rel}/"
    return any(p.startswith(prefix) for p in left)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def staged_tasks(folder: str | None) -> list[int]:
    """The tasks whose marker is in ``folder`` (finished and staged by some try of this plan), sorted."""
    if not folder or not os.path.isdir(folder):
        return []
    names = (n[len("task-"):-len(_MARKER_SUFFIX)] for n in os.listdir(folder)
             if n.startswith("task-") and n.endswith(_MARKER_SUFFIX))
    return sorted(int(n) for n in names if n.isdigit())


def _plans(root: str | None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every plan folder under ``root`` that is ours (see :func:`_owned_plan`), with its ``plan.json``."""
    if not root or not os.path.isdir(root):
        return
    for folder in sorted(Path(root).iterdir()):
        if folder.is_dir() and not folder.is_symlink() and not folder.name.startswith("."):
            found = _owned_plan(folder)
            if found is not None:
                yield folder, found


def explain_unused(root: str | None, plan: StagePlan) -> str | None:
    """Why staged output of an earlier try of this job and run date is not reused by ``plan``; None when
    there is none (or ``plan``'s own folder holds it).

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> old = StagePlan("sbi-j-1", "delta:3", "fp1", rows=10, tasks=2, job="j", ds="2026-11-29")
    >>> folder = open_plan(root, old); _ = open(f"{folder}/task-0.done.json", "w").write("{}")
    >>> explain_unused(root, StagePlan("sbi-j-2", "delta:3", "fp2", 10, 2, "j", "2026-11-29"))
    '1 staged task(s) of an earlier try not reused: the task fingerprint changed (fp1 -> fp2)'
    >>> explain_unused(root, old) is None
    True
    """
    reasons = []
    for folder, found in _plans(root):
        if folder.name == plan.key() or (found.get("job"), found.get("ds")) != (plan.job, plan.ds):
            continue
        staged = len(staged_tasks(str(folder)))
        if not staged:
            continue
        if found.get("source_version") != plan.source_version:
            why = f"the source version changed ({found.get('source_version')} -> {plan.source_version})"
        elif found.get("task_fingerprint") != plan.task_fingerprint:
            why = f"the task fingerprint changed ({found.get('task_fingerprint')} -> {plan.task_fingerprint})"
        elif found.get("rows") != plan.rows:
            why = f"the rows to score changed ({found.get('rows')} -> {plan.rows})"
        elif found.get("tasks") != plan.tasks:
            why = f"the number of tasks changed ({found.get('tasks')} -> {plan.tasks})"
        elif found.get("drills", "") != plan.drills:
            why = (f"the fault drills that change results changed ({found.get('drills') or 'none'} -> "
                   f"{plan.drills or 'none'})")
        else:
            why = "the run key changed (a setting of the run's config, the model or the output)"
        reasons.append(f"{staged} staged task(s) of an earlier try not reused: {why}")
    return "; ".join(reasons) or None


def remove_run(root: str | None, run_key: str) -> list[str]:
    """Remove every owned plan folder of ``run_key`` under ``root`` (after its commit landed), and the root
    when nothing but its owner file is left; the entries left alone (not ours)."""
    left: list[str] = []
    for folder, found in list(_plans(root)):
        if found.get("run_key") == run_key:
            left += _remove_plan(folder)
    if root and os.path.isdir(root) and {e.name for e in Path(root).iterdir()} <= {OWNER_FILE}:
        try:  # only an empty root of ours goes: another run's plans, or anyone's files, keep it
            os.remove(os.path.join(root, OWNER_FILE))
            os.rmdir(root)
        except OSError:
            pass
    return left


def _newest_mtime(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for entry in folder.iterdir():
        try:
            times.append(entry.stat().st_mtime)
        except OSError:
            continue
    return max(times)


@dataclass
class StagingSweep:
    """What a staging sweep removed (plan folder names) and left alone (entries no run wrote)."""

    removed: list[str] = field(default_factory=list)
    left_alone: list[str] = field(default_factory=list)

    def warning(self, root: str) -> str | None:
        if not self.left_alone:
            return None
        return (f"left alone in staging folder {root}: {len(self.left_alone)} entr(ies) no run of this project "
                f"wrote ({_names(self.left_alone)})")


def sweep_staging(root: str | None, *, max_age_s: float, keep: Iterable[str] = (), dry_run: bool = False,
                  now: float | None = None) -> StagingSweep:
    """Remove the owned plan folders under ``root`` untouched for ``max_age_s`` seconds, except those named
    in ``keep``. Only a root that is ours is swept; what is not ours is named in ``left_alone``."""
    now = time.time() if now is None else now
    keep = set(keep)
    sweep = StagingSweep()
    check = check_root(root)
    if check is None:
        return sweep
    sweep.left_alone += check.foreign
    if check.refusal():
        return sweep  # not our folder: nothing in it is judged
    for folder, _ in list(_plans(root)):
        try:
            stale = folder.name not in keep and now - _newest_mtime(folder) > max_age_s
        except OSError:
            continue
        if stale:
            sweep.removed.append(folder.name)
            sweep.left_alone += _remove_plan(folder, dry_run=dry_run)
    return sweep


class InputDigest:
    """The row count and an order-free hash of a task's input rows (``id`` and ``content_hash``).

    >>> a, b = InputDigest(), InputDigest()
    >>> a.update(pa.record_batch({"id": [1, 2], "content_hash": ["x", "y"]}))
    >>> b.update(pa.record_batch({"id": [2, 1], "content_hash": ["y", "x"]}))
    >>> a.value() == b.value(), a.value().startswith("2:")
    (True, True)
    """

    def __init__(self) -> None:
        self.rows = 0
        self.total = 0

    def update(self, batch: pa.RecordBatch) -> None:
        names = [c for c in ("id", "content_hash") if c in batch.schema.names] or batch.schema.names
        for row in zip(*(batch.column(c).to_pylist() for c in names)):
            digest = hashlib.blake2b(repr(row).encode(), digest_size=8).digest()
            self.total = (self.total + int.from_bytes(digest, "little")) % (1 << 64)
        self.rows += batch.num_rows

    def value(self) -> str:
        return f"{self.rows}:{self.total:016x}"


class TaskStage:
    """Worker side: one inference task's staged output in a plan folder.

    ``reusable(digest)`` gives the staged rows and counts of a finished try whose input digested the
    same; otherwise the task scores, calls ``add`` with every output batch and ``finish`` at its end.
    Staging never fails a task: a folder this host cannot see (a Spark Connect server elsewhere) or a
    write that fails turns it off for the task (``failed``), which then just is not reusable.
    """

    def __init__(self, folder: str, task: int) -> None:
        self.folder, self.task = Path(folder), task
        self.marker = self.folder / f"task-{task}{_MARKER_SUFFIX}"
        self._name = f"task-{task}.{uuid.uuid4().hex[:12]}.arrow"
        self._tmp = self.folder / f".{self._name}.tmp"
        self._file: Any = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows = 0
        self.failed = not self.folder.is_dir()

    def has_marker(self) -> bool:
        return self.marker.exists()

    def reusable(self, digest: str) -> tuple[pa.Table, dict[str, Any]] | None:
        """``(rows, counts)`` staged by a finished try of this task with the same input, else None."""
        found = _read_json(self.marker)
        if not found or found.get("input") != digest or found.get("plan") != self.folder.name:
            return None
        try:
            with pa.OSFile(str(self.folder / found["data"]), "rb") as f:
                table = pa.ipc.open_stream(f).read_all()
        except (OSError, KeyError, pa.ArrowInvalid):
            return None
        if table.num_rows != found.get("rows"):
            return None
        return table, dict(found.get("counts") or {})

    def add(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (an output batch of this task) to this attempt's rows file."""
        if self.failed:
            return
        try:
            if self._writer is None:
                self._file = open(self._tmp, "wb")
                self._writer = pa.ipc.new_stream(self._file, batch.schema)
            self._writer.write_batch(batch)
        except (OSError, pa.ArrowException):
            self.abandon()
            return
        self.rows += batch.num_rows

    def finish(self, *, digest: str, counts: dict[str, Any]) -> None:
        """Make this attempt's rows durable, then write the marker that names them (last, atomically)."""
        if self._writer is None or self.failed:
            return  # no rows (nothing to reuse), or staging failed for this task
        try:
            self._writer.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.folder / self._name)
            marker = {"task": self.task, "plan": self.folder.name, "input": digest, "rows": self.rows,
                      "data": self._name, "counts": counts, "at": time.time()}
            _write_atomic(self.marker, json.dumps(marker, default=str).encode())
        except (OSError, pa.ArrowException):  # a full or read-only disk: this task is just not reusable
            self.abandon()
            (self.folder / self._name).unlink(missing_ok=True)

    def abandon(self) -> None:
        """Drop this attempt's unfinished rows file (the task failed or staging failed)."""
        self.failed = True
        try:
            if self._file is not None:
                self._file.close()
            self._tmp.unlink(missing_ok=True)
        except OSError:
            pass
