"""The top-K core: exactness against brute force, deterministic ties, seen exclusion, batch invariance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.recs.features import pack_lists
from pipeline.recs.scoring import mask_seen_, recommend_batches, top_k_desc


def _reference_top_k(scores: np.ndarray, k: int, seen: list[list[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: sort each row by (-score, position), drop seen and -inf, pad with -1 / NaN."""
    n, m = scores.shape
    pos = np.full((n, min(k, m)), -1, dtype=np.int64)
    val = np.full((n, min(k, m)), np.nan, dtype=np.float32)
    for i in range(n):
        banned = set(seen[i]) if seen else set()
        cands = [(-float(scores[i, j]), j) for j in range(m) if j not in banned and np.isfinite(scores[i, j])]
        for r, (neg, j) in enumerate(sorted(cands)[:k]):
            pos[i, r], val[i, r] = j, -neg
    return pos, val


def _run(scores: np.ndarray, k: int, batch_size: int, seen: list[list[int]] | None = None):
    table = torch.from_numpy(scores)
    packed = pack_lists(seen) if seen is not None else None
    return recommend_batches(scores.shape[0], lambda rows: table[torch.from_numpy(rows)].clone(),
                             k=k, batch_size=batch_size, seen=packed)


def test_top_k_breaks_ties_by_lower_position():
    scores = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0],
                           [5.0, 5.0, 5.0, 5.0, 5.0, 5.0]])
    values, positions = top_k_desc(scores, 3)
    assert positions.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert values.tolist() == [[3.0, 3.0, 3.0], [5.0, 5.0, 5.0]]
    _, positions = top_k_desc(scores, 4)
    assert positions.tolist() == [[1, 2, 4, 3], [0, 1, 2, 3]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    # Scores from a handful of values: most top-K boundaries fall inside a tie.
    scores = rng.integers(0, 4, size=(23, 17)).astype(np.float32)
    seen = [sorted(rng.choice(17, rng.integers(0, 6), replace=False).tolist()) for _ in range(23)]
    for k in (1, 5, 17, 30):
        pos, val = _run(scores, k, batch_size=4, seen=seen)
        ref_pos, ref_val = _reference_top_k(scores, k, seen)
        np.testing.assert_array_equal(pos, ref_pos)
        np.testing.assert_array_equal(val, ref_val)


def test_seen_items_are_never_recommended_and_short_rows_are_padded():
    scores = np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::-1].copy()  # position 0 best
    seen = [[0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    pos, val = _run(scores, k=3, batch_size=8, seen=seen)
    assert pos[0].tolist() == [4, 5, -1]
    assert np.isnan(val[0, 2])
    assert pos[1].tolist() == [-1, -1, -1]  # saw everything: nothing left to recommend


def test_nan_scores_rank_last():
    scores = np.array([[0.5, np.nan, 0.7, 0.1]], dtype=np.float32)
    pos, _ = _run(scores, k=4, batch_size=2)
    assert pos[0].tolist() == [2, 0, 3, -1]


def test_batch_size_does_not_change_results():
    rng = np.random.default_rng(3)
    users = torch.from_numpy(rng.standard_normal((37, 8)).astype(np.float32))
    items = torch.from_numpy(rng.standard_normal((50, 8)).astype(np.float32))
    seen = pack_lists([rng.choice(50, 5, replace=False) for _ in range(37)])
    results = [recommend_batches(37, lambda rows: users[torch.from_numpy(rows)] @ items.T, k=10,
                                 batch_size=b, seen=seen) for b in (1, 4, 16, 37, 64)]
    for pos, val in results[1:]:
        np.testing.assert_array_equal(pos, results[0][0])
        np.testing.assert_allclose(val, results[0][1], rtol=1e-6)


def test_mask_seen_only_touches_the_given_rows():
    scores = torch.zeros(3, 4)
    seen, offsets = pack_lists([[1], [0, 3], []])
    mask_seen_(scores, seen, offsets, np.array([1, 2]))  # batch rows are users 1 and 2
    assert torch.isinf(scores[0]).tolist() == [True, False, False, True]
    assert not torch.isinf(scores[1:]).any()


def test_no_users_gives_empty_results():
    pos, val = recommend_batches(0, lambda rows: torch.zeros(rows.size, 5), k=3, batch_size=4)
    assert pos.shape == (0, 3) and val.shape == (0, 3)
