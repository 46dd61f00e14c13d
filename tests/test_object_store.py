"""Delta tables on an object store, for real: moto's S3 server on loopback, written and read on ``s3a://``
through the Delta Spark connector (Hadoop's S3A and the AWS SDK, the cached ``s3`` jars; the tests marked
``connector``) and through the deltalake writer (delta-rs's own object store and pyarrow, no jars)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os

import pyarrow as pa
import pytest

from pipeline.io.local_s3 import local_s3
from pipeline.io.sinks import SinkError, write_sink
from pipeline.runner import run_job

from .conftest import make_documents, sink_config, write_delta
from .test_runner import job_config

D1 = dt.date(2026, 11, 28)


@pytest.fixture(scope="module")
def s3(spark):  # the connector's
    """The server, with the session's S3A pointed at it (runtime Hadoop settings: the JVM already runs)."""
    with local_s3(buckets=["lake"]) as server:
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        confs = server.hadoop_confs(with_keys=True)
        for key, value in confs.items():
            hadoop.set(key, value)
        yield server
        for key in confs:
            hadoop.unset(key)


def _keys(s3, prefix: str) -> list[str]:
    listing = s3.client().list_objects_v2(Bucket="lake", Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


@pytest.mark.connector
def test_the_connector_writes_and_reads_delta_on_s3a(spark, s3):
    from pyspark.sql import functions as F

    path = "s3a://lake/tables/t"
    sink = sink_config(path=path, mode="append", partition_by=["ds"], writer="delta")
    frame = spark.range(10).withColumn("ds", F.lit(D1))
    first = write_sink(frame, sink, txn_app_id="sbi-run-1")
    retry = write_sink(frame, sink, txn_app_id="sbi-run-1")
    assert (first.writer, first.version, first.output) == ("delta", 0, path)
    assert retry.already_committed and retry.version == 0, "the retried append adds nothing on S3 too"
    replace = sink_config(path=path, mode="overwrite_partition", partition_by=["ds"], writer="delta")
    again = write_sink(spark.range(3).withColumn("ds", F.lit(D1)), replace, partition_values={"ds": D1})
    assert again.version == 1
    back = spark.read.format("delta").load(path)
    assert sorted(r["id"] for r in back.collect()) == [0, 1, 2]
    keys = _keys(s3, "tables/t/")
    assert "tables/t/_delta_log/00000000000000000000.json" in keys
    assert "tables/t/_delta_log/00000000000000000001.json" in keys
    assert any(k.startswith("tables/t/ds=2026-11-28/") and k.endswith(".parquet") for k in keys)


@pytest.mark.connector
def test_a_job_scores_into_s3a_with_its_quarantine_and_a_retry_adds_nothing(spark, s3, tmp_path, tiny_embed_model):
    docs = make_documents(30)
    texts = docs["text"].to_pylist()
    texts[4] = "a POISON row"
    write_delta(tmp_path / "docs", docs.set_column(1, "text", __import__("pyarrow").array(texts)))
    sink = {"path": "s3a://lake/scores", "quarantine_path": "s3a://lake/scores_quarantine", "writer": "delta"}
    config = job_config(tmp_path, tiny_embed_model, sink=sink,
                        run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1, "run_id": "s3-1"})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (30, 29, 1)
    assert (summary.writer, summary.output) == ("delta", "s3a://lake/scores")
    assert "s3a://lake/scores (Delta version 0, delta writer)" in out.getvalue()
    scores = spark.read.format("delta").load("s3a://lake/scores")
    assert scores.count() == 29 and scores.select("doc_id").distinct().count() == 29
    quarantine = spark.read.format("delta").load("s3a://lake/scores_quarantine").collect()
    assert [r["doc_id"] for r in quarantine] == ["d00004"]
    # the runs table is written by deltalake on local paths only: said, not failed
    assert "runs table              : not recorded: s3a://lake/scores_runs is remote" in out.getvalue()

    retry_out = io.StringIO()  # the scheduler retries the run after its commit landed: found in S3's history
    retry = run_job(job_config(tmp_path, tiny_embed_model, sink=sink,
                               run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1,
                                    "run_id": "s3-retry"}), spark=spark, out=retry_out)
    assert "already committed at version 0 by run s3-1; nothing to do" in retry_out.getvalue()
    assert retry.writer == "delta" and spark.read.format("delta").load("s3a://lake/scores").count() == 29


# ---------------------------------------------------------------- the deltalake writer (no jars)
# The server's endpoint and keys reach delta-rs and pyarrow through the environment (pipeline.io.stores), as
# AWS_* variables would on a cluster; the driver resolves them and hands them to its write and read tasks.


@pytest.fixture(scope="module")
def lake():
    with local_s3(buckets=["lake"]) as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        yield server
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _options(server) -> dict[str, str]:
    from pipeline.io.stores import storage_options

    return storage_options("s3://lake/x", environ=server.env())


def _table(server, uri: str):
    from deltalake import DeltaTable

    return DeltaTable(uri.replace("s3a://", "s3://"), storage_options=_options(server))


def _s3_job(tmp_path, model, **sections):
    sink = {"path": "s3a://lake/scores", "quarantine_path": "s3a://lake/scores_quarantine", "writer": "deltalake",
            **sections.pop("sink", {})}
    return job_config(tmp_path, model, source={"path": "s3a://lake/docs"}, sink=sink, **sections)


