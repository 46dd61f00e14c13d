"""The precision gate's findings as values: one precision's check against fp32, the verdict of a load.

:class:`GateCheck` is one precision measured on the calibration sample (or
replayed from a remembered verdict, :mod:`pipeline.models.verdicts`);
:class:`GateResult` is what a load decided, and the counts the run's summary
prints from it. Plain values (numpy, no torch), written to and read back from verdict files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pipeline.config import AccuracyGateConfig
from pipeline.errors import PrecisionGateError

__all__ = ["GateCheck", "GateResult", "agreement", "gate_error", "passes"]

# the precisions the gate checks (fp32 is the reference)
CHECKED = ("int8", "bf16", "fp16")


@dataclass(frozen=True)
class GateCheck:
    """One precision measured against fp32 on the calibration sample (``rows`` texts, from ``sample``).

    ``remembered``: the date of the verdict this check was replayed from (:mod:`pipeline.models.verdicts`);
    empty when it was measured by this load.
    """

    precision: str
    mean_cosine: float
    top_label_agreement: float | None  # None: the task has no labels to compare
    passed: bool
    rows: int = 0
    sample: str = "calibration texts"
    speedup: float | None = None  # auto: fp32's time on the sample over this precision's (> 1: faster)
    remembered: str = ""

    @property
    def kept(self) -> bool:
        """Passed, and (where timed, for ``auto``) faster than fp32."""
        return self.passed and (self.speedup is None or self.speedup > 1.0)

    def describe(self) -> str:
        label = "" if self.top_label_agreement is None else f", top-label agreement {self.top_label_agreement:.4f}"
        on = f" on {self.rows} {self.sample}" if self.rows else ""
        speed = "" if self.speedup is None else f", {self.speedup:.2f}x fp32's speed"
        verdict = "FAIL" if not self.passed else "pass" if self.kept else "pass, but not faster than fp32"
        when = f"; remembered verdict from {self.remembered}" if self.remembered else ""
        return f"{self.precision}: mean cosine {self.mean_cosine:.6f}{label}{speed}{on} ({verdict}{when})"

    def record(self) -> dict[str, Any]:
        """What a verdict file keeps of this check (:meth:`from_record` reads it back)."""
        return {"precision": self.precision, "mean_cosine": self.mean_cosine,
                "top_label_agreement": self.top_label_agreement, "passed": self.passed, "rows": self.rows,
                "sample": self.sample, "speedup": self.speedup}

    @classmethod
    def from_record(cls, record: Any, *, gate: AccuracyGateConfig, remembered: str) -> "GateCheck":
        """The check a verdict file kept, its types and its pass checked again against ``gate``'s thresholds;
        ValueError on anything else (a damaged or edited file is measured again, never trusted)."""
        if not isinstance(record, dict) or set(record) != {"precision", "mean_cosine", "top_label_agreement",
                                                           "passed", "rows", "sample", "speedup"}:
            raise ValueError(f"not a gate check: {record!r}")
        check = cls(**record, remembered=remembered)
        numbers = [check.mean_cosine] + [x for x in (check.top_label_agreement, check.speedup) if x is not None]
        if (check.precision not in CHECKED or not isinstance(check.passed, bool) or not isinstance(check.sample, str)
                or type(check.rows) is not int or check.rows < 0
                or not all(type(x) in (int, float) and np.isfinite(x) for x in numbers)):
            raise ValueError(f"not a gate check: {record!r}")
        if check.passed != passes(check.mean_cosine, check.top_label_agreement, gate):
            raise ValueError(f"gate check {record!r} does not follow from its figures and the thresholds")
        return check


def passes(cosine: float, top: float | None, gate: AccuracyGateConfig) -> bool:
    return cosine >= gate.min_mean_cosine and (top is None or top >= gate.min_top_label_agreement)


@dataclass(frozen=True)
class GateResult:
    """What the gate decided: the precision requested, the one used, and every check on the way."""

    requested: str
    precision: str
    checks: tuple[GateCheck, ...] = field(default_factory=tuple)

    @property
    def remembered(self) -> bool:
        """Replayed from a remembered verdict, not measured by this load (:mod:`pipeline.models.verdicts`)."""
        return bool(self.checks) and all(c.remembered for c in self.checks)

    @property
    def fell_back(self) -> bool:
        """A requested precision that failed the gate (``auto`` never falls back: it picks)."""
        return self.requested != "auto" and self.precision != self.requested

    def counts(self) -> dict[str, Any]:
        """For the WorkerCounts accumulator: the precision each load ended on, every check's figures, any fallback."""
        out: dict[str, Any] = {"precision_used": {self.precision: 1}}
        if self.checks:
            out["precision_checks"] = {c.describe(): 1 for c in self.checks}
        if self.requested == "auto":
            when = f" (remembered verdict from {self.checks[0].remembered})" if self.remembered else ""
            out["precision_auto"] = {f"auto -> {self.precision}{when}": 1}
        if self.fell_back:
            failed = "; ".join(c.describe() for c in self.checks if not c.passed)
            out["precision_fallbacks"] = {f"{self.requested}->{self.precision} ({failed})": 1}
        return out


def agreement(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
              top_labels: Callable[[dict[str, np.ndarray]], np.ndarray | None]) -> tuple[float, float | None]:
    """``(mean cosine, top-label agreement)`` of ``candidate`` outputs against ``reference`` (row by row).

    The cosine is averaged over rows of every output array (embeddings,
    probabilities); ``top_labels`` maps outputs to one label index per row
    (None when the task has no labels).
    """
    cosines = []
    for name, ref in reference.items():
        a = ref.reshape(ref.shape[0], -1).astype(np.float64)
        b = candidate[name].reshape(a.shape[0], -1).astype(np.float64)
        denom = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
        cosines.append((a * b).sum(1) / np.where(denom == 0, 1.0, denom))
    mean_cosine = float(np.concatenate(cosines).mean()) if cosines else 1.0
    ref_top, cand_top = top_labels(reference), top_labels(candidate)
    top = None if ref_top is None or cand_top is None else float((ref_top == cand_top).mean())
    return mean_cosine, top


def gate_error(requested: str, check: GateCheck, gate: AccuracyGateConfig) -> PrecisionGateError:
    return PrecisionGateError(
        f"model.precision {requested} failed the accuracy gate on {check.rows} {check.sample} "
        f"({check.describe()}; thresholds: mean cosine >= {gate.min_mean_cosine}, top-label agreement >= "
        f"{gate.min_top_label_agreement}); use a safer precision, relax model.accuracy_gate, or set "
        "model.accuracy_gate.on_fail: fallback"
    )
