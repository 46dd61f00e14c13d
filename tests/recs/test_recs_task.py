"""RecommendTask: one output row per user, seen items excluded, nulls and unknown users handled."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import ModelConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.recs.config import TrainConfig
from pipeline.recs.evaluate import seen_lists
from pipeline.recs.registry import save_two_tower
from pipeline.recs.synthetic import make_synthetic_recs
from pipeline.tasks.recommend import RecommendTask, RecommendTaskConfig, _quality_line
from pipeline.recs.train import train_two_tower


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    data = make_synthetic_recs(n_users=30, n_items=40, per_user=8, seed=2)
    result = train_two_tower(data, TrainConfig(dim=16, epochs=3, batch_size=128, holdout_per_user=0), log=None)
    root = tmp_path_factory.mktemp("models") / "two_tower"
    save_two_tower(result.model, root)
    return data, root


def _chunk(data, user_ids, seen=None):
    users = data.users.set_index("user_id").reindex(user_ids)
    if seen is None:
        seen = [s.tolist() for s in seen_lists(data.interactions, np.array(user_ids))]
    return pa.RecordBatch.from_pydict({
        "user_id": pa.array(user_ids, pa.int64()),
        "seen_item_ids": pa.array(seen, pa.list_(pa.int64())),
        "age": pa.array(users["age"], pa.int32(), from_pandas=True),
        "gender": pa.array(users["gender"], pa.string(), from_pandas=True),
        "occupation": pa.array(users["occupation"], pa.string(), from_pandas=True),
    })


def _task(root, **options):
    return RecommendTask(RecommendTaskConfig(interactions="unused", **options), model=ModelConfig(path=str(root)))


def test_one_row_per_user_best_first_and_seen_excluded(setup):
    data, root = setup
    task = _task(root, k=5, batch_size=4)
    loaded = task.load(root, "cpu")
    chunk = _chunk(data, [3, 1, 2, 7, 5, 4, 9])
    counts = WorkerCounts()
    out = task.process(loaded, chunk, counts)
    assert out.schema == task.output_schema()
    assert out.num_rows == chunk.num_rows
    seen = chunk.column(1).to_pylist()
    for items, scores, user_seen in zip(out.column(0).to_pylist(), out.column(1).to_pylist(), seen):
        assert len(items) == 5 and len(set(items)) == 5
        assert not set(items) & set(user_seen)
        assert scores == sorted(scores, reverse=True)
    assert out.column("status").to_pylist() == ["ok"] * 7
    assert counts.counts["rows"] == 7 and counts.counts["batches"] == 2
    assert counts.counts["padded_tokens"] == 8  # the ragged last batch of 3 is padded to 4


def test_results_do_not_depend_on_chunking_or_batch_size(setup):
    data, root = setup
    users = list(range(1, 31))
    a = _task(root, k=10, batch_size=7)
    whole = a.process(a.load(root, "cpu"), _chunk(data, users), WorkerCounts())
    b = _task(root, k=10, batch_size=2)
    loaded = b.load(root, "cpu")
    parts = [b.process(loaded, _chunk(data, users[i:i + 11]), WorkerCounts()) for i in range(0, 30, 11)]
    assert pa.Table.from_batches(parts).column("item_ids").to_pylist() == whole.column("item_ids").to_pylist()


def test_null_user_unknown_user_and_null_history(setup):
    data, root = setup
    task = _task(root, k=3, max_history=2)
    chunk = _chunk(data, [1, None, 10_000, 2], seen=[[1, 2, 3], [4], None, None])
    counts = WorkerCounts()
    out = task.process(task.load(root, "cpu"), chunk, counts)
    assert out.column("status").to_pylist() == ["truncated", "skipped_null", "ok", "ok"]
    assert out.column("item_ids").to_pylist()[1] is None
    assert len(out.column("item_ids").to_pylist()[2]) == 3  # unknown user: scored from features
    assert out.column("n_tokens").to_pylist() == [2, 0, 0, 0]
    assert counts.counts["unknown_users"] == 1


def test_missing_columns_and_feature_mismatch_fail_clearly(setup):
    data, root = setup
    task = _task(root)
    loaded = task.load(root, "cpu")
    chunk = _chunk(data, [1]).drop_columns(["occupation"])
    with pytest.raises(KeyError, match="occupation"):
        task.process(loaded, chunk, WorkerCounts())
    with pytest.raises(ValueError, match="feature_columns"):
        _task(root, feature_columns=["age"]).load(root, "cpu")


def test_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="extra"):
        RecommendTaskConfig(interactions="unused", k=10, topk=5)


def test_refresh_summary_reports_held_out_quality_against_popularity():

    line = _quality_line({"model": {"hit_rate@10": 0.2174, "recall@10": 0.114, "users": 943},
                          "popularity": {"hit_rate@10": 0.1092, "recall@10": 0.0562}})
    assert line == "HitRate@10 0.217, Recall@10 0.114 vs popularity 0.109 / 0.056 (943 users)"
    assert "not recorded" in _quality_line({})
