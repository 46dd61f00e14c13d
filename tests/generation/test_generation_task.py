"""``GenerateTask``: config, loading from a model folder, ``process`` on Arrow chunks."""

from __future__ import annotations

import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from tests.support.generation_models import (  # noqa: E402
    POISON, generate_job, reference_generate, save_mismatched_folder, save_model_folder,
)
from pipeline.config import ConfigError, ModelConfig, BatchingConfig, build_config  # noqa: E402
from pipeline.tasks.generate import GenerateTaskConfig  # noqa: E402
from pipeline.core.metrics import WorkerCounts  # noqa: E402
from pipeline.tasks import build_task  # noqa: E402
from pipeline.tasks.generate import GenerateTask  # noqa: E402

LONG = " ".join(f"word{i}" for i in range(300))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return save_model_folder(tmp_path_factory.mktemp("models") / "tiny-llama")


def _task(model_dir, **overrides) -> GenerateTask:
    config = GenerateTaskConfig(**{"backend": "transformers", "template": "Review of {title}: {text}",
                                   "max_input_tokens": 48, "max_new_tokens": 6, "slots": 2, **overrides})
    return build_task(config, model=ModelConfig(path=str(model_dir)), batching=BatchingConfig())


def _chunk() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": [1, 2, 3, 4, 5, 6, 7],
        "title": ["Heat", "Up", None, "Big", "Tron", "Jaws", "Alien"],
        "text": ["the film is funny", "a dull mess", "smart and moving", "  ", LONG, "the story drags", "superb"],
        "budget": [3, None, 4, 5, 2, 9, 1],
    })


def test_config_is_part_of_the_job_union(tmp_path):
    job = build_config({
        "job": "gen", "source": {"path": "x"}, "model": {"path": "m"}, "sink": {"path": "y"},
        "task": {"kind": "generate", "template": "{text}", "mode": "static", "stop": ["\n"]},
    })
    assert isinstance(job.task, GenerateTaskConfig) and job.task.mode == "static"
    with pytest.raises(ConfigError, match="task.slot: unknown key"):
        build_config({"job": "gen", "source": {"path": "x"}, "model": {"path": "m"}, "sink": {"path": "y"},
                      "task": {"kind": "generate", "slot": 4}})
    with pytest.raises(ValueError, match="max_new_tokens_limit"):
        GenerateTaskConfig(max_new_tokens=300, max_new_tokens_limit=256)


def test_input_columns_and_schema(model_dir):
    task = _task(model_dir, max_new_tokens_column="budget", seed_column="id")
    assert task.input_columns == ("title", "text", "budget", "id")
    assert task.output_schema().names == [
        "completion", "prompt_tokens", "completion_tokens", "finish_reason", "latency_ms",
        "n_tokens", "truncated", "status", "error",
    ]


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_process_end_to_end(model_dir, mode):
    task = _task(model_dir, mode=mode, max_new_tokens_column="budget")
    loaded = task.load(model_dir, "cpu")
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(), counts).to_pydict()

    assert out["status"] == ["ok", "ok", "skipped_null", "skipped_empty", "truncated", "ok", "ok"]
    assert out["truncated"] == [False, False, False, False, True, False, False]
    for skipped in (2, 3):
        assert out["completion"][skipped] is None and out["finish_reason"][skipped] is None
        assert out["n_tokens"][skipped] == 0
    # every generated row equals unbatched greedy generate on its own prompt, in input order
    budgets = [3, 6, None, None, 2, 9, 1]
    chunk = _chunk().to_pydict()
    for i in (0, 1, 4, 5, 6):
        prompt = loaded.prompts.build({"title": chunk["title"][i], "text": chunk["text"][i]})
        ref = reference_generate(loaded.generator.model, loaded.tokenizer, prompt.token_ids, budgets[i])
        body = [t for t in ref if t != loaded.tokenizer.eos_token_id]
        assert out["completion"][i] == loaded.tokenizer.decode(body, skip_special_tokens=True)
        assert out["completion_tokens"][i] == len(ref)
        assert out["prompt_tokens"][i] == out["n_tokens"][i] == len(prompt.token_ids)
        assert out["finish_reason"][i] == ("stop" if len(body) < len(ref) else "length")
        assert out["latency_ms"][i] >= 0
    assert out["prompt_tokens"][4] <= 48
    assert counts.counts["rows"] == 7
    assert counts.counts["status"] == {"ok": 4, "skipped_null": 1, "skipped_empty": 1, "truncated": 1}
    assert counts.counts["completion_tokens"] == sum(out["completion_tokens"][i] for i in (0, 1, 4, 5, 6))


