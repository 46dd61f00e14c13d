"""End to end on local Spark: Delta tables -> the recommend task through run_job -> dated + latest Delta tables."""

from __future__ import annotations

import datetime as dt
import io

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline import run_job
from pipeline.config import ConfigError, JobConfig, ModelConfig, build_config, load_config
from pipeline.errors import ModelError
from pipeline.core.metrics import WorkerCounts
from pipeline.recs.config import TrainConfig
from pipeline.recs.data import write_recs_tables
from pipeline.recs.evaluate import seen_lists
from pipeline.recs.registry import save_two_tower
from pipeline.recs.synthetic import make_synthetic_recs
from pipeline.recs.train import train_two_tower
from pipeline.tasks.recommend import OUTPUT_COLUMNS, RecommendTask, RecommendTaskConfig

K = 5


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("refresh")
    data = make_synthetic_recs(n_users=24, n_items=40, per_user=8, seed=3)
    write_recs_tables(data, root / "recs")
    result = train_two_tower(data, TrainConfig(dim=16, epochs=3, batch_size=128, holdout_per_user=0), log=None)
    folder, revision = save_two_tower(result.model, root / "models" / "two_tower")
    return root, data, folder, revision


def _config(root, **run) -> JobConfig:
    return build_config({
        "job": "refresh_recommendations",
        "source": {"format": "delta", "path": str(root / "recs/users"), "id_column": "user_id"},
        "model": {"path": str(root / "models/two_tower")},
        "task": {"kind": "recommend", "k": K, "batch_size": 7, "interactions": str(root / "recs/interactions"),
                 "items": str(root / "recs/items"), "latest_path": str(root / "out/recommendations_latest")},
        "sink": {"path": str(root / "out/recommendations"), "mode": "overwrite_partition", "partition_by": ["ds"]},
        "run": {"progress": False, **run},
    })


def _expected(data, folder) -> dict[int, list[int]]:
    """The pure task's answer for every user, to compare with what Spark wrote."""
    task = RecommendTask(RecommendTaskConfig(k=K, interactions="unused"), model=ModelConfig(path=str(folder)))
    users = data.users.sort_values("user_id")
    chunk = pa.RecordBatch.from_pydict({
        "user_id": pa.array(users["user_id"], pa.int64()),
        "seen_item_ids": pa.array([s.tolist() for s in seen_lists(data.interactions, users["user_id"].to_numpy())],
                                  pa.list_(pa.int64())),
        "age": pa.array(users["age"], pa.int32()), "gender": pa.array(users["gender"]),
        "occupation": pa.array(users["occupation"]),
    })
    out = task.process(task.load(folder, "cpu"), chunk, WorkerCounts())
    return dict(zip(users["user_id"].tolist(), out.column("item_ids").to_pylist()))


@pytest.mark.slow  # a Spark job: ~20 s on an idle 2-core machine, more when shared
def test_refresh_writes_ranked_unseen_items_with_lineage(any_spark, world):
    """On a classic and a Spark Connect session alike."""
    root, data, folder, revision = world
    out = io.StringIO()
    summary = run_job(_config(root, ds="2026-11-30", run_id="r1"), spark=any_spark, out=out)
    assert summary.rows_in == 24 and summary.rows_out == 24 * K and summary.complete
    assert summary.model_revision == revision and summary.model_name == "two_tower"
    assert summary.details["catalog items unknown"].startswith("0 ")
    assert summary.details["latest"].endswith("(updated)")
    assert "recommendations" in out.getvalue() and "OK: every input row" in out.getvalue()

    table = DeltaTable(str(root / "out/recommendations"))
    assert table.metadata().partition_columns == ["ds"]
    rows = table.to_pyarrow_table()
    assert rows.schema.names == list(OUTPUT_COLUMNS)
    frame = rows.to_pandas().sort_values(["user_id", "rank"])
    assert set(frame["model_revision"]) == {revision} and set(frame["run_id"]) == {"r1"}
    assert set(frame["model_name"]) == {"two_tower"} and frame["scored_at"].notna().all()
    assert set(frame["ds"].astype(str)) == {"2026-11-30"}
    seen = data.interactions.groupby("user_id")["item_id"].apply(set)
    for user, group in frame.groupby("user_id"):
        assert group["rank"].tolist() == list(range(1, K + 1))
        assert np.all(np.diff(group["score"].to_numpy()) <= 0)
        assert not set(group["item_id"]) & seen[user]
    got = {u: g["item_id"].tolist() for u, g in frame.groupby("user_id")}
    assert got == _expected(data, folder)  # Spark glue gives exactly the pure task's answer

    latest = DeltaTable(str(root / "out/recommendations_latest")).to_pyarrow_table().to_pandas()
    assert len(latest) == 24 * K and set(latest["run_id"]) == {"r1"}


@pytest.mark.slow  # two Spark jobs
def test_rerun_replaces_its_day_and_backfill_keeps_latest(spark, world):
    root, _, _, _ = world
    out = io.StringIO()
    run_job(_config(root, ds="2026-11-30", run_id="r2"), spark=spark, out=out)
    summary = run_job(_config(root, ds="2026-11-29", run_id="r3"), spark=spark, out=out)
    assert "kept: it holds a newer ds" in summary.details["latest"]  # latest holds 2026-11-30

    frame = DeltaTable(str(root / "out/recommendations")).to_pyarrow_table().to_pandas()
    by_day = frame.groupby(frame["ds"].astype(str))["run_id"].agg(lambda s: sorted(set(s)))
    assert by_day.to_dict() == {"2026-11-29": ["r3"], "2026-11-30": ["r2"]}  # r1's rows were replaced
    assert len(frame) == 2 * 24 * K
    latest = DeltaTable(str(root / "out/recommendations_latest")).to_pyarrow_table().to_pandas()
    assert set(latest["run_id"]) == {"r2"}


def test_bad_model_or_features_fail_before_spark_work(spark, world, tmp_path):
    root, _, _, _ = world
    config = _config(root, ds="2026-11-30")
    with pytest.raises(ModelError, match="train_recommender"):
        run_job(config.model_copy(update={"model": ModelConfig(path=str(tmp_path))}), spark=spark)
    wrong = config.model_copy(update={"task": config.task.model_copy(update={"feature_columns": ["age"]})})
    with pytest.raises(ModelError, match="feature_columns"):
        run_job(wrong, spark=spark)


def test_committed_config_and_notebook():
    config = load_config("conf/refresh_recommendations.yaml", overrides=["task.k=20", "run.ds=2026-11-30"])
    assert config.task.k == 20 and config.run.ds == dt.date(2026, 11, 30)
    with pytest.raises(ConfigError, match="task.top_k: unknown key"):
        load_config("conf/refresh_recommendations.yaml", overrides=["task.top_k=20"])
    with pytest.raises(ConfigError, match="incremental does not apply"):
        load_config("conf/refresh_recommendations.yaml", overrides=["run.incremental=true"])
    # The shared tests/faces/test_notebooks.py checks the notebook format; here: it runs this job's entry point.
    text = open("notebooks/refresh_recommendations.py").read()
    last_cell = text.split("# COMMAND ----------")[-1]
    assert "run_notebook(args, spark=spark)" in last_cell and 'config="conf/refresh_recommendations.yaml"' in text
