"""A plan folder: one plan of one run, its tasks staged so far, and why an earlier try's is not reused.

The folder is named by the **plan key** (:func:`pipeline.config.identity.plan_key`): the run key
(the Delta transaction id of the logical run, which covers the config minus per-try
settings, the model revision, the run date and the source snapshot), the task
fingerprint, the number of rows and of tasks. Another run (another key, source
version, fingerprint or plan) never opens it; :func:`explain_unused` names what
changed when a try of the same job and run date finds another's staged tasks.

A plan folder is **ours** when its ``plan.json`` hashes back to the folder's own
name (:func:`owned_plan`): the proof a sweep (:mod:`pipeline.journal.sweep`) needs
before it removes anything in it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from pipeline.config.identity import plan_key
from pipeline.journal.layout import MARKER_SUFFIX, OWNER_FILE, PLAN_FILE, read_json, write_atomic

__all__ = ["StagePlan", "explain_unused", "open_plan", "owned_plan", "plan_folders", "staged_tasks"]


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


def open_plan(root: str, plan: StagePlan) -> str:
    """The folder of ``plan`` under ``root``, created with its ``plan.json`` when new; its path.

    A root this creates (or finds empty) gets the owner file first: the proof a later sweep needs.
    """
    rootp = Path(root)
    rootp.mkdir(parents=True, exist_ok=True)
    if not (rootp / OWNER_FILE).exists():
        write_atomic(rootp / OWNER_FILE, json.dumps({"owner": "spark-batch-inference", "kind": "staging root",
                                                     "created": time.time()}).encode())
    folder = rootp / plan.key()
    folder.mkdir(exist_ok=True)
    if not (folder / PLAN_FILE).exists():
        write_atomic(folder / PLAN_FILE, json.dumps({**asdict(plan), "created": time.time()}).encode())
    return str(folder)


def owned_plan(folder: Path) -> dict[str, Any] | None:
    """``plan.json`` of ``folder`` when it proves the folder ours (it hashes back to the folder's name)."""
    found = read_json(folder / PLAN_FILE)
    if not isinstance(found, dict):
        return None
    try:
        plan = StagePlan(**{k: found[k] for k in StagePlan.__dataclass_fields__ if k in found})
    except TypeError:
        return None
    return found if plan.key() == folder.name else None


def plan_folders(root: str | None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every plan folder under ``root`` that is ours (see :func:`owned_plan`), with its ``plan.json``."""
    if not root or not os.path.isdir(root):
        return
    for folder in sorted(Path(root).iterdir()):
        if folder.is_dir() and not folder.is_symlink() and not folder.name.startswith("."):
            found = owned_plan(folder)
            if found is not None:
                yield folder, found


def staged_tasks(folder: str | None) -> list[int]:
    """The tasks whose marker is in ``folder`` (finished and staged by some try of this plan), sorted."""
    if not folder or not os.path.isdir(folder):
        return []
    names = (n[len("task-"):-len(MARKER_SUFFIX)] for n in os.listdir(folder)
             if n.startswith("task-") and n.endswith(MARKER_SUFFIX))
    return sorted(int(n) for n in names if n.isdigit())


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
    for folder, found in plan_folders(root):
        if folder.name == plan.key() or (found.get("job"), found.get("ds")) != (plan.job, plan.ds):
            continue
        staged = len(staged_tasks(str(folder)))
        if staged:
            reasons.append(f"{staged} staged task(s) of an earlier try not reused: {_what_changed(found, plan)}")
    return "; ".join(reasons) or None


def _what_changed(found: dict[str, Any], plan: StagePlan) -> str:
    """The first value of ``plan`` that differs from the ``plan.json`` an earlier try wrote (``found``)."""
    if found.get("source_version") != plan.source_version:
        return f"the source version changed ({found.get('source_version')} -> {plan.source_version})"
    if found.get("task_fingerprint") != plan.task_fingerprint:
        return f"the task fingerprint changed ({found.get('task_fingerprint')} -> {plan.task_fingerprint})"
    if found.get("rows") != plan.rows:
        return f"the rows to score changed ({found.get('rows')} -> {plan.rows})"
    if found.get("tasks") != plan.tasks:
        return f"the number of tasks changed ({found.get('tasks')} -> {plan.tasks})"
    if found.get("drills", "") != plan.drills:
        return (f"the fault drills that change results changed ({found.get('drills') or 'none'} -> "
                f"{plan.drills or 'none'})")
    return "the run key changed (a setting of the run's config, the model or the output)"
