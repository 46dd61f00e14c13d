"""One self-contained HTML report of a run, or of the last N runs, from the runs table.

``pipeline report <output table | runs table | run id> [--history N] [--out FILE]``
reads the runs table (:mod:`pipeline.runs`) with ``deltalake`` (no Spark) and
writes a single HTML file with its plots embedded as PNG data URIs, so it can
be mailed, attached to an MLflow run or opened from object storage:

- one run: throughput over time per worker, the padded-length histogram and
  padding per length, row status counts, the slowest batches, and for
  generation the finish reasons and tokens/s;
- ``--history N``: rows per ds, throughput and flagged-rate trends over the
  job's last N runs, with every night that deviates from the median of the
  runs before it flagged (:func:`find_deviations`).

Plots use matplotlib's Agg backend (no display needed); matplotlib is imported
only when a report is drawn.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipeline.errors import ReportError
from pipeline.io.stores import is_table, open_table, reachable, unreachable_reason

__all__ = ["ReportError", "Thresholds", "find_deviations", "render_report", "resolve_runs", "write_report"]


@dataclass(frozen=True)
class Thresholds:
    """When a night deviates from the median of the runs before it (fractions: 0.2 = 20%)."""

    rows_drop: float = 0.2
    throughput_drop: float = 0.3
    flagged_rise: float = 0.05  # absolute rise of the flagged share of rows (0.05 = 5 points)
    min_previous: int = 2  # runs needed before a night can be judged


# ------------------------------------------------------------------ finding the runs


def resolve_runs(target: str, *, runs_path: str | None = None) -> tuple[str, list[dict[str, Any]], str | None]:
    """``(runs table path, its rows oldest first, run id or None)`` for a CLI target.

    ``target`` is a runs table, an output table (its runs table is ``<path>_runs``)
    or a run id (then ``runs_path`` names the runs table). Tables may be local or on S3 (``s3://``,
    ``s3a://``, settings from the environment: :mod:`pipeline.io.stores`).
    """
    from pipeline.runs import read_runs

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


# ------------------------------------------------------------------ deviations (pure)


def find_deviations(runs: Sequence[Mapping[str, Any]], thresholds: Thresholds = Thresholds()) -> dict[str, list[str]]:
    """``{run_id: [reason, ...]}`` for each run that deviates from the median of the finished runs before it.

    Rows in dropped by more than ``rows_drop``, docs/s by more than
    ``throughput_drop``, or the flagged share of rows rose by more than
    ``flagged_rise``; a failed run is always flagged.

    >>> runs = [{"run_id": str(i), "outcome": "ok", "rows_in": 100, "docs_per_s": 10.0, "rows_flagged": 1}
    ...         for i in range(3)]
    >>> runs.append({"run_id": "3", "outcome": "ok", "rows_in": 50, "docs_per_s": 10.0, "rows_flagged": 1})
    >>> find_deviations(runs)
    {'3': ['rows in 50 is 50% below the median 100 of the 3 runs before']}
    """
    out: dict[str, list[str]] = {}
    previous: list[Mapping[str, Any]] = []
    for run in runs:
        reasons = []
        if run.get("outcome") == "failed":
            reasons.append(f"failed: {run.get('error_class') or 'error'}")
        elif run.get("outcome") == "ok" and len(previous) >= thresholds.min_previous:
            n = len(previous)
            rows_med = statistics.median(p["rows_in"] or 0 for p in previous)
            rows = run.get("rows_in") or 0
            if rows_med > 0 and rows < (1 - thresholds.rows_drop) * rows_med:
                reasons.append(f"rows in {rows:,} is {100 * (1 - rows / rows_med):.0f}% below the median "
                               f"{rows_med:,.0f} of the {n} runs before")
            tput_med = statistics.median(p["docs_per_s"] or 0.0 for p in previous)
            tput = run.get("docs_per_s") or 0.0
            if tput_med > 0 and tput < (1 - thresholds.throughput_drop) * tput_med:
                reasons.append(f"throughput {tput:,.1f} docs/s is {100 * (1 - tput / tput_med):.0f}% below the "
                               f"median {tput_med:,.1f} of the {n} runs before")
            flag_med = statistics.median(_flagged_share(p) for p in previous)
            if _flagged_share(run) > flag_med + thresholds.flagged_rise:
                reasons.append(f"flagged rows {100 * _flagged_share(run):.1f}% against a median of "
                               f"{100 * flag_med:.1f}% in the {n} runs before")
        if reasons:
            out[str(run["run_id"])] = reasons
        if run.get("outcome") == "ok":
            previous.append(run)
    return out


def _flagged_share(run: Mapping[str, Any]) -> float:
    rows = run.get("rows_in") or 0
    return (run.get("rows_flagged") or 0) / rows if rows else 0.0


# ------------------------------------------------------------------ plots


def _figure(width: float = 7.5, height: float = 3.2, *, columns: int = 1) -> tuple[Any, Any]:
    """A figure and its axes (one per column), drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt.subplots(1, columns, figsize=(width, height), dpi=100)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _worker_label(worker: str) -> str:
    return worker.rsplit(":", 1)[-1] if ":" in worker else worker


def _coarser(timeline: Mapping[str, list[list[Any]]], width: int, points: int = 25) -> tuple[dict[str, Any], int]:
    """The timeline on buckets ``factor`` times wider, so the longest worker has at most ``points``: a
    batch lands in one bucket, and 1-second buckets of 2-second batches would only show the batches."""
    longest = max((len(p) for p in timeline.values()), default=0)
    factor = max(1, -(-longest // points))
    out = {}
    for worker, series in timeline.items():
        out[worker] = [[group[0][0], sum(p[1] for p in group), sum(p[2] for p in group), sum(p[3] for p in group)]
                       for group in (series[i : i + factor] for i in range(0, len(series), factor))]
    return out, width * factor


def plot_throughput(metrics: Mapping[str, Any]) -> str | None:
    timeline = metrics.get("timeline") or {}
    if not timeline:
        return None
    timeline, width = _coarser(timeline, metrics.get("timeline_bucket_s") or 1)
    start = min(p[0] for points in timeline.values() for p in points)
    fig, ax = _figure()
    for worker, points in sorted(timeline.items()):
        ax.step([p[0] - start for p in points] + [points[-1][0] - start + width],
                [p[1] / width for p in points] + [points[-1][1] / width], where="post",
                label=f"worker {_worker_label(worker)}")
    ax.set(xlabel=f"seconds since the first batch ({width} s buckets)", ylabel="rows/s",
           title="Throughput over time per worker")
    ax.legend(fontsize=7, loc="best")
    return _png(fig)


def plot_lengths(metrics: Mapping[str, Any]) -> str | None:
    by_length = metrics.get("by_length") or []
    if not by_length:
        return None
    fig, (left, right) = _figure(9, 3.2, columns=2)
    lengths = [b["padded_length"] for b in by_length]
    width = max(1, min(8, (max(lengths) - min(lengths)) / max(len(lengths), 1) or 4))
    left.bar(lengths, [b["rows"] for b in by_length], width=width, color="#4c72b0")
    left.set(xlabel="padded length (tokens)", ylabel="rows", title="Rows by padded batch length")
    right.plot(lengths, [b["tokens"] / b["padded_tokens"] if b["padded_tokens"] else 1.0 for b in by_length],
               "o-", color="#dd8452")
    right.set(xlabel="padded length (tokens)", ylabel="real / padded tokens", ylim=(0, 1.05),
              title="Padding efficiency per batch length")
    return _png(fig)


def plot_status(status: Mapping[str, int]) -> str | None:
    if not status:
        return None
    fig, ax = _figure(6, 2.6)
    names = sorted(status, key=lambda k: -status[k])
    colors = ["#55a868" if n == "ok" else "#c44e52" if n == "error" else "#ccb974" for n in names]
    bars = ax.barh(names, [status[n] for n in names], color=colors)
    ax.bar_label(bars, labels=[f"{status[n]:,}" for n in names], fontsize=8)
    ax.set(xlabel="rows", title="Row status")
    ax.invert_yaxis()
    return _png(fig)


def plot_slowest(metrics: Mapping[str, Any]) -> str | None:
    slowest = metrics.get("slowest") or []
    if not slowest:
        return None
    fig, ax = _figure(7.5, 0.6 + 0.25 * len(slowest))
    labels = [f"w{_worker_label(b['worker'])} t{b['task']} len {b['padded_length']} x{b['rows']}" for b in slowest]
    ax.barh(labels, [b["seconds"] for b in slowest], color="#8172b3")
    ax.set(xlabel="seconds", title="Slowest batches (worker, task, padded length x rows)")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    return _png(fig)


def plot_generation(metrics: Mapping[str, Any]) -> str | None:
    reasons = metrics.get("finish_reasons") or {}
    gen = metrics.get("generation") or {}
    if not reasons and not gen:
        return None
    fig, (left, right) = _figure(9, 3, columns=2)
    names = sorted(reasons)
    left.bar(names, [reasons[n] for n in names], color="#64b5cd")
    left.set(ylabel="rows", title="Finish reasons")
    timeline, width = _coarser(metrics.get("timeline") or {}, metrics.get("timeline_bucket_s") or 1)
    start = min((p[0] for points in timeline.values() for p in points), default=0)
    for worker, points in sorted(timeline.items()):
        right.step([p[0] - start for p in points], [p[2] / width for p in points], where="post",
                   label=f"worker {_worker_label(worker)}")
    seconds = gen.get("generate_seconds") or 0
    rate = gen.get("completion_tokens", 0) / seconds if seconds else 0
    right.set(xlabel="seconds", ylabel="tokens/s", title=f"Tokens/s per worker ({rate:,.1f} completion tokens/s)")
    if timeline:
        right.legend(fontsize=7)
    return _png(fig)


def plot_history(runs: Sequence[Mapping[str, Any]], deviations: Mapping[str, list[str]]) -> list[tuple[str, str]]:
    """Rows per ds, throughput trend and flagged-rate trend, flagged nights in red."""
    if not runs:
        return []
    labels = [f"{r['ds']}" + ("" if i == 0 or r["ds"] != runs[i - 1]["ds"] else f" #{i}") for i, r in enumerate(runs)]
    flagged = [str(r["run_id"]) in deviations for r in runs]
    out = []
    fig, ax = _figure(7.5, 3)
    ax.bar(labels, [r["rows_in"] or 0 for r in runs], color=["#c44e52" if f else "#4c72b0" for f in flagged])
    ax.set(ylabel="rows in", title="Rows per ds (red: flagged)")
    ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    out.append(("Rows per ds", _png(fig)))
    for key, title, scale in (("docs_per_s", "Throughput trend (docs/s)", 1.0),
                              ("flagged_pct", "Flagged rows trend (% of rows in)", 100.0)):
        fig, ax = _figure(7.5, 3)
        values = [(_flagged_share(r) * scale) if key == "flagged_pct" else (r.get(key) or 0.0) for r in runs]
        ax.plot(labels, values, "o-", color="#4c72b0")
        ax.scatter([lab for lab, f in zip(labels, flagged) if f], [v for v, f in zip(values, flagged) if f],
                   color="#c44e52", zorder=3, s=60, label="flagged")
        ax.set(title=title)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        if any(flagged):
            ax.legend(fontsize=7)
        out.append((title, _png(fig)))
    return out


# ------------------------------------------------------------------ HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4} .ok{color:#2e7d32;font-weight:600} .failed,.flag{color:#c62828;font-weight:600}
.started{color:#ef6c00;font-weight:600} figure{margin:12px 0} figcaption{font-size:12px;color:#555}
img{max-width:100%} .muted{color:#777;font-size:12px} tr.flagged td{background:#fdecea}
"""


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S %Z")
    return html.escape(str(value))


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}


def render_report(run: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = (), *,
                  thresholds: Thresholds = Thresholds()) -> str:
    """The HTML page (a string) for ``run`` and, if given, the ``history`` runs of its job."""
    metrics = _json(run.get("batch_metrics"))
    status = _json(run.get("status_counts"))
    outcome = run.get("outcome") or "?"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(str(run['job']))} run {html.escape(str(run['run_id']))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(str(run['job']))} · ds {_cell(run.get('ds'))} · "
        f"<span class='{html.escape(outcome)}'>{html.escape(outcome)}</span></h1>",
        f"<p class='muted'>run {html.escape(str(run['run_id']))} · report written "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}</p>",
    ]
    if run.get("error_class"):
        parts.append(f"<p class='failed'>{html.escape(run['error_class'])}: {html.escape(run.get('error_message') or '')}</p>")
    fields = [
        ("rows in / out / flagged / quarantined",
         " / ".join(_cell(run.get(k)) for k in ("rows_in", "rows_out", "rows_flagged", "rows_quarantined"))),
        ("time", f"{_cell(run.get('seconds'))} s (started {_cell(run.get('started_at'))})"),
        ("throughput", f"{_cell(run.get('docs_per_s'))} docs/s, {_cell(run.get('tokens_per_s'))} tokens/s"),
        ("padding efficiency", f"{_cell(run.get('padding_efficiency'))} ({_cell(run.get('tokens'))} real / "
                               f"{_cell(run.get('padded_tokens'))} padded tokens in {_cell(run.get('batches'))} batches)"),
        ("model", f"{_cell(run.get('model_name'))} @ {_cell(run.get('model_revision'))} ({_cell(run.get('precision'))})"),
        ("model loads / workers", f"{_cell(run.get('model_loads'))} / {_cell(run.get('workers'))}"),
        ("output", f"{_cell(run.get('output'))} (Delta version {_cell(run.get('delta_version'))}, "
                   f"{_cell(run.get('writer'))} writer)"),
        ("Spark", f"{_cell(run.get('spark_app_id'))} on {_cell(run.get('spark_master'))}"),
        ("config hash", _cell(run.get("config_hash"))),
    ]
    parts.append("<table>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in fields) + "</table>")

    figures = [
        ("Throughput over time per worker", plot_throughput(metrics)),
        ("Padded batch lengths and padding", plot_lengths(metrics)),
        ("Row status counts", plot_status(status)),
        ("Slowest batches", plot_slowest(metrics)),
        ("Generation: finish reasons and tokens/s", plot_generation(metrics)),
    ]
    parts.append("<h2>This run</h2>")
    drawn = [(caption, uri) for caption, uri in figures if uri]
    if not drawn:
        parts.append("<p class='muted'>No per-batch metrics were recorded for this run.</p>")
    parts += [_figure_html(caption, uri) for caption, uri in drawn]
    slowest = metrics.get("slowest") or []
    if slowest:
        head = ("worker", "task", "seconds", "rows", "padded_length", "tokens", "padded_tokens")
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
                     + "".join("<tr>" + "".join(f"<td>{_cell(b.get(h))}</td>" for h in head) + "</tr>"
                               for b in slowest[:10]) + "</table>")

    if history:
        deviations = find_deviations(history, thresholds)
        parts.append(f"<h2>History: the last {len(history)} runs of {html.escape(str(run['job']))}</h2>")
        parts.append(
            f"<p class='muted'>A night is flagged when rows in drop more than {100 * thresholds.rows_drop:.0f}%, "
            f"throughput more than {100 * thresholds.throughput_drop:.0f}%, or the flagged share rises more than "
            f"{100 * thresholds.flagged_rise:.0f} points against the median of the finished runs before it.</p>")
        parts += [_figure_html(caption, uri) for caption, uri in plot_history(history, deviations)]
        head = ("ds", "run_id", "outcome", "rows_in", "rows_flagged", "docs_per_s", "seconds", "config_hash")
        rows_html = []
        for r in history:
            reasons = deviations.get(str(r["run_id"]), [])
            cells = "".join(f"<td>{_cell(r.get(h))}</td>" for h in head)
            note = "; ".join(html.escape(x) for x in reasons)
            rows_html.append(f"<tr class='{'flagged' if reasons else ''}'>{cells}"
                             f"<td class='{'flag' if reasons else ''}'>{note or 'ok'}</td></tr>")
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "<th>deviation</th></tr>"
                     + "".join(rows_html) + "</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _figure_html(caption: str, uri: str) -> str:
    return f"<figure><img alt='{html.escape(caption)}' src='{uri}'><figcaption>{html.escape(caption)}</figcaption></figure>"


def write_report(rows: Iterable[Mapping[str, Any]], path: str | Path, *, run_id: str | None = None,
                 history: int | None = None, thresholds: Thresholds = Thresholds()) -> Path:
    """Render the report of ``run_id`` (else the latest run) in ``rows`` to ``path``; returns the path."""
    run, recent = pick_runs(list(rows), run_id=run_id, history=history)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(run, recent, thresholds=thresholds), encoding="utf-8")
    return out


def report_main(target: str, *, out: str | None = None, history: int | None = None, runs_path: str | None = None,
                thresholds: Thresholds = Thresholds()) -> tuple[Path, str, dict[str, list[str]]]:
    """What ``pipeline report`` does: ``(the HTML file written, the run reported, deviations in the history)``."""
    path, rows, run_id = resolve_runs(target, runs_path=runs_path)
    run, recent = pick_runs(rows, run_id=run_id, history=history)
    default = Path(path.rstrip("/") + f"_report_{run['run_id']}.html") if "://" not in path else Path(
        f"report_{run['run_id']}.html")
    written = write_report(rows, out or default, run_id=run["run_id"], history=history, thresholds=thresholds)
    return written, str(run["run_id"]), (find_deviations(recent, thresholds) if recent else {})
