"""What ``pipeline report`` does: find the runs table of a target, pick the run and its history, write the page.

Tables may be local or on S3 (:mod:`pipeline.io.stores`); the runs table is
read with ``deltalake`` (no Spark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.errors import ReportError
from pipeline.io.outputs import write_output
from pipeline.io.stores import is_table, open_table, reachable, unreachable_reason
from pipeline.core.locations import uri_scheme
from pipeline.report.deviations import Thresholds, find_deviations
from pipeline.report.page import render_report

__all__ = ["pick_runs", "report_main", "resolve_runs", "write_report"]


def resolve_runs(target: str, *, runs_path: str | None = None) -> tuple[str, list[dict[str, Any]], str | None]:
    """``(runs table path, its rows oldest first, run id or None)`` for a CLI target.

    ``target`` is a runs table, an output table (its runs table is ``<path>_runs``)
    or a run id (then ``runs_path`` names the runs table). Tables may be local or on S3 (``s3://``,
    ``s3a://``, settings from the environment: :mod:`pipeline.io.stores`).
    """
    from pipeline.records.runs import read_runs

    if runs_path:
        path, run_id = runs_path, None if _is_table(target) else target
    elif _is_table(target):
        names = open_table(target).schema().to_arrow().names
        path = target if {"run_id", "outcome", "config_hash"} <= set(names) else target.rstrip("/") + "_runs"
        run_id = None
    elif _is_table(target.rstrip("/") + "_runs"):  # an output path whose table is gone or elsewhere
        path, run_id = target.rstrip("/") + "_runs", None
    else:
        raise ReportError(
            f"{target!r} is not a Delta table; pass an output table, its runs table (<output>_runs), "
            "or a run id together with --runs <runs table>"
        )
    if not _is_table(path):
        reason = unreachable_reason(path)
        raise ReportError(f"no runs table at {path}; runs are recorded there by pipeline run (run.runs_path)"
                          + (f" ({reason})" if reason else ""))
    rows = read_runs(path)
    if run_id is not None and not any(r["run_id"] == run_id for r in rows):
        raise ReportError(f"run id {run_id!r} is not in the runs table {path} ({len(rows)} runs)")
    return path, rows, run_id


def _is_table(location: str) -> bool:
    return reachable(location) and is_table(location)


def pick_runs(rows: Sequence[Mapping[str, Any]], *, run_id: str | None = None,
              history: int | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run to report (``run_id``, else the latest finished run) and its job's last ``history`` runs."""
    if not rows:
        raise ReportError("the runs table is empty")
    if run_id is not None:
        run = next(r for r in rows if r["run_id"] == run_id)
    else:
        finished = [r for r in rows if r["outcome"] != "started"]
        run = (finished or list(rows))[-1]
    same_job = [dict(r) for r in rows if r["job"] == run["job"]]
    upto = same_job[: next(i for i, r in enumerate(same_job) if r["run_id"] == run["run_id"]) + 1]
    return dict(run), (upto[-history:] if history else [])


def write_report(rows: Iterable[Mapping[str, Any]], path: str | Path, *, run_id: str | None = None,
                 history: int | None = None, thresholds: Thresholds = Thresholds()) -> Path | str:
    """Render the report of ``run_id`` (else the latest run) in ``rows`` to ``path``: a local path (returned as a
    ``Path``) or a URI such as ``s3://bucket/reports/run.html`` (written as one object, returned as given)."""
    run, recent = pick_runs(list(rows), run_id=run_id, history=history)
    page = render_report(run, recent, thresholds=thresholds)
    if isinstance(path, str) and uri_scheme(path) is not None:
        return write_output(path, page, key="the report path")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def report_main(target: str, *, out: str | None = None, history: int | None = None, runs_path: str | None = None,
                thresholds: Thresholds = Thresholds()) -> tuple[Path | str, str, dict[str, list[str]]]:
    """What ``pipeline report`` does: ``(the HTML file written, the run reported, deviations in the history)``."""
    path, rows, run_id = resolve_runs(target, runs_path=runs_path)
    run, recent = pick_runs(rows, run_id=run_id, history=history)
    default = Path(path.rstrip("/") + f"_report_{run['run_id']}.html") if "://" not in path else Path(
        f"report_{run['run_id']}.html")
    written = write_report(rows, out or default, run_id=run["run_id"], history=history, thresholds=thresholds)
    return written, str(run["run_id"]), (find_deviations(recent, thresholds) if recent else {})
