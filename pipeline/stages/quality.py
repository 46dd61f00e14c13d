"""The drift gate: the run's output profile against its job's recent runs, after scoring and before any commit.

Every inference task sketched its output as it scored it (:mod:`pipeline.core.sketches`); the merged profile
arrives with the tasks' counts. This stage reads the job's history from the runs table (the last
``run.quality.history`` runs whose outcome is ``ok`` and that have a profile, from the last one
published with ``--accept-drift`` on), compares measure by measure (:mod:`pipeline.core.drift`) and says
what moved. With ``run.quality.on_drift: refuse`` a run that moved raises :class:`DriftRefused`
before its commits: nothing is published, the scored rows stay staged (as after a SIGTERM), and the
same command with ``--accept-drift`` publishes them without scoring again. The first runs of a job
have no history: they pass with a note and become the history of the next.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Mapping

from pipeline.config import JobConfig, QualityConfig
from pipeline.core.drift import Limits, Verdict, compare, pooled
from pipeline.errors import DriftRefused
from pipeline.stages.outcomes import Prepared, RunPlan

__all__ = ["RunsHistory", "check_quality", "history_profiles", "limits_of"]


def limits_of(quality: QualityConfig, task: Any = None) -> Limits:
    """The drift limits ``run.quality`` sets; the measures ``run.quality.ignore`` and the task kind
    (``ungated_measures``) leave out of the gate are shown, never flagged."""
    ignore = frozenset(quality.ignore) | frozenset(getattr(task, "ungated_measures", ()))
    return Limits(psi=quality.psi, ks=quality.ks, centroid=quality.centroid, overlap_drop=quality.overlap_drop,
                  p_value=quality.p_value, min_rows=quality.min_rows, ignore=ignore)


def history_profiles(rows: list[Mapping[str, Any]], *, job: str, run_id: str, ds: dt.date,
                     size: int) -> tuple[list[dict[str, Any]], list[str]]:
    """``(profiles, run ids)`` of the runs a run of ``job`` on ``ds`` is compared with, oldest first.

    The job's runs with outcome ``ok`` and a profile, on or before ``ds`` (a backfill is compared
    with the nights before it), not ``run_id`` itself; the latest run of each ``ds`` by start time, the
    last ``size`` of those, and none before the newest one published with ``--accept-drift``: that
    run's output is the new normal.

    >>> day = lambda d, run, action="passed": {"job": "j", "run_id": run, "ds": dt.date(2026, 1, d), "outcome": "ok",
    ...     "started_at": d, "profile": '{"cat": {}}', "drift": json.dumps({"action": action})}
    >>> rows = [day(1, "a"), day(2, "b", "accepted"), day(3, "c"), day(3, "c2"), day(5, "e")]
    >>> history_profiles(rows, job="j", run_id="x", ds=dt.date(2026, 1, 4), size=7)[1]
    ['b', 'c2']
    """
    mine = [r for r in rows if r.get("job") == job and r.get("outcome") == "ok" and r.get("profile")
            and r.get("run_id") != run_id and r.get("ds") is not None and r["ds"] <= ds]
    latest: dict[Any, Mapping[str, Any]] = {}
    for row in sorted(mine, key=lambda r: (r["ds"], _started(r))):
        latest[row["ds"]] = row  # a rerun of a day replaced that day's output
    chosen = [latest[d] for d in sorted(latest)][-size:]
    for i in range(len(chosen) - 1, -1, -1):
        if _drift(chosen[i]).get("action") == "accepted":
            chosen = chosen[i:]
            break
    return [json.loads(r["profile"]) for r in chosen], [str(r["run_id"]) for r in chosen]


def _started(row: Mapping[str, Any]) -> Any:
    return row.get("started_at") or 0


def _drift(row: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return json.loads(row.get("drift") or "{}")
    except ValueError:
        return {}


class RunsHistory:
    """The job's rows of the runs table, read the first time a gate asks and kept: a stream reads them once,
    not at every micro-batch (its own records since are no part of what its micro-batches are compared with)."""

    def __init__(self) -> None:
        self._rows: list[Mapping[str, Any]] | None = None
        self._why: str | None = None

    def rows(self, config: JobConfig, spark: Any = None) -> tuple[list[Mapping[str, Any]], str | None]:
        """``(rows, why there are none to read)``; None: read."""
        if self._rows is None:
            self._rows, self._why = _read_history(config, spark)
        return self._rows, self._why


def _read_history(config: JobConfig, spark: Any = None) -> tuple[list[Mapping[str, Any]], str | None]:
    """The job's rows of the runs table. One deltalake does not reach (``abfss://``, a Volume a Connect client
    does not mount) is read through ``spark``'s connector."""
    from pipeline.io.stores import is_table, unreachable_reason
    from pipeline.records.runs import read_runs

    path = config.resolved_runs_path()
    if path is None:
        return [], "no runs table (a catalog sink without run.runs_path or run.state_path): nothing to compare with"
    readable = not unreachable_reason(path) and is_table(path)
    if not readable and spark is None:
        return [], None
    try:
        return list(read_runs(path, job=config.job, spark=None if readable else spark)), None
    except Exception:  # noqa: BLE001 - no runs table there yet (the connector says so only by failing the read)
        if readable:
            raise
        return [], None


