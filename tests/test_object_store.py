"""Delta tables on an object store, for real: moto's S3 server on loopback, written and read on ``s3a://``
through the Delta Spark connector (Hadoop's S3A and the AWS SDK, the cached ``s3`` jars)."""

from __future__ import annotations

import datetime as dt
import io

import pytest

from pipeline.io.local_s3 import local_s3
from pipeline.io.sinks import SinkError, write_sink
from pipeline.runner import run_job

from .conftest import make_documents, sink_config, write_delta
from .test_runner import job_config

pytestmark = pytest.mark.connector
D1 = dt.date(2026, 11, 28)


@pytest.fixture(scope="module")
def s3(spark):
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


def test_the_deltalake_writer_still_refuses_s3a_before_any_work(spark, s3, tmp_path):
    from pyspark.sql import functions as F

    with pytest.raises(SinkError, match="handles local or mounted paths only"):
        write_sink(spark.range(3).withColumn("ds", F.lit(D1)),
                   sink_config(path="s3a://lake/refused", mode="append", writer="deltalake"))
    assert _keys(s3, "refused/") == []
