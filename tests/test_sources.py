"""Sources read through real Spark: Delta via deltalake (no connector here), Parquet, JSON lines, text."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import SourceConfig
from pipeline.io.sources import SourceError, has_delta_connector, read_source, select_input

from .conftest import make_documents, write_delta


def _ids(df, col="doc_id"):
    return sorted(r[col] for r in df.select(col).collect())


def test_no_delta_connector_in_the_local_default(spark):
    assert has_delta_connector(spark) is False


def test_delta_snapshot_with_partitions_and_later_versions(spark, tmp_path):
    path = tmp_path / "docs"
    docs = make_documents(30).append_column("part", pa.array(["a", "b", "c"] * 10))
    write_delta(path, docs, partition_by=["part"])
    write_delta(path, make_documents(5).append_column("part", pa.array(["z"] * 5)).set_column(
        0, "doc_id", pa.array([f"x{i}" for i in range(5)])), mode="append")
    df = read_source(spark, SourceConfig(format="delta", path=str(path), id_column="doc_id"))
    assert df.count() == 35
    assert sorted(r["part"] for r in df.select("part").distinct().collect()) == ["a", "b", "c", "z"]
    parts = {r["doc_id"]: r["part"] for r in df.select("doc_id", "part").collect()}
    assert parts["d00001"] == "b" and parts["x3"] == "z"
    # overwrite: the old files must not be read any more
    write_delta(path, make_documents(4).append_column("part", pa.array(["q"] * 4)), mode="overwrite")
    assert read_source(spark, SourceConfig(format="delta", path=str(path))).count() == 4


def test_empty_delta_table(spark, tmp_path):
    path = tmp_path / "empty"
    write_delta(path, make_documents(0))
    df = read_source(spark, SourceConfig(format="delta", path=str(path)))
    assert df.count() == 0 and set(df.columns) == {"doc_id", "text", "source"}


def test_delta_with_deletion_vectors_is_refused(spark, tmp_path):
    from deltalake import DeltaTable, TableFeatures

    path = tmp_path / "dv"
    write_delta(path, make_documents(3))
    DeltaTable(str(path)).alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    with pytest.raises(SourceError, match=r"deletionVectors.*--packages io.delta:delta-spark"):
        read_source(spark, SourceConfig(format="delta", path=str(path)))


def test_missing_delta_table(spark, tmp_path):
    with pytest.raises(SourceError, match="no Delta table at"):
        read_source(spark, SourceConfig(format="delta", path=str(tmp_path / "nope")))


def test_parquet_json_and_text_sources(spark, tmp_path):
    docs = make_documents(12)
    pq.write_table(docs, tmp_path / "docs.parquet")
    df = read_source(spark, SourceConfig(format="parquet", path=str(tmp_path / "docs.parquet")))
    assert df.count() == 12

    with open(tmp_path / "logs.jsonl", "w") as fh:
        for i in range(7):
            fh.write(json.dumps({"event_id": i, "message": f"line {i}", "level": "INFO"}) + "\n")
    df = read_source(spark, SourceConfig(format="json", path=str(tmp_path / "logs.jsonl"), limit=5))
    assert df.count() == 5

    (tmp_path / "notes.txt").write_text("first line\nsecond line\n\nfourth\n")
    df = read_source(spark, SourceConfig(format="text", path=str(tmp_path / "notes.txt")))
    rows = df.collect()
    assert [r["text"] for r in rows] == ["first line", "second line", "", "fourth"]
    assert len({r["id"] for r in rows}) == 4


def test_where_filter(spark, tmp_path):
    write_delta(tmp_path / "d", make_documents(10))
    df = read_source(spark, SourceConfig(format="delta", path=str(tmp_path / "d"), where="doc_id < 'd00004'"))
    assert _ids(df) == ["d00000", "d00001", "d00002", "d00003"]


def test_catalog_table(spark, tmp_path):
    spark.createDataFrame([("a", "hello")], "doc_id string, text string").createOrReplaceTempView("docs_view")
    df = read_source(spark, SourceConfig(format="table", table="docs_view"))
    assert _ids(df) == ["a"]
    with pytest.raises(SourceError, match="could not read source 'no.such.table'"):
        read_source(spark, SourceConfig(format="table", table="no.such.table"))


def test_select_input_validates_columns_before_any_work(spark):
    df = spark.createDataFrame([("a", "hi", 1)], "doc_id string, body string, n int")
    cfg = SourceConfig(format="table", table="t", id_column="doc_id", text_column="body", keep_columns=["n"])
    out = select_input(df, cfg, ("text",))
    assert out.columns == ["id", "text", "n"]
    with pytest.raises(SourceError, match=r"missing column\(s\) \['text'\].*has \['doc_id', 'body', 'n'\]"):
        select_input(df, SourceConfig(format="table", table="t", id_column="doc_id"), ("text",))
    with pytest.raises(SourceError, match=r"missing column\(s\) \['id'\]"):
        select_input(df, SourceConfig(format="table", table="t", text_column="body"), ("text",))
    with pytest.raises(SourceError, match="has type integer; it must be a string"):
        select_input(df, SourceConfig(format="table", table="t", id_column="doc_id", text_column="n"), ("text",))


def test_binary_text_passes_through_for_the_task_to_decode(spark):
    df = spark.createDataFrame([("a", bytearray(b"caf\xc3\xa9"))], "doc_id string, body binary")
    out = select_input(df, SourceConfig(format="table", table="t", id_column="doc_id", text_column="body"), ("text",))
    assert out.schema["text"].dataType.typeName() == "binary"