def _history(config: JobConfig, plan: RunPlan, spark: Any = None) -> tuple[list[dict[str, Any]], list[str], str | None]:
    """The history's profiles and run ids, and why there is none to read (None: read)."""
    rows, why = (plan.runs_history or RunsHistory()).rows(config, spark)
    if why:
        return [], [], why
    ident = plan.identity
    profiles, ids = history_profiles(rows, job=config.job, run_id=ident.run_id, ds=ident.ds,
                                     size=config.run.quality.history)
    return profiles, ids, None


def verdict_of(config: JobConfig, plan: RunPlan, profile: Mapping[str, Any], task: Any = None, *,
               spark: Any = None) -> Verdict:
    """The run's profile against its history: the findings, or a note saying why nothing was compared."""
    if not profile:
        return Verdict(note="no rows were profiled: nothing to compare")
    try:
        history, ids, why = _history(config, plan, spark)
    except Exception as exc:  # noqa: BLE001 - an unreadable history is said, never a reason to stop the run
        return Verdict(note=f"the runs table could not be read ({type(exc).__name__}: {exc}): nothing compared")
    if why or not history:
        return Verdict(note=why or f"the first run of {config.job} with a profile: nothing to compare with yet; it "
                                   "passes, and the next runs are compared with it")
    reference = pooled(history)
    findings = compare(profile, [], limits_of(config.run.quality, task), reference=reference)
    return Verdict(tuple(findings), tuple(ids), None, reference)


def check_quality(prep: Prepared, plan: RunPlan, counts: Mapping[str, Any]) -> dict[str, Any] | None:
    """The gate: ``{"profile": ..., "drift": ...}`` of a run that may publish (None: ``run.quality`` off); raises
    :class:`DriftRefused` for a run that moved when ``run.quality.on_drift`` is ``refuse`` and the run was not
    told to ``--accept-drift``."""
    config = prep.config
    quality = config.run.quality
    if not quality.enabled:
        return None
    prep.stage("quality gate")
    profile = dict(counts.get("profile") or {})
    verdict = verdict_of(config, plan, profile, prep.task, spark=prep.spark)
    flagged = verdict.flagged
    action = ("passed" if not flagged else "accepted" if config.run.accept_drift
              else "refused" if quality.on_drift == "refuse" else "warned")
    verdict = Verdict(verdict.findings, verdict.history, verdict.note, verdict.reference, action)
    record = {"profile": profile, "drift": verdict.to_dict()}
    prep.say(f"quality: {verdict.headline()}", plan.identity)
    for finding in flagged:
        prep.say(f"drift: {finding.line()}", plan.identity, warning=True)
    _say_unknown_ignored(prep, plan, profile)
    # the stage's event (JSON logs): what the gate did, what moved, against how many runs
    prep.clock.lap("quality gate", action=action, moved=sorted({f.measure for f in flagged}),
                   compared_with=len(verdict.history))
    if action == "refused":
        raise DriftRefused(refusal(config, plan, verdict), quality=record)
    if action == "accepted":
        prep.say("drift accepted (--accept-drift): publishing; later runs are compared from this run on", plan.identity)
    elif action == "warned":
        prep.say("drift flagged and published (run.quality.on_drift: warn; refuse keeps such a night unpublished)",
                 plan.identity, warning=True)
    return record


def refusal(config: JobConfig, plan: RunPlan, verdict: Verdict) -> str:
    """What a refused run says: what moved and by how much, that nothing was published, and the two ways on."""
    moved = "; ".join(f.line() for f in verdict.flagged)
    output = plan.sink.path or plan.sink.table
    if plan.staging_dir:
        kept = (f"the {plan.rows_in:,} scored rows are staged in {plan.staging_dir}: the same command with "
                "--accept-drift (run.accept_drift: true) publishes them without scoring again")
    else:
        kept = ("nothing is staged (staging is off for this run), so the same command with --accept-drift "
                "(run.accept_drift: true) scores the rows again and publishes them")
    return (f"refused to publish: the output moved against the last {len(verdict.history)} run(s) of {config.job} "
            f"({', '.join(verdict.history)}): {moved}. Nothing was committed: {output} is unchanged. If the change "
            f"is expected (a new model, a new source), {kept}, and later runs are compared from it on; otherwise "
            "fix the cause and rerun. run.quality sets the limits (run.quality.ignore leaves a measure out)")


def _say_unknown_ignored(prep: Prepared, plan: RunPlan, profile: Mapping[str, Any]) -> None:
    """A ``run.quality.ignore`` entry naming no measure of this run (a typo ignores nothing): said, not refused."""
    measured = {name for part in ("cat", "hist", "vec") for name in (profile.get(part) or {})}
    unknown = sorted(set(prep.config.run.quality.ignore) - measured)
    if unknown and measured:
        prep.say(f"run.quality.ignore names {', '.join(unknown)}, which this run does not measure (its "
                 f"measures: {', '.join(sorted(measured))})", plan.identity, warning=True)
