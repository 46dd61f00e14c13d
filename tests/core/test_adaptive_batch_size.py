"""Adaptive batch size: out-of-memory splits are remembered per length bucket; no row lost or scored twice."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.batching import BatchSizeMemory
from pipeline.config import BatchingConfig, ModelConfig
from pipeline.tasks.embed import EmbedTaskConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.tasks import build_task

from tests.support.data import SENTENCES

# short rows (5-7 tokens, bucket 16) and long rows (40+ tokens, bucket 64), interleaved
TEXTS = [f"good movie {i}" if i % 2 else " ".join(SENTENCES[:4]) + f" {i}" for i in range(40)]
# 16 rows x 7 tokens fit under 128 padded tokens; 16 rows x 40+ tokens do not
FAULTS = {"oom_above_tokens": 128}


def _task(model_dir, *, adaptive=True):
    return build_task(EmbedTaskConfig(), model=ModelConfig(path=str(model_dir)),
                      batching=BatchingConfig(batch_size=16, max_length=64, adaptive_batch_size=adaptive))


def _run(task, loaded, counts):
    chunk = pa.record_batch([pa.array(TEXTS, pa.string())], names=["text"])
    return task.process(loaded, chunk, counts)


@pytest.fixture
def clean(tiny_embed_model):
    task = _task(tiny_embed_model)
    return np.array(_run(task, task.load(tiny_embed_model, "cpu"), WorkerCounts()).column("embedding").to_pylist())


def _assert_every_row_once(out, counts, clean):
    assert out.num_rows == len(TEXTS) and set(out.column("status").to_pylist()) == {"ok"}
    np.testing.assert_allclose(np.array(out.column("embedding").to_pylist()), clean, atol=1e-5)
    scored = sum(int(size) * n for size, n in counts.counts["batch_sizes"].items())
    assert scored == counts.counts["batch_rows"] == len(TEXTS)  # nothing scored twice


def test_out_of_memory_size_is_remembered_per_bucket(tiny_embed_model, drill, clean):
    task = _task(tiny_embed_model)
    loaded = task.load(tiny_embed_model, "cpu")
    drill(FAULTS)

    first = WorkerCounts()
    out = _run(task, loaded, first)
    _assert_every_row_once(out, first, clean)
    assert first.counts["oom_splits"] >= 1
    n_tokens = np.array(out.column("n_tokens").to_pylist())
    short, long = n_tokens[1::2], n_tokens[0::2]
    assert short.max() * 16 <= 128 < long.min() * 16, "the fault must hit long full batches only"
    limits = loaded.memory.as_dict()
    assert BatchSizeMemory.bucket(int(short.max())) not in limits, "short rows never ran out of memory"
    (bucket, rows), = limits.items()
    assert bucket == BatchSizeMemory.bucket(int(long.max())) and 1 <= rows < 16

    # the next chunk on this worker uses the remembered size: no new out-of-memory error
    second = WorkerCounts()
    _assert_every_row_once(_run(task, loaded, second), second, clean)
    assert "oom_splits" not in second.counts and second.counts["adaptive_splits"] >= 1
    assert loaded.memory.as_dict() == limits
    assert max(int(s) for s in second.counts["batch_sizes"]) == 16  # short rows still in full batches


def test_without_adaptive_every_chunk_splits_again(tiny_embed_model, drill, clean):
    task = _task(tiny_embed_model, adaptive=False)
    loaded = task.load(tiny_embed_model, "cpu")
    drill(FAULTS)
    for _ in range(2):
        counts = WorkerCounts()
        _assert_every_row_once(_run(task, loaded, counts), counts, clean)
        assert counts.counts["oom_splits"] >= 1
    assert loaded.memory.as_dict() == {}