def test_progress_lines_as_rows_finish(model_dir):
    import io

    from pipeline.core.metrics import WorkerProgress

    task = _task(model_dir)
    stream = io.StringIO()
    counts = WorkerCounts(on_batch=WorkerProgress("gen worker 1", 0.0, stream=stream))
    task.process(task.load(model_dir, "cpu"), _chunk(), counts)
    lines = stream.getvalue().splitlines()
    # one line per generated row (interval 0), counting up, before the chunk is done
    assert [line.split("] ")[1].split(" rows")[0] for line in lines] == ["1", "2", "3", "4", "5"]
    assert all("rows/s" in line and "tokens/s" in line for line in lines)


def test_bad_rows_are_flagged_not_dropped(model_dir):
    task = _task(model_dir, max_new_tokens_column="budget")
    loaded = task.load(model_dir, "cpu")
    chunk = pa.RecordBatch.from_pydict({"title": ["A", "B"], "text": ["fine", "also fine"], "budget": [0, 500]})
    out = task.process(loaded, chunk, WorkerCounts()).to_pydict()
    assert out["status"] == ["error", "ok"]
    assert "positive" in out["error"][0] and out["finish_reason"][0] == "error"
    assert out["completion_tokens"][1] <= task.config.max_new_tokens_limit
    empty = task.process(loaded, chunk.slice(0, 0), WorkerCounts())
    assert empty.num_rows == 0 and empty.schema == task.output_schema()
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['budget'\]"):
        task.process(loaded, pa.RecordBatch.from_pydict({"title": ["A"], "text": ["x"]}), WorkerCounts())


def test_rows_without_content_are_flagged_not_generated(model_dir):
    task = _task(model_dir)
    loaded = task.load(model_dir, "cpu")
    chunk = pa.RecordBatch.from_pydict({
        # the byte-level tokenizer reads any byte, so NULs and U+FFFD are caught on the text; literal special
        # tokens only on the tokens. A title with content keeps a content-free text's row (the prompt's user text)
        "title": ["Heat", "\x00" * 50, "\ufffd\u200b", "<|eos|>", "Up", "Big"],
        "text": ["the film is funny", "\x00" * 50, "\ufffd" * 40, "<|im_end|><|pad|>", "\x00" * 5, "a\x00"],
    })
    counts = WorkerCounts()
    out = task.process(loaded, chunk, counts).to_pydict()
    assert out["status"] == ["ok", "skipped_no_content", "skipped_no_content", "skipped_no_content", "ok", "ok"]
    assert [out["completion"][i] for i in (1, 2, 3)] == [None] * 3 and out["error"][1:4] == [None] * 3
    assert counts.counts["status"] == {"ok": 3, "skipped_no_content": 3}
    assert sum(counts.counts["finish_reasons"].values()) == 3


def test_malformed_source_lines_are_flagged_not_generated(model_dir):
    task = _task(model_dir)
    chunk = pa.RecordBatch.from_pydict({"title": ["Heat", None], "text": ["the film is funny", None],
                                        "_malformed": [None, '{"title": "Up", "te']})
    counts = WorkerCounts()
    out = task.process(task.load(model_dir, "cpu"), chunk, counts).to_pydict()
    assert out["status"] == ["ok", "malformed"] and "could not parse it as JSON" in out["error"][1]
    assert out["completion"][1] is None and counts.counts["status"] == {"ok": 1, "malformed": 1}


def test_binary_columns_are_decoded_leniently(model_dir):
    task = _task(model_dir)
    chunk = pa.RecordBatch.from_pydict({"title": pa.array([b"Heat", b"Up"], pa.binary()),
                                        "text": pa.array([b"the film is funny", b"\xff\xfe" * 3], pa.binary())})
    out = task.process(task.load(model_dir, "cpu"), chunk, WorkerCounts()).to_pydict()
    # decoded as text (not "b'...'"); only invalid bytes is U+FFFD only: flagged with the title's row kept
    assert out["status"] == ["ok", "ok"]
    loaded = task.load(model_dir, "cpu")
    decoded = task.process(loaded, pa.RecordBatch.from_pydict({"title": ["Heat"], "text": ["the film is funny"]}),
                           WorkerCounts()).to_pydict()
    assert out["completion"][0] == decoded["completion"][0] and out["prompt_tokens"][0] == decoded["prompt_tokens"][0]
    blank = pa.RecordBatch.from_pydict({"title": pa.array([b"\xff"], pa.binary()),
                                        "text": pa.array([b"\xff\xfe" * 20], pa.binary())})
    assert task.process(loaded, blank, WorkerCounts()).column("status").to_pylist() == ["skipped_no_content"]


