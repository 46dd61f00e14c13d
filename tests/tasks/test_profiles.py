"""Each kind's part of the output profile (profile_output), on real tiny models and real output chunks; no Spark."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts, merge_counts
from pipeline.core.sketches import Histogram, Profile, Vectors
from pipeline.tasks import build_task
from pipeline.tasks._profile import profile_generation, profile_ocr, profile_schema_valid
from pipeline.tasks.classify import ClassifyTaskConfig
from pipeline.tasks.embed import EmbedTaskConfig

from tests.support.data import make_corpus


def _chunk(texts):
    return pa.record_batch([pa.array(texts, pa.string())], names=["text"])


def _profiled(task, loaded, texts) -> dict:
    profile = Profile()
    task.profile_output(task.process(loaded, _chunk(texts), WorkerCounts()), profile)
    return profile.data


def test_embed_profiles_statuses_tokens_labels_scores_and_the_centroid(tiny_embed_model):
    config = EmbedTaskConfig(labels={"pos": "good great", "neg": "bad awful"})
    task = build_task(config, model=ModelConfig(path=str(tiny_embed_model)), batching=BatchingConfig(batch_size=8))
    loaded = task.load(tiny_embed_model, "cpu")
    texts = make_corpus(40, seed=1)["text"].to_pylist() + [None, ""]
    data = _profiled(task, loaded, texts)
    assert data["cat"]["status"] == {"ok": 40, "skipped_null": 1, "skipped_empty": 1}
    assert sum(data["cat"]["label"].values()) == 40 and Histogram.of(data, "score").n == 40
    assert Histogram.of(data, "tokens").n == 40
    vectors = Vectors.of(data, "embedding")
    assert vectors.n == 40 and vectors.centroid.shape == (32,)
    assert "embedding_norm" not in data["hist"], "normalised embeddings: every norm is 1, nothing to sketch"
    raw = build_task(config.model_copy(update={"normalize": False}), model=ModelConfig(path=str(tiny_embed_model)),
                     batching=BatchingConfig(batch_size=8))
    assert Histogram.of(_profiled(raw, raw.load(tiny_embed_model, "cpu"), texts), "embedding_norm").n == 40


def test_classify_profiles_each_top_label_and_its_probability(tiny_classify_model):
    task = build_task(ClassifyTaskConfig(), model=ModelConfig(path=str(tiny_classify_model)),
                      batching=BatchingConfig(batch_size=8))
    data = _profiled(task, task.load(tiny_classify_model, "cpu"), make_corpus(30, seed=2)["text"].to_pylist())
    assert sum(data["cat"]["label"].values()) == 30 and set(data["cat"]["label"]) <= {"negative", "neutral", "positive"}
    score = Histogram.of(data, "score")
    assert score.n == 30 and score.bins.name == "unit" and 0.0 < score.quantile(0.5) <= 1.0


def test_generation_extract_and_ocr_hooks_read_their_columns():
    out = pa.record_batch({
        "completion_tokens": pa.array([12, None, 40, 3], pa.int32()),
        "finish_reason": ["stop", None, "length", "stop"],
        "status": ["ok", "skipped_null", "invalid_output", "truncated"],
    })
    profile = Profile()
    profile_generation(out, profile)
    profile_schema_valid(out, profile)
    assert profile.data["cat"]["finish_reason"] == {"stop": 2, "length": 1}
    assert Histogram.of(profile.data, "completion_tokens").n == 3
    assert profile.data["cat"]["schema_valid"] == {"valid": 2, "invalid": 1}

    line = pa.struct([pa.field("text", pa.string()), pa.field("confidence", pa.float32())])
    pages = pa.record_batch({
        "n_lines": pa.array([2, 0, None], pa.int32()),
        "lines": pa.array([[{"text": "a", "confidence": 0.9}, {"text": "b", "confidence": 0.4}], [], None],
                          pa.list_(line)),
    })
    ocr = Profile()
    profile_ocr(pages, ocr)
    assert Histogram.of(ocr.data, "lines").n == 2 and Histogram.of(ocr.data, "confidence").n == 2


def test_recommend_profiles_its_lists_and_the_overlap_with_the_night_before(tmp_path):
    from pipeline.recs.config import TrainConfig
    from pipeline.recs.evaluate import seen_lists
    from pipeline.recs.registry import save_two_tower
    from pipeline.recs.synthetic import make_synthetic_recs
    from pipeline.recs.train import train_two_tower
    from pipeline.tasks._recommend_profile import PREVIOUS_COLUMN
    from pipeline.tasks.recommend import RecommendTask, RecommendTaskConfig

    data = make_synthetic_recs(n_users=30, n_items=40, per_user=8, seed=3)
    model = train_two_tower(data, TrainConfig(dim=8, epochs=1, batch_size=128, holdout_per_user=0), log=None).model
    folder, _ = save_two_tower(model, tmp_path / "two_tower")
    task = RecommendTask(RecommendTaskConfig(k=5, interactions="unused"), model=ModelConfig(path=str(folder)))
    loaded = task.load(folder, "cpu")
    users = data.users.sort_values("user_id")
    ids = users["user_id"].to_numpy()

    def chunk(previous: list | None) -> pa.RecordBatch:
        columns = {"user_id": pa.array(list(ids) + [None], pa.int64()),
                   "seen_item_ids": pa.array([s.tolist() for s in seen_lists(data.interactions, ids)] + [None],
                                             pa.list_(pa.int64())),
                   **{c: pa.array(list(users[c]) + [None]) for c in ("age", "gender", "occupation")}}
        if previous is not None:
            columns[PREVIOUS_COLUMN] = pa.array(previous + [None], pa.list_(pa.int64()))
        return pa.RecordBatch.from_pydict(columns)

    first = task.process(loaded, chunk(None), WorkerCounts())
    profile = Profile()
    task.profile_output(first, profile)
    assert profile.data["cat"]["status"] == {"ok": 30, "skipped_null": 1}
    assert sum(profile.data["cat"]["items"].values()) == 150 and profile.data["cat"]["topk_fill"] == {"full": 30}
    assert Histogram.of(profile.data, "score").n == 150 and Histogram.of(profile.data, "top_score").n == 30

    lists = first.column("item_ids").to_pylist()[:30]
    half = [lst[:2] + [9_999] * 3 for lst in lists[:15]] + [None] * 15  # half the users had a list last night
    counts = WorkerCounts()
    task.process(loaded, chunk(lists[:15] + half[15:]), counts)
    same = Histogram.of(counts.counts["profile"], "topk_overlap")
    assert same.n == 15 and same.mean() == pytest.approx(1.0, abs=0.01)
    counts = WorkerCounts()
    task.process(loaded, chunk(half), counts)
    assert Histogram.of(merge_counts({}, counts.counts["profile"]), "topk_overlap").mean() == pytest.approx(0.4, abs=0.01)
    assert np.isfinite(same.quantile(0.5))
