from __future__ import annotations

import numpy as np
import pytest

from pipeline.batching import Batch, collate, pad_multiple, padded_length, padding_efficiency, plan_batches


def test_padded_length_rounds_up_and_caps():
    assert [padded_length(n) for n in (0, 1, 8, 9, 16, 17)] == [0, 8, 8, 16, 16, 24]
    assert padded_length(250, multiple=8, cap=256) == 256
    assert padded_length(255, multiple=8, cap=254) == 254
    assert padded_length(5, multiple=1) == 5


def test_every_row_in_exactly_one_batch_and_order_restorable():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 300, size=1003)
    batches = plan_batches(lengths, batch_size=64, max_length=512)
    seen = np.concatenate([b.indices for b in batches])
    assert sorted(seen.tolist()) == list(range(1003))
    # restoring order: scatter each batch's per-row value back at its indices
    restored = np.empty(1003, dtype=np.int64)
    for b in batches:
        restored[b.indices] = lengths[b.indices] * 10
    assert np.array_equal(restored, lengths * 10)


def test_ragged_last_batch_and_sizes():
    batches = plan_batches(list(range(1, 11)), batch_size=4)
    assert [b.size for b in batches] == [4, 4, 2]


def test_batches_are_length_sorted_and_padded_to_their_longest():
    lengths = [30, 3, 17, 3, 100, 9]
    batches = plan_batches(lengths, batch_size=2, pad_to_multiple_of=8)
    assert [sorted(np.asarray(lengths)[b.indices].tolist()) for b in batches] == [[3, 3], [9, 17], [30, 100]]
    assert [b.length for b in batches] == [8, 24, 104]
    # stable: equal lengths keep input order
    assert batches[0].indices.tolist() == [1, 3]


def test_unsorted_keeps_input_order():
    batches = plan_batches([5, 1, 9], batch_size=2, sort=False)
    assert [b.indices.tolist() for b in batches] == [[0, 1], [2]]


def test_one_row_and_empty_chunks():
    (only,) = plan_batches([7], batch_size=64)
    assert only.indices.tolist() == [0] and only.length == 8
    assert plan_batches([], batch_size=64) == []
    assert padding_efficiency([], []) == 1.0


def test_sorting_improves_padding_efficiency():
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(3.5, 0.9, size=5000).astype(int), 3, 512)
    plan = dict(batch_size=64, max_length=512, pad_to_multiple_of=1)
    sorted_eff = padding_efficiency(lengths, plan_batches(lengths, **plan))
    unsorted_eff = padding_efficiency(lengths, plan_batches(lengths, sort=False, **plan))
    rounded_eff = padding_efficiency(lengths, plan_batches(lengths, batch_size=64, max_length=512, pad_to_multiple_of=8))
    assert sorted_eff > 0.9
    assert unsorted_eff < 0.5
    # rounding short rows up to a multiple of 8 costs real padding
    assert unsorted_eff < rounded_eff < sorted_eff


def test_pad_multiple_auto_follows_the_device():
    assert pad_multiple("auto", "cuda") == 8
    assert pad_multiple("auto", "cpu") == 1
    assert pad_multiple(16, "cpu") == 16


def test_padding_efficiency_exact_value():
    lengths = [8, 4]
    batches = [Batch(np.array([0, 1]), 8)]
    assert padding_efficiency(lengths, batches) == pytest.approx(12 / 16)


def test_collate_pads_right_with_mask():
    ids, mask = collate([[1, 2, 3], [4]], Batch(np.array([1, 0]), 8), pad_id=0)
    assert ids.shape == (2, 8) and ids.dtype == np.int64
    assert ids[0].tolist() == [4, 0, 0, 0, 0, 0, 0, 0]
    assert ids[1].tolist()[:3] == [1, 2, 3]
    assert mask.sum(axis=1).tolist() == [1, 3]


def test_collate_refuses_rows_longer_than_the_batch():
    with pytest.raises(ValueError, match="has 3 tokens"):
        collate([[1, 2, 3]], Batch(np.array([0]), 2), pad_id=0)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches([1], batch_size=0)
    with pytest.raises(ValueError, match="one-dimensional"):
        plan_batches([[1, 2]], batch_size=2)
