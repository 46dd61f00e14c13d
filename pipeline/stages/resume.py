"""Resume by staging: where a run's finished inference tasks stage their output, opened before scoring and
removed once the commit landed, so a rerun of a killed run reuses what its earlier tries staged
(:mod:`pipeline.journal` does the files; this module decides when, for one run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.config import JobConfig
from pipeline.config.identity import RunIdentity
from pipeline.stages.outcomes import Prepared

__all__ = ["Staging", "check_staging_root", "no_staging_reason", "open_staging", "remove_staging", "staging_root"]


@dataclass(frozen=True)
class Staging:
    """A run's plan folder (None: no staging), the tasks staged there before this try started, and why an
    earlier try's staged output is not reused (None: nothing to say)."""

    folder: str | None
    staged_before: int
    resume_note: str | None


def no_staging_reason(config: JobConfig) -> str:
    """Why a run has no staging folder, and what to set to get one."""
    if not config.run.staging:
        return "run.staging is off; turn it on"
    return (f"{config.sink.path or config.sink.table} is not a local or mounted path; set run.staging_path to a "
            "folder every executor reaches")


def staging_root(config: JobConfig) -> str | None:
    """Where this job's staged task output lives (None: staging off, or no local place for it)."""
    from pipeline.journal import layout

    return layout.staging_root(config.sink.location, config.run.staging_path) if config.run.staging else None


def check_staging_root(config: JobConfig) -> None:
    """Refuse, before any work, a staging root that holds a Delta table or files no run of ours wrote."""
    from pipeline.journal.sweep import StagingLayoutError, check_root

    check = check_root(staging_root(config))
    if check is not None and (why := check.refusal()):
        raise StagingLayoutError(why)


def open_staging(prep: Prepared, identity: RunIdentity, *, rows: int, tasks: int) -> Staging:
    """The plan folder of this run's staged output (:class:`Staging`), opened for ``rows`` in ``tasks`` tasks.

    Owned plans of other runs untouched for ``run.staging_max_age_hours`` are removed first; entries no
    run wrote are left alone and named in one line. A root that cannot be written (a full or read-only
    disk) turns staging off for this run with one line: staging never fails a run.
    """
    from pipeline.journal.plans import StagePlan, explain_unused, open_plan, staged_tasks
    from pipeline.journal.sweep import sweep_staging

    config = prep.config
    root = staging_root(config)
    if root is None or not rows:
        note = None
        if config.run.staging and rows and config.sink.path:
            note = (f"no staging: {config.sink.path} is not a local or mounted path; set run.staging_path to a "
                    "folder every executor reaches to resume a killed run")
        return Staging(None, 0, note)
    from pipeline.core.faults import RESULT_FAULTS

    drills = {k: prep.faults[k] for k in RESULT_FAULTS if k in prep.faults}
    plan = StagePlan(run_key=identity.run_key, source_version=identity.source_snapshot,
                     task_fingerprint=identity.task_fingerprint, rows=rows, tasks=tasks, job=config.job,
                     ds=identity.ds.isoformat(), drills=json.dumps(drills, sort_keys=True) if drills else "")
    from pipeline.journal.batch_log import batch_plan

    journal = batch_plan(run_key=identity.run_key, source_version=identity.source_snapshot,
                         task_fingerprint=identity.task_fingerprint, job=config.job, ds=identity.ds.isoformat())
    try:  # this run's plan and its batch journal (a served model's batch mode) stay, whatever their age
        swept = sweep_staging(root, max_age_s=config.run.staging_max_age_hours * 3600, keep=[plan.key(), journal.key()])
        folder = open_plan(root, plan)
    except OSError as exc:
        prep.say(f"staging off for this run: {root} cannot be written ({type(exc).__name__}: {exc}); "
                 "the run goes on, but a killed run will score every row again", warning=True)
        return Staging(None, 0, None)
    if warning := swept.warning(root):
        prep.say(warning, warning=True)
    return Staging(folder, len(staged_tasks(folder)), explain_unused(root, plan))


def remove_staging(prep: Prepared, run_key: str) -> None:
    """Remove every staged plan of this run's key (its commit landed); what is not ours stays, named."""
    from pipeline.journal.sweep import remove_run

    root = staging_root(prep.config)
    if root is not None and run_key:
        try:
            left = remove_run(root, run_key)
        except OSError as exc:  # the commit landed; an unremovable plan is swept by a later run
            prep.say(f"staged output in {root} not removed ({exc})", warning=True)
            return
        if left:
            prep.say(f"left alone in staging folder {root}: {', '.join(left[:5])} (not written by this project)",
                     warning=True)
