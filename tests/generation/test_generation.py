"""The generation engine: static and continuous batching against unbatched ``model.generate``."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from tests.support.generation_models import CORPUS, build_model, build_tokenizer, reference_generate  # noqa: E402
from pipeline.generation import (  # noqa: E402
    BatchGenerator,
    GenerationRequest,
    SamplingParams,
    prefill_groups,
    row_seed,
)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    torch.set_num_threads(1)
    return build_model(tok)


def _prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    words = " ".join(CORPUS).split()
    return [tok(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))))["input_ids"] for _ in range(n)]


@pytest.fixture(scope="module")
def workload(tok, model):
    """13 prompts of 1-~60 tokens with budgets 1-18 and their unbatched greedy outputs."""
    prompts = _prompts(tok, 13)
    rng = random.Random(1)
    budgets = [rng.randint(1, 18) for _ in prompts]
    budgets[0] = 1  # a row that finishes in its prefill step
    reference = [reference_generate(model, tok, p, n) for p, n in zip(prompts, budgets)]
    return [GenerationRequest(p, n) for p, n in zip(prompts, budgets)], reference


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_greedy_equals_unbatched_generate(tok, model, workload, mode):
    requests, reference = workload
    gen = BatchGenerator(model, tok, mode=mode, slots=4, max_seq_len=128)
    results = gen.generate(requests)
    assert [r.token_ids for r in results] == reference
    assert [r.prompt_tokens for r in results] == [len(q.prompt_ids) for q in requests]
    for req, res in zip(requests, results):
        body = [t for t in res.token_ids if t != tok.eos_token_id]
        assert res.completion == tok.decode(body, skip_special_tokens=True)
        expected = "stop" if res.token_ids[-1] == tok.eos_token_id else "length"
        assert res.finish_reason == expected
        assert res.completion_tokens <= req.max_new_tokens
        assert res.latency_ms >= 0
    # the workload really exercises padding and slot refill, not a degenerate path
    assert len({len(q.prompt_ids) for q in requests}) > 5
    assert gen.stats["prefills"] > 13 / 4


def test_continuous_refills_slots_between_steps(tok, model, workload):
    requests, _ = workload
    static = BatchGenerator(model, tok, mode="static", slots=4, max_seq_len=128)
    continuous = BatchGenerator(model, tok, mode="continuous", slots=4, max_seq_len=128)
    static.generate(requests)
    continuous.generate(requests)
    # same work, fewer and fuller decode steps
    assert continuous.stats["decode_row_steps"] == static.stats["decode_row_steps"]
    assert continuous.stats["decode_steps"] < static.stats["decode_steps"]


def test_single_slot_and_more_slots_than_rows_agree(tok, model, workload):
    requests, reference = workload
    for slots in (1, 64):
        results = BatchGenerator(model, tok, mode="continuous", slots=slots, max_seq_len=128).generate(requests)
        assert [r.token_ids for r in results] == reference


def test_eos_token_stops_a_row(tok, model, workload):
    requests, reference = workload
    row = max(range(len(reference)), key=lambda i: len(reference[i]))
    gen = BatchGenerator(model, tok, mode="continuous", slots=3, max_seq_len=128)
    gen.eos_ids = frozenset({reference[row][2]})  # pretend the row's third token ends a sequence
    result = gen.generate(requests)[row]
    cut = reference[row].index(reference[row][2])
    assert result.finish_reason == "stop"
    assert result.token_ids == reference[row][: cut + 1]
    assert result.completion == tok.decode(reference[row][:cut], skip_special_tokens=True)


def test_stop_strings_cut_the_completion(tok, model, workload):
    requests, reference = workload
    row = max(range(len(reference)), key=lambda i: len(tok.decode(reference[i])))
    full = tok.decode(reference[row], skip_special_tokens=True)
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    gen = BatchGenerator(model, tok, mode="static", slots=4, max_seq_len=128,
                         sampling=SamplingParams(stop=(stop, "\x00never\x00")))
    result = gen.generate(requests)[row]
    assert result.finish_reason == "stop"
    assert result.completion == full[: full.index(stop)]
    assert stop not in result.completion
    assert len(result.token_ids) < len(reference[row])


def test_sampling_is_reproducible_per_row_across_batch_compositions(tok, model):
    prompts = _prompts(tok, 6, seed=7)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    requests = [GenerationRequest(p, 12, row_seed(42, f"row-{i}")) for i, p in enumerate(prompts)]
    everything = BatchGenerator(model, tok, mode="continuous", slots=2, max_seq_len=128, sampling=params)
    base = [r.token_ids for r in everything.generate(requests)]
    subset = [requests[4], requests[1], requests[3]]
    static = BatchGenerator(model, tok, mode="static", slots=3, max_seq_len=128, sampling=params)
    assert [r.token_ids for r in static.generate(subset)] == [base[4], base[1], base[3]]
    alone = BatchGenerator(model, tok, mode="static", slots=1, max_seq_len=128, sampling=params)
    assert alone.generate([requests[5]])[0].token_ids == base[5]
    # the seed matters: other seeds give other samples, and sampling is not greedy
    reseeded = [GenerationRequest(q.prompt_ids, 12, q.seed + 1) for q in requests]
    assert [r.token_ids for r in everything.generate(reseeded)] != base
    greedy = [reference_generate(model, tok, p, 12) for p in prompts]
    assert base != greedy


def test_requests_that_could_overflow_the_cache_are_refused(tok, model):
    gen = BatchGenerator(model, tok, slots=2, max_seq_len=16)
    with pytest.raises(ValueError, match="exceed max_seq_len 16"):
        gen.generate([GenerationRequest(list(range(10)), 7)])
    with pytest.raises(ValueError, match="empty prompt"):
        gen.generate([GenerationRequest([], 3)])


def test_prefill_groups_bound_padding():
    assert prefill_groups([60, 280, 58, 64, 250]) == [[2, 0, 3], [4, 1]]
    assert prefill_groups([]) == []
    groups = prefill_groups([5, 9, 14, 30, 31, 100])
    assert sorted(i for g in groups for i in g) == list(range(6))


def test_row_seed_is_stable_and_distinct():
    assert row_seed(0, "a") == row_seed(0, "a")
    assert len({row_seed(0, "a"), row_seed(1, "a"), row_seed(0, "b"), row_seed(0, 1), row_seed(0, "1")}) == 5
    assert 0 <= row_seed(123, "x") < 2**63


def test_slot_batch_cache_is_bounded_by_its_longest_row(tok, model):
    from pipeline.generation import SlotBatch

    batch, _ = SlotBatch.prefill(model, ["short", "long"], [[5, 6, 7], list(range(5, 15))], pad_id=tok.pad_token_id)
    assert batch.length == 10 and batch.mask.sum(-1).tolist() == [3, 10]
    batch.decode(model, [8, 9])
    batch.keep([0])  # the long row leaves: its padding columns go with it
    assert batch.rows == ["short"] and batch.length == 4
    assert all(layer.keys.shape[2] == 4 for layer in batch.cache.layers)
    newcomer, _ = SlotBatch.prefill(model, ["mid"], [list(range(5, 11))], pad_id=tok.pad_token_id)
    batch.merge(newcomer)
    assert batch.length == 6 and batch.mask.sum(-1).tolist() == [4, 6] and batch.next_pos.tolist() == [4, 6]
    assert all(layer.keys.shape[:3] == (2, 2, 6) for layer in batch.cache.layers)
