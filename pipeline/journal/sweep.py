"""What in a staging root is ours, and removing only that: after a run's commit, or once stale.

Nothing is removed because of its name, its place or its age alone. A root is
**ours** when it holds the owner file ``_sbi_staging.json`` that
:func:`pipeline.journal.plans.open_plan` writes when it creates (or adopts an
empty) root; a plan folder is ours when its ``plan.json`` hashes back to the
folder's own name (:func:`pipeline.journal.plans.owned_plan`); inside an owned
plan folder only the files staging names (``plan.json``, ``task-<n>.done.json``,
``task-<n>.<12 hex>.arrow``, their temp files, and the endpoint backend's journal,
ledger and batch journal) are removed. A folder that holds a Delta table, or entries no run
wrote, is refused as a root before any work (:func:`check_root`); entries that
appear in an owned root later are left alone and named in one warning line.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from pipeline.errors import SinkError
from pipeline.journal.layout import OWNER_FILE, PLAN_FILE
from pipeline.journal.plans import owned_plan, plan_folders
from pipeline.core.locations import has_delta_log

__all__ = ["RootCheck", "StagingLayoutError", "StagingSweep", "check_root", "remove_run", "sweep_staging"]

# the only paths removed inside an owned plan folder (relative to it): what open_plan, write_atomic and
# TaskStage write, and the request journal and token ledger of pipeline.journal.request_log
_BATCH = r"batch-\d{5}\.(requests\.jsonl|json|output\.jsonl|errors\.jsonl)"
_ANSWER = r"part-(\d{5}|failed)\.jsonl|_done\.json"
_OUR_FILES = re.compile(
    r"^(plan\.json|task-\d+\.done\.json|task-\d+\.[0-9a-f]{12}\.arrow"
    r"|\.(plan\.json|task-\d+\.done\.json)\.[0-9a-f]{8}\.tmp|\.task-\d+\.[0-9a-f]{12}\.arrow\.tmp"
    r"|requests/task-\d+/[0-9a-f]{12}\.jsonl|usage/[\w-]+/\.?(\d+|batch)-[0-9a-f]{12}\.json(\.[0-9a-f]{8})?(\.tmp)?"
    rf"|{_BATCH}|\.{_BATCH}\.[0-9a-f]{{8}}\.tmp|answers/({_ANSWER})|answers/\.({_ANSWER})\.[0-9a-f]{{8}}\.tmp)$")
# the folders those live in, removed once empty
_OUR_FOLDERS = re.compile(r"^(requests|requests/task-\d+|usage|usage/[\w-]+|answers)$")


class StagingLayoutError(SinkError):
    """A staging root holds a Delta table or files no run of this project wrote (refused before any work)."""


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
        if entry.is_dir() and not entry.is_symlink() and (owned_plan(entry) is not None or _empty(entry)):
            continue
        foreign.append(entry.name + ("/" if entry.is_dir() else ""))
    return RootCheck(root=str(root), owned=owned or not foreign, delta_table=has_delta_log(root),
                     foreign=tuple(foreign))


def _empty(folder: Path) -> bool:
    try:
        return not any(folder.iterdir())
    except OSError:
        return False


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


def remove_run(root: str | None, run_key: str) -> list[str]:
    """Remove every owned plan folder of ``run_key`` under ``root`` (after its commit landed), and the root
    when nothing but its owner file is left; the entries left alone (not ours)."""
    left: list[str] = []
    for folder, found in list(plan_folders(root)):
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
    for folder, _ in list(plan_folders(root)):
        try:
            stale = folder.name not in keep and now - _newest_mtime(folder) > max_age_s
        except OSError:
            continue
        if stale:
            sweep.removed.append(folder.name)
            sweep.left_alone += _remove_plan(folder, dry_run=dry_run)
    return sweep
