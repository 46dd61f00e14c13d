"""Drift: a run's output profile against its job's recent runs, measure by measure, before anything is published.

The current run's sketch (:mod:`pipeline.core.sketches`) is compared with the pooled sketches of the history
runs, each measure with the test that fits its shape:

- a **categorical** measure (row statuses, labels, finish reasons, hashed item ids): the population
  stability index over its values (the 19 most frequent and the rest), with its two-sample chi-square
  test (``n1 n2 / (n1 + n2) * PSI`` is asymptotically chi-square with ``groups - 1`` degrees of freedom);
- a **histogram** (lengths, tokens, scores, confidence): the PSI over at most 10 groups cut at the
  history's deciles (the usual PSI binning, read off the fixed bins), and the two-sample
  Kolmogorov-Smirnov statistic read off the binned CDFs, with its asymptotic p-value;
- **vectors** (embeddings): the centroid's shift in units of the history's spread (the root of the total
  variance), with a chi-square test of one degree of freedom (conservative for any covariance);
- **top-K overlap** with the night before (recommendations): the drop of its mean against the history's,
  with a one-sided z-test.

A finding is flagged when its effect size passes its limit *and* its p-value is below
``Limits.p_value``: the effect size keeps a tiny but significant shift of a big night quiet, the
p-value keeps the noise of a small night quiet. The PSI of two samples of one population is not 0
but about ``(groups - 1) * (1/n1 + 1/n2)`` (its noise: 0.075 for two nights of 240 rows, where normal
nights of the test corpus reached 0.24), so a PSI is flagged when it passes its limit by more than
its noise; at a million rows the noise is nil and the limit is the usual 0.25.
Pure: numpy and the standard library.

>>> from pipeline.core.sketches import Profile
>>> night = lambda statuses: {"cat": {"status": statuses}}
>>> history = [night({"ok": 990, "skipped_empty": 10}), night({"ok": 985, "skipped_empty": 15})]
>>> [f.flagged for f in compare(night({"ok": 992, "skipped_empty": 8}), history)]
[False]
>>> print(compare(night({"ok": 660, "skipped_empty": 340}), history)[0].line())
status: PSI 1.21 > 0.25 (p < 1e-12): skipped_empty 1.2% -> 34.0%, ok 98.8% -> 66.0%
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.core.metrics import merge_counts
from pipeline.core.sketches import Histogram, Vectors, shares

__all__ = ["Finding", "Limits", "Verdict", "chi2_sf", "compare", "kolmogorov_sf", "ks", "pooled", "psi", "psi_noise"]

# measures compared by the drop of their mean rather than their shape
MEAN_DROP_MEASURES = frozenset({"topk_overlap"})
_CATEGORIES = 19  # most frequent values a categorical PSI keeps apart; the rest is one group
_GROUPS = 10  # histogram PSI groups, cut at the history's deciles


@dataclass(frozen=True)
class Limits:
    """When a finding is flagged (``run.quality`` holds these; the defaults pass a normal night)."""

    psi: float = 0.25
    ks: float = 0.2
    centroid: float = 0.5
    overlap_drop: float = 0.5
    p_value: float = 0.001
    min_rows: int = 30
    ignore: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Finding:
    """One test of one measure: its statistic, limit, p-value, what moved (in words) and whether it is flagged."""

    measure: str
    test: str
    value: float
    limit: float
    p_value: float | None
    change: str
    flagged: bool
    ignored: bool = False
    # what the statistic reads for two samples of one population of these sizes (PSI), taken off before the limit
    noise: float = 0.0

    def line(self) -> str:
        """``status: PSI 1.21 (noise 0.02) > 0.25 (p < 1e-12): skipped_empty 1.2% -> 34.0%``."""
        over = ">" if self.value - self.noise > self.limit else "<="
        noise = f" (noise {_num(self.noise)})" if self.noise >= 0.005 else ""
        p = "" if self.p_value is None else f" (p {_p(self.p_value)})"
        note = " [shown, not gated]" if self.ignored else ""
        return (f"{self.measure}: {self.test} {_num(self.value)}{noise} {over} {self.limit:g}{p}: "
                f"{self.change}{note}")


@dataclass(frozen=True)
class Verdict:
    """A run's profile against its history: the findings, the runs compared with, and a note when none were.

    ``reference`` is the pooled sketch of the history (the report plots the run against it);
    ``action``: what the gate did: ``passed``, ``warned`` (flagged and published), ``refused`` (flagged,
    nothing committed) or ``accepted`` (flagged and published with ``--accept-drift``: the history of
    later runs starts at it).
    """

    findings: tuple[Finding, ...] = ()
    history: tuple[str, ...] = ()
    note: str | None = None
    reference: dict[str, Any] = field(default_factory=dict)
    action: str = "passed"

    @property
    def flagged(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.flagged and not f.ignored)

    def headline(self) -> str:
        """One line: how many measures were checked against how many runs, and how many moved."""
        if self.note:
            return self.note
        moved = len({f.measure for f in self.flagged})
        measures = len({f.measure for f in self.findings})
        against = f"{measures} measure(s) against the last {len(self.history)} run(s)"
        return f"{moved} of {against} moved" if moved else f"no drift: {against}"

    def measures_moved(self) -> list[Finding]:
        """One finding per measure that moved: its test furthest past its limit."""
        worst: dict[str, Finding] = {}
        for f in self.flagged:
            if f.measure not in worst or f.value / f.limit > worst[f.measure].value / worst[f.measure].limit:
                worst[f.measure] = f
        return [worst[m] for m in sorted(worst)]

    def to_dict(self) -> dict[str, Any]:
        return {"findings": [asdict(f) for f in self.findings], "history": list(self.history), "note": self.note,
                "reference": self.reference, "action": self.action}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Verdict":
        return cls(tuple(Finding(**f) for f in data.get("findings") or ()), tuple(data.get("history") or ()),
                   data.get("note"), dict(data.get("reference") or {}), str(data.get("action") or "passed"))


def pooled(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The history's sketches added up; a night whose vectors differ in size from the newest is left out of those."""
    total: dict[str, Any] = {}
    for profile in reversed(history):  # newest first: its vector size wins
        try:
            merge_counts(total, {k: v for k, v in profile.items() if k != "vec"})
            merge_counts(total, {"vec": profile.get("vec") or {}})
        except ValueError:
            continue
    return total


