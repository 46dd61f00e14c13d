"""When a night deviates from the runs before it: rows in, throughput and flagged rows against their median.

Pure: the runs are the runs table's rows (:mod:`pipeline.records.runs`) as dicts,
oldest first; the report flags each deviating night in its history table and
plots (:mod:`pipeline.report.page`, :mod:`pipeline.report.plots`).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["Thresholds", "drift_reasons", "find_deviations", "flagged_share"]


@dataclass(frozen=True)
class Thresholds:
    """When a night deviates from the median of the runs before it (fractions: 0.2 = 20%)."""

    rows_drop: float = 0.2
    throughput_drop: float = 0.3
    flagged_rise: float = 0.05  # absolute rise of the flagged share of rows (0.05 = 5 points)
    min_previous: int = 2  # runs needed before a night can be judged


def find_deviations(runs: Sequence[Mapping[str, Any]], thresholds: Thresholds = Thresholds()) -> dict[str, list[str]]:
    """``{run_id: [reason, ...]}`` for each run that deviates from the median of the finished runs before it.

    Rows in dropped by more than ``rows_drop``, docs/s by more than
    ``throughput_drop``, or the flagged share of rows rose by more than
    ``flagged_rise``; a failed run is always flagged, and so is a run whose output the drift gate
    found moved (refused, or published with a warning or ``--accept-drift``: :mod:`pipeline.core.drift`).

    >>> runs = [{"run_id": str(i), "outcome": "ok", "rows_in": 100, "docs_per_s": 10.0, "rows_flagged": 1}
    ...         for i in range(3)]
    >>> runs.append({"run_id": "3", "outcome": "ok", "rows_in": 50, "docs_per_s": 10.0, "rows_flagged": 1})
    >>> find_deviations(runs)
    {'3': ['rows in 50 is 50% below the median 100 of the 3 runs before']}
    """
    out: dict[str, list[str]] = {}
    previous: list[Mapping[str, Any]] = []
    for run in runs:
        reasons = drift_reasons(run)
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
            flag_med = statistics.median(flagged_share(p) for p in previous)
            if flagged_share(run) > flag_med + thresholds.flagged_rise:
                reasons.append(f"flagged rows {100 * flagged_share(run):.1f}% against a median of "
                               f"{100 * flag_med:.1f}% in the {n} runs before")
        if reasons:
            out[str(run["run_id"])] = reasons
        if run.get("outcome") == "ok":
            previous.append(run)
    return out


def drift_reasons(run: Mapping[str, Any]) -> list[str]:
    """What moved in a run's output, as its drift verdict says (empty when nothing did or none was recorded).

    >>> drift = {"action": "refused", "findings": [{"measure": "status", "test": "PSI", "value": 1.8, "limit": 0.25,
    ...          "p_value": 0.0, "change": "skipped_empty 0.0% -> 33.3%", "flagged": True}]}
    >>> drift_reasons({"drift": json.dumps(drift)})
    ['drift (refused): status PSI 1.8 > 0.25: skipped_empty 0.0% -> 33.3%']
    """
    from pipeline.core.drift import Verdict

    try:
        verdict = Verdict.from_dict(json.loads(run.get("drift") or "{}"))
    except (ValueError, TypeError):
        return []
    return [f"drift ({verdict.action}): {f.measure} {f.test} {f.value:.3g} > {f.limit:g}: {f.change}"
            for f in verdict.measures_moved()]


def flagged_share(run: Mapping[str, Any]) -> float:
    """The flagged share of a run's rows in (0 for a run with none)."""
    rows = run.get("rows_in") or 0
    return (run.get("rows_flagged") or 0) / rows if rows else 0.0
