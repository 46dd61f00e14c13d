from __future__ import annotations

import numpy as np
import pytest

from pipeline.core.batching import (
    Batch, BatchSizeMemory, bucket_length, collate, pad_multiple, padded_length, padding_efficiency, plan_batches,
)


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


def test_worker_progress_prints_at_most_every_interval():
    import io

    from pipeline.core.metrics import WorkerCounts, WorkerProgress

    out = io.StringIO()
    progress = WorkerProgress("job worker 1", interval=3600, stream=out)
    counts = WorkerCounts(on_batch=progress)
    counts.add_batch(rows=4, tokens=40, padded_tokens=48)
    assert out.getvalue() == ""  # too soon
    progress.last -= 7200
    counts.add_batch(rows=2, tokens=10, padded_tokens=12)
    line = out.getvalue()
    assert line.startswith("[job worker 1] 6 rows in 2 batches") and line.count("\n") == 1


# -- token budget, bucket shapes, batch-size memory ------------------------------------------

def _check_partition(batches, n):
    seen = np.concatenate([b.indices for b in batches]) if batches else np.array([], dtype=np.int64)
    assert sorted(seen.tolist()) == list(range(n)), "every row in exactly one batch"


def test_token_budget_varies_rows_with_length():
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(3.5, 0.9, size=3000).astype(int), 3, 256)
    batches = plan_batches(lengths, batch_size=256, pad_to_multiple_of=1, max_length=256, token_budget=2048)
    _check_partition(batches, lengths.size)
    assert all(b.padded_tokens <= 2048 for b in batches)
    assert all(b.length == lengths[b.indices].max() for b in batches)
    # short rows travel in big batches, long rows in small ones
    assert batches[0].size > 8 * batches[-1].size
    assert max(b.size for b in batches) <= 256
    # greedy: a batch stops only when one more row would break the budget (or the row cap)
    order = np.concatenate([b.indices for b in batches])
    for b, nxt in zip(batches, batches[1:]):
        grown = max(b.length, int(lengths[nxt.indices[0]]))
        assert b.size == 256 or (b.size + 1) * grown > 2048
    assert np.all(np.diff(lengths[order]) >= 0)


def test_token_budget_gives_an_over_budget_row_its_own_batch():
    batches = plan_batches([4, 4, 4, 30], batch_size=8, pad_to_multiple_of=1, token_budget=12)
    assert [(b.indices.tolist(), b.length) for b in batches] == [([0, 1, 2], 4), ([3], 30)]


def test_bucket_shapes_pad_to_fixed_shapes_without_mixing():
    lengths = [5, 40, 31, 33, 64, 65, 200, 12]
    batches = plan_batches(lengths, batch_size=4, max_length=256, bucket_shapes=[32, 64, 128, 256])
    _check_partition(batches, len(lengths))
    assert [(sorted(np.asarray(lengths)[b.indices].tolist()), b.length) for b in batches] == [
        ([5, 12, 31], 32), ([33, 40, 64], 64), ([65], 128), ([200], 256),
    ]


def test_bucket_shapes_with_a_row_longer_than_every_shape():
    (batch,) = plan_batches([70], batch_size=4, pad_to_multiple_of=8, bucket_shapes=[32, 64])
    assert batch.length == 72
    assert bucket_length(33, [32, 64]) == 64 and bucket_length(60, [32, 64], cap=48) == 48


def test_bucket_shapes_and_budget_together():
    batches = plan_batches([10] * 10 + [50] * 3, batch_size=64, bucket_shapes=[16, 64], token_budget=64)
    assert [(b.size, b.length) for b in batches] == [(4, 16), (4, 16), (2, 16), (1, 64), (1, 64), (1, 64)]


def test_invalid_budget_and_shapes():
    with pytest.raises(ValueError, match="token_budget"):
        plan_batches([1], batch_size=2, token_budget=0)
    with pytest.raises(ValueError, match="bucket_shapes"):
        plan_batches([1], batch_size=2, bucket_shapes=[0, 32])


def test_batch_size_memory_is_per_length_bucket_and_only_shrinks():
    memory = BatchSizeMemory()
    assert memory.limit(100) is None
    memory.record_out_of_memory(length=100, rows=64)
    assert memory.limit(65) == memory.limit(128) == 32
    assert memory.limit(64) is None and memory.limit(129) is None
    memory.record_out_of_memory(length=120, rows=32)
    assert memory.limit(100) == 16
    memory.record_out_of_memory(length=100, rows=64)  # a stale, bigger failure never raises the limit
    assert memory.limit(100) == 16
    memory.record_out_of_memory(length=3, rows=1)
    assert memory.as_dict() == {16: 1, 128: 16}


def test_docstring_examples_hold():
    import doctest

    import pipeline.core.batching

    result = doctest.testmod(pipeline.core.batching)
    assert result.attempted >= 4 and result.failed == 0


def test_small_chunk_budget_only_for_a_chunk_smaller_than_a_batch():
    from pipeline.core.batching import small_chunk_budget

    lengths = [10] * 40 + [12] * 9 + [256]
    budget = small_chunk_budget(lengths, batch_size=64, multiple=8, cap=256)
    assert budget == 16 * 16  # a quarter batch of the median row (10 -> 16 with multiple 8)
    batches = plan_batches(lengths, batch_size=64, pad_to_multiple_of=8, max_length=256, token_budget=budget)
    assert [(b.size, b.length) for b in batches] == [(16, 16)] * 3 + [(1, 16), (1, 256)]  # one was 50 x 256
    assert small_chunk_budget([10] * 65, batch_size=64) is None  # larger chunks keep their batches