def compare(current: Mapping[str, Any], history: Sequence[Mapping[str, Any]], limits: Limits = Limits(), *,
            reference: Mapping[str, Any] | None = None) -> list[Finding]:
    """Every measure of ``current`` that the history has too, tested (see the module docstring)."""
    ref = reference if reference is not None else pooled(history)
    findings: list[Finding] = []
    for name in sorted((current.get("cat") or {}).keys() & (ref.get("cat") or {}).keys()):
        findings += _categorical(name, current["cat"][name], ref["cat"][name], limits)
    for name in sorted((current.get("hist") or {}).keys() & (ref.get("hist") or {}).keys()):
        cur, old = Histogram.of(current, name), Histogram.of(ref, name)
        if cur is None or old is None or cur.bins != old.bins or min(cur.n, old.n) < limits.min_rows:
            continue
        test = _overlap if name in MEAN_DROP_MEASURES else _histogram
        findings += test(name, cur, old, limits)
    for name in sorted((current.get("vec") or {}).keys() & (ref.get("vec") or {}).keys()):
        cur_v, old_v = Vectors.of(current, name), Vectors.of(ref, name)
        if cur_v is not None and old_v is not None and min(cur_v.n, old_v.n) >= limits.min_rows:
            findings.append(_centroid(name, cur_v, old_v, limits))
    return [f if f.measure not in limits.ignore else _ignored(f) for f in findings]


def _ignored(f: Finding) -> Finding:
    return Finding(f.measure, f.test, f.value, f.limit, f.p_value, f.change, f.flagged, ignored=True, noise=f.noise)


def psi_noise(groups: int, n1: float, n2: float) -> float:
    """The PSI two samples of ``n1`` and ``n2`` values of one population read on average over ``groups`` groups.

    >>> round(psi_noise(10, 240, 240), 3), psi_noise(10, 1e6, 1e6) < 1e-4
    (0.075, True)
    """
    return (groups - 1) * (1.0 / max(n1, 1.0) + 1.0 / max(n2, 1.0))