def test_the_deltalake_writer_runs_a_job_on_s3a_from_an_s3_source(spark, lake, tmp_path, tiny_embed_model):
    docs = make_documents(30)
    texts = docs["text"].to_pylist()
    texts[4] = "a POISON row"
    write_delta("s3://lake/docs", docs.set_column(1, "text", pa.array(texts)), storage_options=_options(lake))
    faults = {"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1}
    out = io.StringIO()
    summary_path = tmp_path / "summary.json"
    summary = run_job(_s3_job(tmp_path, tiny_embed_model, run={**faults, "run_id": "s3-1",
                                                               "summary_path": str(summary_path)}),
                      spark=spark, out=out)
    assert summary.complete and (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (30, 29, 1)
    assert (summary.writer, summary.output, summary.delta_version) == ("deltalake", "s3a://lake/scores", 0)
    assert "every input row written once" in out.getvalue(), "the job's own read-back of the S3 table"
    scores = _table(lake, "s3://lake/scores")
    assert scores.version() == 0 and sorted(scores.to_pyarrow_table()["doc_id"].to_pylist()) == sorted(
        d for i, d in enumerate(docs["doc_id"].to_pylist()) if i != 4)
    assert _table(lake, "s3://lake/scores_quarantine").to_pyarrow_table()["doc_id"].to_pylist() == ["d00004"]
    keys = _keys(lake, "scores/")
    assert "scores/_delta_log/00000000000000000000.json" in keys
    assert any(k.startswith("scores/ds=2026-11-28/part-") and k.endswith(".parquet") for k in keys)
    printed = out.getvalue() + summary_path.read_text()
    assert lake.secret_key not in printed and lake.access_key not in printed, "credentials are never printed"

    retry_out = io.StringIO()  # the scheduler retries the run after its commit landed: found in the S3 log
    retry = run_job(_s3_job(tmp_path, tiny_embed_model, run={**faults, "run_id": "s3-retry"}), spark=spark,
                    out=retry_out)
    assert "already committed at version 0 by run s3-1; nothing to do" in retry_out.getvalue()
    assert retry.writer == "deltalake" and _table(lake, "s3://lake/scores").version() == 0

    again = run_job(_s3_job(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                            run={**faults, "run_id": "s3-2"}), spark=spark, out=io.StringIO())
    assert again.complete and again.delta_version == 1
    day = _table(lake, "s3://lake/scores").to_pyarrow_table()
    assert day.num_rows == 29 and set(day["run_id"].to_pylist()) == {"s3-2"}, "the rerun replaced the day"


def test_a_keyed_append_on_s3_writes_only_the_missing_keys(spark, lake, tmp_path, tiny_embed_model):
    write_delta("s3://lake/docs_keyed", make_documents(20, with_bad_rows=False), storage_options=_options(lake))
    sink = {"path": "s3a://lake/keyed", "quarantine_path": "s3a://lake/keyed_quarantine"}
    first = run_job(job_config(tmp_path, tiny_embed_model, source={"path": "s3a://lake/docs_keyed", "limit": 12},
                               sink={**sink, "writer": "deltalake"}, run={"run_id": "k-1"}),
                    spark=spark, out=io.StringIO())
    assert first.rows_out == 12
    out = io.StringIO()  # the whole day: only the 8 keys the table lacks are scored and written
    second = run_job(job_config(tmp_path, tiny_embed_model, source={"path": "s3a://lake/docs_keyed"},
                                sink={**sink, "writer": "deltalake"}, run={"run_id": "k-2"}), spark=spark, out=out)
    assert second.complete and second.delta_version == 1
    table = _table(lake, "s3://lake/keyed").to_pyarrow_table()
    ids = table["doc_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 20, "each key once"
    assert sorted(table.filter(pa.compute.equal(table["run_id"], "k-2"))["doc_id"].to_pylist()) == \
        [f"d{i:05d}" for i in range(12, 20)]


def test_two_concurrent_commits_of_one_version_on_s3_do_not_both_win(lake):
    """delta-rs creates each log entry with If-None-Match (conditional put), which the server honours: the
    commit that lost the race sees the winner's version and, its overwrite conflicting, commits nothing."""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    client = lake.client()
    client.put_object(Bucket="lake", Key="probe", Body=b"1")
    with pytest.raises(Exception, match="PreconditionFailed"):
        client.put_object(Bucket="lake", Key="probe", Body=b"2", IfNoneMatch="*")
    options = _options(lake)
    assert options["aws_conditional_put"] == "etag"
    write_deltalake("s3://lake/race", pa.table({"a": [0]}), storage_options=options)
    first, second = _table(lake, "s3://lake/race"), _table(lake, "s3://lake/race")  # both at version 0
    write_deltalake(first, pa.table({"a": [1]}), mode="overwrite")
    with pytest.raises(CommitFailedError):
        write_deltalake(second, pa.table({"a": [2]}), mode="overwrite")
    table = _table(lake, "s3://lake/race")
    assert table.version() == 1 and table.to_pyarrow_table()["a"].to_pylist() == [1]
    assert _keys(lake, "race/_delta_log/") == ["race/_delta_log/00000000000000000000.json",
                                               "race/_delta_log/00000000000000000001.json"]


def test_unsafe_rename_commits_are_refused_before_any_work(spark, lake, monkeypatch):
    from pyspark.sql import functions as F

    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    with pytest.raises(SinkError, match="AWS_S3_ALLOW_UNSAFE_RENAME=true is set"):
        write_sink(spark.range(3).withColumn("ds", F.lit(D1)),
                   sink_config(path="s3a://lake/unsafe", mode="append", writer="deltalake"))
    assert _keys(lake, "unsafe/") == []


def test_the_deltalake_writer_refuses_a_store_it_cannot_reach_before_any_work(spark, tmp_path):
    from pyspark.sql import functions as F

    with pytest.raises(SinkError, match="handles local or mounted paths"):
        write_sink(spark.range(3).withColumn("ds", F.lit(D1)),
                   sink_config(path="abfss://c@account.dfs.core.windows.net/t", mode="append", writer="deltalake"))
