"""The report's quality section: the run's output profile against its history, plotted, and what moved.

Read from the run's ``profile`` and ``drift`` columns (:mod:`pipeline.core.sketches`, :mod:`pipeline.core.drift`):
the verdict and every test in a table (flagged ones first), then one plot per measure: a histogram's
shares per bin, this run against the pooled history it was compared with, and a categorical
measure's shares side by side. Plots as PNG data URIs, like :mod:`pipeline.report.plots`.
"""

from __future__ import annotations

import html
import json
from typing import Any, Mapping

from pipeline.core.drift import Verdict
from pipeline.report.plots import _figure, _png
from pipeline.core.sketches import Histogram

__all__ = ["plot_categorical", "plot_histogram", "quality_section"]

_MAX_PLOTS = 12
_CATEGORIES = 12


def _json(text: Any) -> dict[str, Any]:
    try:
        return json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {}


def quality_section(run: Mapping[str, Any]) -> list[str]:
    """HTML parts of the section (none when the run recorded no profile)."""
    profile, drift = _json(run.get("profile")), _json(run.get("drift"))
    if not profile and not drift:
        return []
    verdict = Verdict.from_dict(drift)
    parts = ["<h2>Output quality: the profile against the job's recent runs</h2>"]
    action = {"passed": "ok", "warned": "flag", "refused": "failed", "accepted": "started"}.get(verdict.action, "")
    against = f" (runs {html.escape(', '.join(verdict.history))})" if verdict.history else ""
    parts.append(f"<p><span class='{action}'>{html.escape(verdict.action)}</span>: "
                 f"{html.escape(verdict.headline())}{against}</p>")
    if verdict.findings:
        ordered = sorted(verdict.findings, key=lambda f: (not (f.flagged and not f.ignored), f.measure, f.test))
        head = ("measure", "test", "value", "noise", "limit", "p-value", "what moved", "")
        rows = []
        for f in ordered:
            moved = f.flagged and not f.ignored
            note = "moved" if moved else "shown, not gated" if f.ignored else ""
            cells = (f.measure, f.test, f"{f.value:.3g}", f"{f.noise:.2g}" if f.noise else "–", f"{f.limit:g}",
                     "–" if f.p_value is None else f"{f.p_value:.2g}", f.change, note)
            rows.append(f"<tr class='{'flagged' if moved else ''}'>"
                        + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")
    moved = {f.measure for f in verdict.flagged}
    plots = [(name, plot_histogram(profile, verdict.reference, name, moved=name in moved))
             for name in sorted((profile.get("hist") or {}), key=lambda n: (n not in moved, n))]
    plots += [(name, plot_categorical(profile, verdict.reference, name, moved=name in moved))
              for name in sorted((profile.get("cat") or {}), key=lambda n: (n not in moved, n))]
    for name, uri in [p for p in plots if p[1]][:_MAX_PLOTS]:
        parts.append(f"<figure><img alt='{html.escape(name)}' src='{uri}'><figcaption>{html.escape(name)}: this run "
                     "against its history</figcaption></figure>")
    return parts


def plot_histogram(profile: Mapping[str, Any], reference: Mapping[str, Any], name: str, *,
                   moved: bool = False) -> str | None:
    """The shares per bin of ``name`` in this run and in its history (when it has one)."""
    current = Histogram.of(profile, name)
    if current is None or not current.n:
        return None
    history = Histogram.of(reference, name) if reference else None
    fig, ax = _figure(7.5, 2.8)
    for hist, label, color in ((history, "history", "#8c8c8c"), (current, "this run", "#c44e52" if moved else "#4c72b0")):
        if hist is None or not hist.n:
            continue
        bins = sorted(hist.counts)
        xs = [hist.bins.edges(b)[0] for b in bins] + [hist.bins.edges(bins[-1])[1]]
        ys = [hist.counts[b] / hist.n for b in bins]
        ax.step(xs, ys + ys[-1:], where="post", label=f"{label} ({hist.n:,})", color=color)
    if current.bins.per_octave and max(current.counts) > 40:
        ax.set_xscale("symlog")
    ax.set(ylabel="share per bin", title=f"{name}{' (moved)' if moved else ''}")
    ax.legend(fontsize=7)
    return _png(fig)


def plot_categorical(profile: Mapping[str, Any], reference: Mapping[str, Any], name: str, *,
                     moved: bool = False) -> str | None:
    """The shares of the most frequent values of ``name`` in this run and in its history, side by side."""
    current = (profile.get("cat") or {}).get(name) or {}
    history = ((reference or {}).get("cat") or {}).get(name) or {}
    total_c, total_h = sum(current.values()), sum(history.values())
    if not total_c:
        return None
    share = {k: current.get(k, 0) / total_c + (history.get(k, 0) / total_h if total_h else 0)
             for k in set(current) | set(history)}
    names = sorted(share, key=lambda k: (-share[k], k))[:_CATEGORIES]
    fig, ax = _figure(7.5, 0.8 + 0.3 * len(names))
    positions = range(len(names))
    if total_h:
        ax.barh([p + 0.2 for p in positions], [history.get(k, 0) / total_h for k in names], height=0.4,
                color="#8c8c8c", label=f"history ({total_h:,})")
    ax.barh([p - 0.2 for p in positions], [current.get(k, 0) / total_c for k in names], height=0.4,
            color="#c44e52" if moved else "#4c72b0", label=f"this run ({total_c:,})")
    ax.set_yticks(list(positions), names, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="share", title=f"{name}{' (moved)' if moved else ''}")
    ax.legend(fontsize=7)
    return _png(fig)