def psi(current: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
    """``(PSI, p-value)`` of two count vectors over the same groups (half a count added to each: no log of 0).

    >>> value, p = psi([500, 500], [500, 500])
    >>> round(value, 6), round(p, 3)
    (0.0, 1.0)
    >>> value, p = psi([900, 100], [500, 500])
    >>> round(value, 3), p < 1e-12
    (0.876, True)
    """
    c, r = np.asarray(current, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    p, q = (c + 0.5) / (c + 0.5).sum(), (r + 0.5) / (r + 0.5).sum()
    value = float(((p - q) * np.log(p / q)).sum())
    n1, n2 = c.sum(), r.sum()
    if n1 <= 0 or n2 <= 0 or len(c) < 2:
        return value, 1.0
    return value, chi2_sf(float(value * n1 * n2 / (n1 + n2)), len(c) - 1)


def ks(current: Histogram, reference: Histogram) -> tuple[float, float]:
    """``(D, p-value)``: the two-sample Kolmogorov-Smirnov statistic of two histograms of one bin family.

    Read off the binned CDFs, D is at most the unbinned statistic (conservative).
    """
    bins = sorted(set(current.counts) | set(reference.counts))
    d = float(np.max(np.abs(current.cdf(bins) - reference.cdf(bins)))) if bins else 0.0
    n_eff = current.n * reference.n / max(current.n + reference.n, 1)
    return d, kolmogorov_sf((math.sqrt(n_eff) + 0.12 + 0.11 / math.sqrt(max(n_eff, 1e-9))) * d)


def chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for X chi-square with ``dof`` degrees of freedom (the regularised upper incomplete gamma).

    >>> round(chi2_sf(3.841459, 1), 4), round(chi2_sf(18.307, 10), 4)
    (0.05, 0.05)
    """
    if x <= 0:
        return 1.0
    a, y = dof / 2.0, x / 2.0
    log_front = -y + a * math.log(y) - math.lgamma(a)
    if y < a + 1:  # the series of the lower function
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= y / (a + n)
            total += term
            if term < total * 1e-15:
                break
        return min(1.0, max(0.0, 1.0 - total * math.exp(log_front)))
    b, c, d = y + 1.0 - a, 1e300, 1.0 / (y + 1.0 - a)  # the continued fraction of the upper one (Lentz)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = b + an / c
        c = c if abs(c) > 1e-300 else 1e-300
        h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return min(1.0, max(0.0, math.exp(log_front) * h))


def kolmogorov_sf(lam: float) -> float:
    """P(K > lam) for Kolmogorov's distribution (the asymptotic two-sample KS p-value).

    >>> round(kolmogorov_sf(1.358), 3), kolmogorov_sf(0.1)
    (0.05, 1.0)
    """
    if lam < 0.2:
        return 1.0
    total = 0.0
    for j in range(1, 101):
        term = 2.0 * (-1) ** (j - 1) * math.exp(-2.0 * j * j * lam * lam)
        total += term
        if abs(term) < 1e-16:
            break
    return min(1.0, max(0.0, total))


def _categorical(name: str, cur: Mapping[str, float], ref: Mapping[str, float], limits: Limits) -> list[Finding]:
    n_cur, n_ref = sum(cur.values()), sum(ref.values())
    if min(n_cur, n_ref) < limits.min_rows:
        return []
    share_c, share_r = shares(cur), shares(ref)
    by_mass = sorted(set(cur) | set(ref), key=lambda k: (-(share_c.get(k, 0) + share_r.get(k, 0)), k))
    kept, rest = by_mass[:_CATEGORIES], by_mass[_CATEGORIES:]
    c = [cur.get(k, 0) for k in kept] + ([sum(cur.get(k, 0) for k in rest)] if rest else [])
    r = [ref.get(k, 0) for k in kept] + ([sum(ref.get(k, 0) for k in rest)] if rest else [])
    value, p = psi(c, r)
    noise = psi_noise(len(c), n_cur, n_ref)
    # the two values that moved most (on a tie, the rarer before: a rare status growing is the news)
    def moved_by(k: str) -> tuple[float, float, str]:
        return -round(abs(share_c.get(k, 0) - share_r.get(k, 0)), 9), share_r.get(k, 0), k

    moved = sorted(by_mass, key=moved_by)[:2]
    change = ", ".join(f"{k} {100 * share_r.get(k, 0):.1f}% -> {100 * share_c.get(k, 0):.1f}%" for k in moved)
    return [Finding(name, "PSI", value, limits.psi, p, change, value - noise > limits.psi and p < limits.p_value,
                    noise=noise)]


def _histogram(name: str, cur: Histogram, ref: Histogram, limits: Limits) -> list[Finding]:
    cuts = _decile_cuts(ref)
    value, p = psi(_grouped(cur, cuts), _grouped(ref, cuts))
    noise = psi_noise(len(cuts) + 1, cur.n, ref.n)
    change = ", ".join(f"p{int(q * 100)} {_num(ref.quantile(q))} -> {_num(cur.quantile(q))}" for q in (0.1, 0.5, 0.9))
    d, p_ks = ks(cur, ref)
    return [Finding(name, "PSI", value, limits.psi, p, change, value - noise > limits.psi and p < limits.p_value,
                    noise=noise),
            Finding(name, "KS", d, limits.ks, p_ks, change, d > limits.ks and p_ks < limits.p_value)]


def _overlap(name: str, cur: Histogram, ref: Histogram, limits: Limits) -> list[Finding]:
    mean_c, mean_r = cur.mean(), ref.mean()
    drop = 1.0 - mean_c / mean_r if mean_r > 0 else 0.0
    var = (_variance(cur) / max(cur.n, 1)) + (_variance(ref) / max(ref.n, 1))
    z = (mean_r - mean_c) / math.sqrt(var) if var > 0 else (math.inf if mean_r > mean_c else 0.0)
    p = 0.5 * math.erfc(z / math.sqrt(2.0))
    change = f"mean {mean_r:.2f} -> {mean_c:.2f}"
    return [Finding(name, "mean drop", drop, limits.overlap_drop, p, change,
                    drop > limits.overlap_drop and p < limits.p_value)]


def _centroid(name: str, cur: Vectors, ref: Vectors, limits: Limits) -> Finding:
    if cur.centroid.shape != ref.centroid.shape:
        return Finding(name, "centroid shift", math.inf, limits.centroid, 0.0,
                       f"dimension {ref.centroid.size} -> {cur.centroid.size}", True)
    delta = float(np.linalg.norm(cur.centroid - ref.centroid))
    spread2 = max(ref.variance, cur.variance, 1e-24)
    shift = delta / math.sqrt(spread2)
    n_eff = cur.n * ref.n / (cur.n + ref.n)
    p = chi2_sf(n_eff * delta * delta / spread2, 1)
    norms = float(np.linalg.norm(cur.centroid) * np.linalg.norm(ref.centroid))
    cosine = float(cur.centroid @ ref.centroid) / norms if norms > 0 else 0.0
    change = f"centroid cosine {cosine:.3f}, spread {math.sqrt(ref.variance):.3g} -> {math.sqrt(cur.variance):.3g}"
    flagged = shift > limits.centroid and p < limits.p_value
    return Finding(name, "centroid shift", shift, limits.centroid, p, change, flagged)


def _decile_cuts(ref: Histogram) -> list[int]:
    """Bin indices where the PSI groups start (after the first): where the history's mass passes each tenth."""
    keys = sorted(ref.counts)
    cum = np.cumsum([ref.counts[k] for k in keys]) / max(ref.n, 1)
    cuts, step = [], 1
    for key, share in zip(keys[:-1], cum[:-1]):
        if share >= step / _GROUPS - 1e-12:
            cuts.append(key + 1)
            while step / _GROUPS <= share + 1e-12:
                step += 1
    return cuts


def _grouped(h: Histogram, cuts: Sequence[int]) -> np.ndarray:
    out = np.zeros(len(cuts) + 1)
    for key, count in h.counts.items():
        out[int(np.searchsorted(cuts, key, side="right"))] += count
    return out


def _variance(h: Histogram) -> float:
    mean = h.mean()
    return sum(c * (sum(h.bins.edges(i)) / 2 - mean) ** 2 for i, c in h.counts.items()) / max(h.n, 1)


def _num(x: float) -> str:
    """Three significant digits, no exponent for everyday sizes: ``0.25``, ``38``, ``1.2e+04``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def _p(p: float) -> str:
    return "< 1e-12" if p < 1e-12 else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"
