"""The report's HTML page: the run's figures and tables, and its job's history with deviating nights flagged.

One self-contained string (CSS inline, plots as PNG data URIs from
:mod:`pipeline.report.plots`), so the file can be mailed, attached to an
MLflow run or opened from object storage.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from typing import Any, Mapping, Sequence

from pipeline.report.deviations import Thresholds, find_deviations
from pipeline.report.plots import (
    plot_generation, plot_history, plot_lengths, plot_slowest, plot_status, plot_throughput,
)
from pipeline.report.quality import quality_section

__all__ = ["render_report"]


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f4f4f4} .ok{color:#2e7d32;font-weight:600} .failed,.flag,.refused{color:#c62828;font-weight:600}
.started,.submitted{color:#ef6c00;font-weight:600} figure{margin:12px 0} figcaption{font-size:12px;color:#555}
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
        *_batch_api_field(run),
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
    parts += quality_section(run)

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


def _batch_api_field(run: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The row of a served model's batch-mode run: its batches, their states, the tokens and the wait."""
    from pipeline.core.run_summary import batch_api_line

    facts = _json(run.get("batch_api"))
    return [("batch API", html.escape(batch_api_line(facts)))] if facts else []


def _figure_html(caption: str, uri: str) -> str:
    return f"<figure><img alt='{html.escape(caption)}' src='{uri}'><figcaption>{html.escape(caption)}</figcaption></figure>"
