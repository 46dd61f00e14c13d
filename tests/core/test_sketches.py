"""The output profile's sketches (pipeline.core.sketches): they add up whatever the split, travel as JSON, read back."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.metrics import merge_counts
from pipeline.core.sketches import BINS, Histogram, Profile, Vectors, item_buckets


def _profile(lengths: np.ndarray, scores: np.ndarray, labels: list[str], vectors: np.ndarray) -> Profile:
    p = Profile()
    p.histogram("tokens", lengths, bins="log")
    p.histogram("score", scores, bins="unit")
    p.count("label", pa.array(labels))
    p.vectors("embedding", vectors)
    return p


def test_the_profile_of_a_run_is_the_sum_of_its_tasks_whatever_the_split():
    rng = np.random.default_rng(0)
    n = 1000
    lengths, scores = rng.integers(0, 5000, n), rng.random(n)
    labels, vectors = list(rng.choice(["a", "b", "c"], n)), rng.normal(size=(n, 8))
    whole = _profile(lengths, scores, labels, vectors).data
    merged: dict = {}
    for part in np.array_split(np.arange(n), 7):  # seven tasks, each a JSON string on its last row
        sketch = _profile(lengths[part], scores[part], [labels[i] for i in part], vectors[part]).data
        merge_counts(merged, json.loads(json.dumps(sketch)))
    assert merged["hist"] == whole["hist"] and merged["cat"] == whole["cat"]
    assert merged["vec"]["embedding"]["n"] == n
    assert merged["vec"]["embedding"]["sum"] == pytest.approx(whole["vec"]["embedding"]["sum"])
    assert merged["vec"]["embedding"]["sq"] == pytest.approx(whole["vec"]["embedding"]["sq"])


@pytest.mark.parametrize("family, values", [
    ("log", np.random.default_rng(1).lognormal(4, 1.5, 20_000)),
    ("unit", np.random.default_rng(2).beta(2, 5, 20_000)),
    ("signed", np.random.default_rng(3).uniform(-0.4, 0.9, 20_000)),
])
def test_quantiles_read_off_the_bins_are_good_to_a_bin(family, values):
    p = Profile()
    p.histogram("m", values, bins=family)
    hist = Histogram.of(p.data, "m")
    assert hist.n == values.size and hist.bins is BINS[family]
    for q in (0.1, 0.5, 0.9, 0.99):
        exact = float(np.quantile(values, q))
        lo, hi = hist.bins.edges(int(hist.bins.index(np.array([exact]))[0]))
        assert abs(hist.quantile(q) - exact) <= (hi - lo) * 1.01, (q, exact, hist.quantile(q))


def test_nulls_nan_and_empty_inputs_add_nothing():
    p = Profile()
    p.histogram("m", pa.array([None, 1.0, None], pa.float64()), bins="log")
    p.histogram("m", np.array([np.nan]), bins="log")
    p.count("label", pa.array([None, None], pa.string()))
    p.vectors("embedding", np.zeros((0, 4)))
    p.inputs(pa.array(["abc", None, ""]))
    assert Histogram.of(p.data, "m").n == 1 and "label" not in p.data.get("cat", {})
    assert Vectors.of(p.data, "embedding") is None
    assert Histogram.of(p.data, "input_chars").n == 2  # an empty text has a length (0); a null has none


def test_rows_counts_statuses_and_the_tokens_of_scored_rows_only():
    p = Profile()
    p.rows(pa.record_batch({"n_tokens": pa.array([5, 0, 7, 0], pa.int32()),
                            "status": ["ok", "skipped_empty", "truncated", "error"]}))
    assert p.data["cat"]["status"] == {"ok": 1, "skipped_empty": 1, "truncated": 1, "error": 1}
    assert Histogram.of(p.data, "tokens").n == 2


def test_item_buckets_are_stable_and_bounded():
    ids = np.arange(1, 100_001)
    buckets = item_buckets(ids)
    assert buckets.min() >= 0 and buckets.max() < 1024 and len(np.unique(buckets)) == 1024
    assert np.bincount(buckets).max() < 3 * ids.size / 1024  # consecutive ids spread over the buckets
    assert (item_buckets(ids[::-1])[::-1] == buckets).all()
    with pytest.raises(ValueError, match="power of two"):
        item_buckets(ids, 1000)


def test_merging_vectors_of_two_sizes_is_refused():
    with pytest.raises(ValueError, match="a list of 3 numbers to one of 2"):
        merge_counts({"sum": [1.0, 2.0]}, {"sum": [1.0, 2.0, 3.0]})
