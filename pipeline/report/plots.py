"""The report's plots, each a PNG data URI (None when the run recorded nothing to draw).

Drawn from the runs table's ``batch_metrics`` (:func:`pipeline.core.metrics.batch_metrics`)
and status counts with matplotlib's Agg backend, imported only when a plot
is drawn, so no display is needed and ``import pipeline`` stays light.
"""

from __future__ import annotations

import base64
import io
from typing import Any, Mapping, Sequence

from pipeline.report.deviations import flagged_share

__all__ = ["plot_generation", "plot_history", "plot_lengths", "plot_slowest", "plot_status", "plot_throughput"]


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
        values = [(flagged_share(r) * scale) if key == "flagged_pct" else (r.get(key) or 0.0) for r in runs]
        ax.plot(labels, values, "o-", color="#4c72b0")
        ax.scatter([lab for lab, f in zip(labels, flagged) if f], [v for v, f in zip(values, flagged) if f],
                   color="#c44e52", zorder=3, s=60, label="flagged")
        ax.set(title=title)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        if any(flagged):
            ax.legend(fontsize=7)
        out.append((title, _png(fig)))
    return out