def test_a_tokenizer_that_does_not_match_the_model_flags_its_rows(tmp_path):
    model_dir = save_mismatched_folder(tmp_path / "mismatched")
    task = _task(model_dir)
    chunk = pa.RecordBatch.from_pydict({"title": ["A", "B", "C"], "text": ["fine", f"bad {POISON} row", "also fine"]})
    counts = WorkerCounts()
    out = task.process(task.load(model_dir, "cpu"), chunk, counts).to_pydict()
    assert out["status"] == ["ok", "error", "ok"] and "does not match the model" in out["error"][1]
    assert out["completion"][1] is None and all(out["completion_tokens"][i] >= 1 for i in (0, 2))


@pytest.mark.parametrize("fault, status", [
    ({"poison_marker": "XPOISONX"}, ["ok", "error", "ok"]),  # a row that breaks any batch it is in
    ({"oom_above_rows": 1}, ["ok", "ok", "ok"]),  # a batch too big for memory: each row alone fits
])
def test_a_failing_batch_is_retried_row_by_row(model_dir, fault, status):
    from pipeline.core import faults

    task = _task(model_dir)
    loaded = task.load(model_dir, "cpu")
    chunk = pa.RecordBatch.from_pydict({"title": ["A", "B", "C"], "text": ["fine", "XPOISONX row", "also fine"]})
    clean = task.process(loaded, chunk, WorkerCounts()).to_pydict()
    faults.activate(fault)
    try:
        counts = WorkerCounts()
        out = task.process(loaded, chunk, counts).to_pydict()
    finally:
        faults.activate(None)
    assert out["status"] == status and counts.counts["generate_batch_failures"] == 1
    for i, s in enumerate(status):  # rows that passed alone are exactly what the batch would have given
        if s == "ok":
            assert out["completion"][i] == clean["completion"][i]
        else:
            assert "this row alone: InjectedFaultError" in out["error"][i] and out["completion"][i] is None


def test_sampled_rows_reproduce_per_row_seed(model_dir):
    task = _task(model_dir, temperature=1.0, seed=3, seed_column="id", max_new_tokens=8)
    loaded = task.load(model_dir, "cpu")
    chunk = _chunk().select(["id", "title", "text"])
    full = task.process(loaded, chunk, WorkerCounts()).to_pydict()["completion"]
    reordered = task.process(loaded, chunk.take(pa.array([6, 0, 5])), WorkerCounts()).to_pydict()["completion"]
    assert reordered == [full[6], full[0], full[5]]
    other = _task(model_dir, temperature=1.0, seed=4, seed_column="id", max_new_tokens=8)
    assert other.process(other.load(model_dir, "cpu"), chunk, WorkerCounts()).to_pydict()["completion"] != full


def test_kv_cache_budget_is_enforced(model_dir):
    task = _task(model_dir, slots=64, max_new_tokens_limit=4096, max_kv_cache_mb=1)
    with pytest.raises(ValueError, match="lower task.slots"):
        task.load(model_dir, "cpu")


def test_generate_job_on_spark_writes_completions_to_delta(any_spark, tmp_path, model_dir):
    """The generate task through the real Spark glue and Delta sink, like conf/generate_text.yaml (both kinds)."""
    spark = any_spark
    import io

    from deltalake import DeltaTable

    from pipeline.runner import run_job

    texts = ["the film is funny", None, "a dull mess", "smart and moving", "the story drags", "superb"] * 4
    config = generate_job(tmp_path, model_dir, texts, task={
        "backend": "transformers", "template": "Summarise: {text}", "max_input_tokens": 32, "max_new_tokens": 5,
        "slots": 3, "mode": "continuous",
    })
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and summary.rows_out == len(texts)
    assert list(summary.generation_backend) == ["transformers (continuous, fp32 weights)"]
    assert "generation backend      : transformers (continuous, fp32 weights) x" in out.getvalue()
    rows = {r["doc_id"]: r for r in pa.table(DeltaTable(str(tmp_path / "out")).to_pyarrow_table()).to_pylist()}
    assert len(rows) == len(texts)
    assert rows["g01"]["status"] == "skipped_null" and rows["g01"]["completion"] is None
    done = [r for r in rows.values() if r["status"] == "ok"]
    assert done and all(r["completion_tokens"] >= 1 and r["finish_reason"] in ("stop", "length") for r in done)
    # greedy: the same prompt gives the same completion wherever it ran
    assert rows["g00"]["completion"] == rows["g06"]["completion"] == rows["g12"]["completion"]
