"""Drift statistics (pipeline.core.drift): quiet on samples of one population, loud on the shifts that matter."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.drift import Limits, Verdict, chi2_sf, compare, kolmogorov_sf, pooled, psi
from pipeline.core.sketches import Profile


def _night(rng: np.random.Generator, n: int, *, shift: float = 0.0, empty: float = 0.0, turn: float = 0.0) -> dict:
    """A night's profile: statuses, lengths, a probability score, labels and 16-dim embeddings."""
    p = Profile()
    empty_rows = rng.random(n) < empty
    p.count("status", pa.array(np.where(empty_rows, "skipped_empty", "ok")))
    p.histogram("input_chars", rng.lognormal(4 + shift, 1.0, n), bins="log")
    p.histogram("score", rng.beta(5 + 4 * shift, 2, n), bins="unit")
    p.count("label", pa.array(rng.choice(["pos", "neg", "neu"], n, p=[0.5, 0.3, 0.2])))
    direction = np.zeros(16)
    direction[0], direction[1] = np.cos(turn), np.sin(turn)
    p.vectors("embedding", direction * 2 + rng.normal(size=(n, 16)) * 0.5)
    return p.data


@pytest.mark.parametrize("n", [60, 240, 5_000])
def test_nights_of_one_population_pass(n):
    rng = np.random.default_rng(n)
    flagged = []
    for _ in range(10):
        history = [_night(rng, n) for _ in range(3)]
        flagged += [f.line() for f in compare(_night(rng, n), history) if f.flagged]
    assert flagged == []


@pytest.mark.parametrize("n", [240, 5_000])
def test_the_shifts_that_matter_are_flagged(n):
    rng = np.random.default_rng(7)
    history = [_night(rng, n) for _ in range(2)]

    def moved(**change) -> set[str]:
        return {f.measure for f in compare(_night(rng, n, **change), history) if f.flagged}

    assert moved(empty=1 / 3) == {"status"}
    assert moved(shift=0.8) == {"input_chars", "score"}
    assert moved(turn=np.pi / 2) == {"embedding"}  # the same spread, another direction: another model


def test_a_measure_of_too_few_rows_or_missing_from_the_history_is_not_compared():
    rng = np.random.default_rng(3)
    small = compare(_night(rng, 20, empty=0.5), [_night(rng, 20)])
    assert small == []
    history = _night(rng, 500)
    del history["vec"]
    assert "embedding" not in {f.measure for f in compare(_night(rng, 500, turn=2.0), [history])}


def test_ignored_measures_are_shown_but_never_flagged():
    rng = np.random.default_rng(4)
    findings = compare(_night(rng, 2000, empty=0.4), [_night(rng, 2000)], Limits(ignore=frozenset({"status"})))
    status = [f for f in findings if f.measure == "status"]
    assert status and all(f.ignored and f.flagged for f in status)
    assert Verdict(tuple(findings), ("a",)).flagged == ()
    assert "[shown, not gated]" in status[0].line()


def test_a_centroid_of_another_size_is_flagged_and_pooling_keeps_the_newest_size():
    rng = np.random.default_rng(5)
    old, new = _night(rng, 200), _night(rng, 200)
    old["vec"]["embedding"] = {"n": 200, "sum": [0.0] * 8, "sq": 200.0}
    assert len(pooled([old, new])["vec"]["embedding"]["sum"]) == 16
    [finding] = [f for f in compare(new, [old]) if f.measure == "embedding"]
    assert finding.flagged and finding.change == "dimension 8 -> 16"


def test_the_top_k_overlap_is_compared_by_its_mean():
    def overlaps(mean: float, n: int = 400) -> dict:
        p = Profile()
        p.histogram("topk_overlap", np.random.default_rng(int(mean * 100)).binomial(10, mean, n) / 10, bins="unit")
        return p.data

    [same] = compare(overlaps(0.6), [overlaps(0.62)])
    [drop] = compare(overlaps(0.1), [overlaps(0.62)])
    assert same.test == "mean drop" and not same.flagged
    assert drop.flagged and drop.value == pytest.approx(0.83, abs=0.05) and drop.change.startswith("mean 0.6")


def test_the_p_values_agree_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    for x, dof in ((0.5, 1), (3.84, 1), (12.0, 5), (40.0, 9), (200.0, 19), (1e-3, 3)):
        assert chi2_sf(x, dof) == pytest.approx(stats.chi2.sf(x, dof), rel=1e-6, abs=1e-12)
    for lam in (0.3, 0.8, 1.36, 2.0):
        assert kolmogorov_sf(lam) == pytest.approx(stats.kstwobign.sf(lam), rel=1e-6)
    value, p = psi([30, 50, 20], [30, 50, 20])
    assert value == pytest.approx(0.0) and p == pytest.approx(1.0)
