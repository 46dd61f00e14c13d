"""Sources read through real Spark: Delta via deltalake (no connector here), Parquet, JSON lines, text."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import SourceConfig
from pipeline.io.sources import SourceError, has_delta_connector, is_delta_table, read_delta, read_source, select_input

from tests.support.data import make_documents, write_delta


def _ids(df, col="doc_id"):
    return sorted(r[col] for r in df.select(col).collect())


def test_no_delta_connector_in_the_local_default(spark, monkeypatch):
    assert has_delta_connector(spark) is False
    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "16.4")
    assert has_delta_connector(spark) is True


def test_io_uses_only_the_dataframe_api():
    """What Spark Connect lacks (SparkContext, JVM handles, RDDs, accumulators, status tracker) stays out of io."""
    io_dir = Path(__file__).resolve().parents[2] / "pipeline" / "io"
    banned = re.compile(r"sparkContext|_jvm|\.rdd\b|accumulator|statusTracker")
    hits = [f"{f.name}:{n}" for f in sorted(io_dir.glob("*.py"))
            for n, line in enumerate(f.read_text().splitlines(), 1) if banned.search(line)]
    assert hits == []


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
    rows = {r["id"]: r["text"] for r in df.collect()}
    uri = f"file:{tmp_path / 'notes.txt'}"
    assert rows == {f"{uri}:1": "first line", f"{uri}:2": "second line", f"{uri}:3": "", f"{uri}:4": "fourth"}

    # file: URIs are local paths too
    df = read_source(spark, SourceConfig(format="parquet", path=f"file://{tmp_path / 'docs.parquet'}"))
    assert df.count() == 12


def _text_rows(spark, folder: Path) -> dict[str, str]:
    rows = read_source(spark, SourceConfig(format="text", path=str(folder))).collect()
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "text ids must be unique"
    return {r["id"]: r["text"] for r in rows}


def test_json_lines_keep_malformed_lines_raw(spark, tmp_path):
    from pyspark.sql import functions as F

    path = tmp_path / "events.jsonl"
    path.write_text('{"event_id": 1, "message": "ok"}\n{"event_id": 2, "mess\nplain text\n{"event_id": 4, "message": null}\n')
    df = read_source(spark, SourceConfig(format="json", path=str(path)))
    assert "_corrupt_record" in df.columns
    inputs = select_input(df, SourceConfig(format="json", path=str(path), id_column="event_id",
                                           text_column="message"), ("text",))
    assert inputs.columns == ["id", "text", "_malformed"]
    rows = [tuple(r) for r in inputs.orderBy(F.col("id").asc_nulls_last(), "_malformed").collect()]
    assert rows == [(1, "ok", None), (4, None, None), (None, None, "plain text"), (None, None, '{"event_id": 2, "mess')]
    # a clean file reads with the column too (all null), so every run of a job has the same columns
    clean = tmp_path / "clean.jsonl"
    clean.write_text('{"event_id": 1, "message": "ok"}\n')
    df = read_source(spark, SourceConfig(format="json", path=str(clean)))
    assert df.columns == ["event_id", "message", "_corrupt_record"] and df.count() == 1


def test_text_ids_are_file_and_line_and_stable_when_files_come_and_go(spark, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.log").write_text("".join(f"a {n}\n" for n in range(1, 6)))
    (logs / "b.log").write_bytes(b"b 1\nb 2 caf\xc3\xa9 \xff\xfe bad\n\nb 4")  # invalid UTF-8, no final newline
    before = _text_rows(spark, logs)
    a_uri, b_uri = f"file:{logs / 'a.log'}", f"file:{logs / 'b.log'}"
    assert before == {
        **{f"{a_uri}:{n}": f"a {n}" for n in range(1, 6)},
        f"{b_uri}:1": "b 1", f"{b_uri}:2": "b 2 caf\u00e9 \ufffd\ufffd bad", f"{b_uri}:3": "", f"{b_uri}:4": "b 4",
    }

    # a larger file arrives (the old ids ordered files by size, so this renumbered the others),
    # read in several blocks: its lines are numbered across block boundaries
    (logs / "c.log").write_text("".join(f"c {n} {'x' * (n % 50)}\n" for n in range(1, 3001)))
    spark.conf.set("spark.sql.files.maxPartitionBytes", "16384")
    try:
        blocks = spark.read.text(str(logs / "c.log")).select("_metadata.file_block_start").distinct().count()
        after = _text_rows(spark, logs)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert blocks > 3, "c.log should be read in several blocks"
    assert len(after) == 5 + 4 + 3000
    assert {k: v for k, v in after.items() if not k.startswith("file:" + str(logs / "c.log"))} == before
    c_uri = f"file:{logs / 'c.log'}"
    c_rows = {k: v for k, v in after.items() if k.startswith(c_uri + ":")}
    assert len(c_rows) == 3000
    for key, text in c_rows.items():
        line = int(key.rsplit(":", 1)[1])
        assert text == f"c {line} {'x' * (line % 50)}", key

    # and a file leaving changes nothing for the others either
    os.remove(logs / "a.log")
    assert _text_rows(spark, logs) == {k: v for k, v in after.items() if not k.startswith(a_uri + ":")}


def test_remote_uris_are_never_made_local(spark, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    # Delta without the connector: refused up front, naming the connector
    with pytest.raises(SourceError, match=r"source.path 'gs://lake/docs' is a gs: URI.*--packages io.delta:delta-spark_4.2_2.13"):
        read_source(spark, SourceConfig(format="delta", path="gs://lake/docs"))
    with pytest.raises(SourceError, match=r"'abfss://c@a.dfs.core.windows.net/t' is a abfss: URI"):
        read_delta(spark, "abfss://c@a.dfs.core.windows.net/t")
    assert is_delta_table(spark, "gs://lake/docs") is False
    # Parquet goes to Spark as written: Spark, not a local folder, answers for the scheme
    with pytest.raises(SourceError, match=r"could not read source 's3://lake/docs' \(format parquet\).*s3"):
        read_source(spark, SourceConfig(format="parquet", path="s3://lake/docs"))
    assert list(cwd.iterdir()) == []
    assert not Path("s3:").exists() and not (Path(__file__).resolve().parents[2] / "s3:").exists()


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
