"""Delta tables on an object store, for real: moto's S3 server on loopback, written and read on ``s3a://``
through the Delta Spark connector (Hadoop's S3A and the AWS SDK, the cached ``s3`` jars; the tests marked
``connector``) and through the deltalake writer (delta-rs's own object store and pyarrow, no jars)."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest
import yaml

from pipeline.config import StorageConfig
from pipeline.io.local_s3 import local_s3
from pipeline.io.stores import storage_options, using_settings
from pipeline.errors import SinkError
from pipeline.io.delta.plan import CommitOptions
from pipeline.io.delta.sink import write_sink
from pipeline.report import report_main
from pipeline.runner import run_job
from pipeline.records.runs import read_runs

from tests.support.data import DELTA_TEST_CONFS, REPO, make_documents, sink_config, write_delta
from tests.support.drills import kill_driver_at_its_commit, vacuum_now, write_with_a_worker_killed
from tests.support.jobs import job_config

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


def _storage(server) -> dict[str, str]:
    """The server as a config's storage: section (the deltalake package's settings, over the environment)."""
    return {"access_key_id": server.access_key, "secret_access_key": server.secret_key, "region": "us-east-1",
            "endpoint_url": server.endpoint, "allow_http": "true"}


def _keys(s3, prefix: str) -> list[str]:
    listing = s3.client().list_objects_v2(Bucket="lake", Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


@pytest.mark.connector
def test_the_connector_writes_and_reads_delta_on_s3a(spark, s3):
    from pyspark.sql import functions as F

    path = "s3a://lake/tables/t"
    sink = sink_config(path=path, mode="append", partition_by=["ds"], writer="delta")
    frame = spark.range(10).withColumn("ds", F.lit(D1))
    first = write_sink(frame, sink, commit=CommitOptions(txn_app_id="sbi-run-1"))
    retry = write_sink(frame, sink, commit=CommitOptions(txn_app_id="sbi-run-1"))
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
    storage = _storage(s3)  # for the runs table, which deltalake writes from the driver
    config = job_config(tmp_path, tiny_embed_model, sink=sink, storage=storage,
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
    # the runs table next to the output, on S3 too: written by deltalake with the config's storage settings
    assert "runs table              : s3a://lake/scores_runs (version 1)" in out.getvalue()
    runs = spark.read.format("delta").load("s3a://lake/scores_runs").collect()
    assert [(r["run_id"], r["outcome"], r["writer"], r["delta_version"], r["rows_out"]) for r in runs] == [
        ("s3-1", "ok", "delta", 0, 29)]

    retry_out = io.StringIO()  # the scheduler retries the run after its commit landed: found in S3's history
    retry = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, storage=storage,
                               run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1,
                                    "run_id": "s3-retry"}), spark=spark, out=retry_out)
    assert "already committed at version 0 by run s3-1; nothing to do" in retry_out.getvalue()
    assert retry.writer == "delta" and spark.read.format("delta").load("s3a://lake/scores").count() == 29


@pytest.mark.connector
@pytest.mark.timeout(600)  # a job in a JVM of its own (the connector and S3A jars on its class path)
def test_a_session_the_library_builds_reaches_s3a_with_the_storage_section_alone(tmp_path, tiny_embed_model,
                                                                                monkeypatch):
    """``python -m pipeline run --conf job.yaml`` in a process of its own: the library builds its session, with
    the cached jars and the S3A settings of the config's ``storage:`` section, whose endpoint and keys are
    ``${VAR}`` of that process's environment. No ``AWS_*`` variable and no ``fs.s3a.*`` setting anywhere else:
    S3A reaches the server through ``storage:`` or not at all."""
    from pipeline.config import load_config
    from pipeline.io.stores import open_table

    write_delta(tmp_path / "docs", make_documents(20))
    key_id, secret = "AKIDSESSIONBUILT3", "session-built-secret-5e1a"  # moto takes any keys; these are ours alone
    job = {
        "job": "score_test",
        # one task: one worker loads the model (two, side by side on 2 cores, took 11 s); it writes through S3A alike
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id", "text_column": "text",
                   "repartition": 1},
        "model": {"path": str(tiny_embed_model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "sink": {"path": "s3a://lake/built/scores", "quarantine_path": "s3a://lake/built/scores_quarantine",
                 "mode": "append"},  # writer auto: the connector if the session has it, else deltalake
        "storage": {"access_key_id": "${SBI_T_S3A_KEY_ID}", "secret_access_key": "${SBI_T_S3A_SECRET}",
                    "endpoint_url": "${SBI_T_S3A_ENDPOINT}", "region": "us-east-1", "allow_http": True},
        "spark": {"master": "local[2]", "shuffle_partitions": 2,
                  "conf": {"spark.default.parallelism": "2", **DELTA_TEST_CONFS}},
        "run": {"ds": "2026-11-28", "run_id": "built-1", "progress": False,
                "summary_path": str(tmp_path / "summary.json")},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    with local_s3(buckets=["lake"]) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        for name in ("SBI_NO_JARS", "SBI_FAULTS", "SPARK_REMOTE", "PYSPARK_GATEWAY_PORT", "HADOOP_CONF_DIR"):
            env.pop(name, None)
        env.update(PYTHONPATH=str(REPO), PYSPARK_PYTHON=sys.executable, SBI_T_S3A_KEY_ID=key_id,
                   SBI_T_S3A_SECRET=secret, SBI_T_S3A_ENDPOINT=server.endpoint)
        done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--conf", str(tmp_path / "job.yaml")],
                              env=env, cwd=str(REPO), capture_output=True, text=True, timeout=540)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, printed[-4000:]
        for var in ("SBI_T_S3A_KEY_ID", "SBI_T_S3A_SECRET", "SBI_T_S3A_ENDPOINT"):  # the read-back's config
            monkeypatch.setenv(var, env[var])
        config = load_config(tmp_path / "job.yaml")
        with using_settings(config.storage.options()):  # those settings alone, none from this environment
            table = open_table("s3a://lake/built/scores", options=storage_options("s3://lake/built", environ={}))
            rows = table.to_pyarrow_table()
        listed = {o["Key"] for o in server.client().list_objects_v2(Bucket="lake", Prefix="built/")["Contents"]}
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["complete"] and (saved["rows_in"], saved["rows_out"]) == (20, 20)
    assert (saved["writer"], saved["output"], saved["delta_version"]) == ("delta", "s3a://lake/built/scores", 0), \
        "the session the library built carries the connector: sink.writer auto picked it"
    assert "s3a://lake/built/scores (Delta version 0, delta writer)" in done.stdout, done.stdout[-3000:]
    assert sorted(rows["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(20)], "each id once"
    assert table.version() == 0 and "built/scores/_delta_log/00000000000000000000.json" in listed
    assert "built/scores_runs/_delta_log/00000000000000000001.json" in listed, "its runs row, beside the output"
    shown = printed + (tmp_path / "summary.json").read_text()
    for value in (key_id, secret):
        assert value not in shown, f"{value} shown"


@pytest.mark.connector
def test_one_s3a_table_takes_commits_from_both_writers_and_each_reads_the_others(spark, s3):
    """The connector (Hadoop S3A) and the deltalake writer (delta-rs's object store) append to one table on
    s3a:// in turn; the connector reads delta-rs's commits and delta-rs the connector's."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    path = "s3a://lake/both"

    def append(ids: range, writer: str):
        frame = spark.range(ids.start, ids.stop).withColumn("ds", F.lit(D1))
        return write_sink(frame, sink_config(path=path, mode="append", partition_by=["ds"], writer=writer))

    with using_settings(StorageConfig.model_validate(_storage(s3)).options()):  # the deltalake writer's
        results = [append(range(0, 5), "delta"), append(range(5, 8), "deltalake"), append(range(8, 10), "delta")]
    assert [(r.writer, r.version) for r in results] == [("delta", 0), ("deltalake", 1), ("delta", 2)]
    by_connector = spark.read.format("delta").load(path)
    assert sorted(r["id"] for r in by_connector.collect()) == list(range(10))
    assert sorted(r["id"] for r in spark.read.format("delta").option("versionAsOf", 1).load(path).collect()) == \
        list(range(8)), "the connector time-travels to the deltalake writer's version"
    table = DeltaTable("s3://lake/both", storage_options=storage_options("s3://lake/both", environ=s3.env()))
    assert table.version() == 2 and sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(10))
    assert sorted(DeltaTable("s3://lake/both", version=0, storage_options=storage_options(
        "s3://lake/both", environ=s3.env())).to_pyarrow_table()["id"].to_pylist()) == list(range(5))
    assert [k.rsplit("/", 1)[-1] for k in _keys(s3, "both/_delta_log/") if k.endswith(".json")] == [
        f"{v:020d}.json" for v in range(3)]


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
    # its runs row, on S3 next to the output (a started row, then the final one: two commits)
    assert "runs table              : s3a://lake/scores_runs (version 1)" in out.getvalue()
    [row] = read_runs("s3a://lake/scores_runs")
    assert (row["run_id"], row["outcome"], row["output"], row["writer"], row["delta_version"]) == (
        "s3-1", "ok", "s3a://lake/scores", "deltalake", 0)
    assert (row["rows_in"], row["rows_out"], row["rows_quarantined"]) == (30, 29, 1)
    assert "scores_runs/_delta_log/00000000000000000001.json" in _keys(lake, "scores_runs/")

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

    runs = {r["run_id"]: r for r in read_runs("s3://lake/scores_runs")}  # s3:// and s3a:// name one table
    assert {k: (r["outcome"], r["delta_version"]) for k, r in runs.items()} == {
        "s3-1": ("ok", 0), "s3-retry": ("ok", 0), "s3-2": ("ok", 1)}
    written, reported, _ = report_main("s3a://lake/scores", out=str(tmp_path / "report.html"),
                                     history=5)  # pipeline report --history 5
    assert reported == "s3-2" and "s3-1" in written.read_text() and "s3-2" in written.read_text()


def test_the_summary_and_the_report_are_written_to_the_object_store_and_no_local_s3_folder_appears(
        spark, lake, tmp_path, tiny_embed_model, monkeypatch, capsys):
    """run.summary_path / run.report_path (and ``sbi report --out``) on s3:// or s3a:// are objects in the bucket,
    read back here; they used to be written through pathlib, as a local folder named ``s3:``."""
    from pipeline.cli import main

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    write_delta(tmp_path / "docs", make_documents(12, with_bad_rows=False))
    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model, run={
        "run_id": "to-s3", "summary_path": "s3://lake/reports/summary.json",
        "report_path": "s3a://lake/reports/report.html"}), spark=spark, out=out)
    assert summary.complete and summary.rows_out == 12
    bucket = lake.client()
    written = json.loads(bucket.get_object(Bucket="lake", Key="reports/summary.json")["Body"].read())
    assert (written["run_id"], written["rows_out"]) == ("to-s3", 12)
    page = bucket.get_object(Bucket="lake", Key="reports/report.html")["Body"].read().decode()
    assert page.startswith("<!DOCTYPE html>") and "to-s3" in page
    assert "report: s3a://lake/reports/report.html" in out.getvalue()
    assert main(["report", str(tmp_path / "scores"), "--out", "s3://lake/reports/again.html"]) == 0
    assert "report: s3://lake/reports/again.html" in capsys.readouterr().out
    assert "to-s3" in bucket.get_object(Bucket="lake", Key="reports/again.html")["Body"].read().decode()
    assert list(cwd.iterdir()) == [], "nothing local: no s3: or s3a: folder"
    assert not any((where / name).exists() for where in (REPO, tmp_path) for name in ("s3:", "s3a:"))


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


def test_the_runs_table_of_an_s3a_output_is_recorded_there_and_reported_from_there(lake, tmp_path, monkeypatch):
    """The recorder alone (no Spark job, seconds): a job into s3a://lake/rec records its started row, then its
    final row, in s3a://lake/rec_runs with the storage: settings the runner applies (keys only as ${VAR}, no
    AWS_* in the environment), and `pipeline report` reads them back from there."""
    from pipeline.config import build_config
    from pipeline.records.recorder import RunRecorder

    from tests.support.runs import summary

    for var in lake.env():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SBI_T_REC_KEY", "AKIDRECORDER1")
    monkeypatch.setenv("SBI_T_REC_SECRET", "recorder-secret-77")
    config = build_config({
        "job": "score_documents", "source": {"path": str(tmp_path / "docs")}, "model": {"path": str(tmp_path)},
        "task": {"kind": "embed"}, "sink": {"path": "s3a://lake/rec"},
        "storage": {"access_key_id": "${SBI_T_REC_KEY}", "secret_access_key": "${SBI_T_REC_SECRET}",
                    "endpoint_url": lake.endpoint, "allow_http": True, "region": "us-east-1"},
    })
    out = io.StringIO()
    with using_settings(config.storage.options()):  # as run_job does for the whole run
        recorder = RunRecorder.begin(config, run_id="r1", ds=D1, out=out)
        [started] = read_runs("s3a://lake/rec_runs")
        assert (started["run_id"], started["outcome"]) == ("r1", "started")
        recorder.end(summary=summary("r1"))
        [row] = read_runs("s3://lake/rec_runs")
        written, reported, _ = report_main("s3a://lake/rec", out=str(tmp_path / "report.html"))
    assert out.getvalue() == "runs table              : s3a://lake/rec_runs (version 1)\n"
    assert (row["run_id"], row["outcome"], row["rows_in"], row["rows_out"], row["delta_version"]) == (
        "r1", "ok", 100, 99, 4)
    assert reported == "r1" and "r1" in written.read_text()
    assert _keys(lake, "rec_runs/_delta_log/") == ["rec_runs/_delta_log/00000000000000000000.json",
                                                   "rec_runs/_delta_log/00000000000000000001.json"]
    shown = out.getvalue() + json.dumps(row, default=str) + written.read_text()
    assert "AKIDRECORDER1" not in shown and "recorder-secret-77" not in shown


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


def test_keys_given_only_as_variables_in_the_config_reach_s3_and_are_never_shown(
        spark, lake, tmp_path, tiny_embed_model, monkeypatch, capfd):
    """No AWS_* in the environment: the endpoint and keys come from ${VAR} in the storage: section only. The
    driver resolves them and hands them to its read and write tasks; they show nowhere a run leaves text."""
    write_delta("s3://lake/docs_cfg", make_documents(10, with_bad_rows=False), storage_options=_options(lake))
    for var in lake.env():
        monkeypatch.delenv(var, raising=False)
    key_id, secret = "AKIDCONFIGONLY7", "config-only-secret-9f2c"  # moto takes any keys; these are ours alone
    monkeypatch.setenv("SBI_T_S3_KEY_ID", key_id)
    monkeypatch.setenv("SBI_T_S3_SECRET", secret)
    monkeypatch.setenv("SBI_T_S3_ENDPOINT", lake.endpoint)
    storage = {"access_key_id": "${SBI_T_S3_KEY_ID}", "secret_access_key": "${SBI_T_S3_SECRET}",
               "endpoint_url": "${SBI_T_S3_ENDPOINT}", "region": "us-east-1", "allow_http": True}
    summary_path, report_path = tmp_path / "summary.json", tmp_path / "report.html"
    config = job_config(tmp_path, tiny_embed_model, source={"path": "s3a://lake/docs_cfg"}, storage=storage,
                        sink={"path": "s3a://lake/cfg_scores", "quarantine_path": "s3a://lake/cfg_quarantine",
                              "writer": "deltalake"},
                        run={"run_id": "cfg-1", "summary_path": str(summary_path), "report_path": str(report_path)})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and (summary.rows_in, summary.rows_out, summary.delta_version) == (10, 10, 0)
    assert "runs table              : s3a://lake/cfg_scores_runs (version 1)" in out.getvalue()
    assert not os.environ.get("AWS_ACCESS_KEY_ID") and not os.environ.get("AWS_ENDPOINT_URL")
    with using_settings(config.storage.options()):
        [row] = read_runs("s3a://lake/cfg_scores_runs")
    assert (row["run_id"], row["outcome"], row["rows_out"]) == ("cfg-1", "ok", 10)
    assert json.loads(row["config_json"])["storage"]["access_key_id"] == "***"
    assert len(_table(lake, "s3://lake/cfg_scores").to_pyarrow_table()) == 10
    captured = capfd.readouterr()  # the process's own stdout and stderr: Spark's and the workers' logs too
    shown = "\n".join([out.getvalue(), captured.out, captured.err, summary_path.read_text(),
                       report_path.read_text(), json.dumps(row, default=str)])
    for value in (key_id, secret):
        assert value not in shown, f"{value} shown"


@pytest.mark.drills  # a driver killed
@pytest.mark.timeout(1500)  # two whole jobs, one in its own JVM: minutes on a loaded 2-core machine
def test_a_driver_killed_before_its_commit_on_s3_leaves_each_key_once_after_the_rerun(
        spark, request, writer, tmp_path, tiny_embed_model):
    """The kill drill of tests/run/test_commits.py on S3: the driver (and every process below it) killed while its
    commit waits; the same command again commits each key once. The deltalake writer's files are in the bucket
    by then, and no sweep runs on S3: they stay, in no version of the table. The connector writes and commits
    in one call (``save``), which its driver was killed right before: it wrote nothing."""
    server = request.getfixturevalue("lake" if writer == "deltalake" else "s3")
    prefix = f"drill-{writer}"
    write_delta(tmp_path / "docs", make_documents(12, with_bad_rows=False))
    barrier = tmp_path / "barrier"
    sink = {"path": f"s3a://lake/{prefix}", "quarantine_path": f"s3a://lake/{prefix}_quarantine"}
    config = job_config(tmp_path, tiny_embed_model, sink=sink, run={
        "run_id": "killed", "faults": {"commit_barrier": {"dir": str(barrier), "parties": 9, "timeout_s": 15}}})
    if writer == "deltalake":  # the S3 settings from the environment (the lake fixture's); no jars: delta-rs's
        released_at = kill_driver_at_its_commit(config, tmp_path, barrier, SBI_NO_JARS="1")
    else:  # the connector in a session of its own: the endpoint from storage:, the keys from S3A's AWS_* chain
        storage = StorageConfig(endpoint_url=server.endpoint, allow_http=True, region="us-east-1")
        released_at = kill_driver_at_its_commit(config.model_copy(update={"storage": storage}), tmp_path, barrier,
                                                **server.credentials_env())
    orphans = {k for k in _keys(server, prefix + "/") if k.endswith(".parquet")}
    assert not _keys(server, prefix + "/_delta_log/"), "nothing committed"
    assert bool(orphans) == (writer == "deltalake"), orphans

    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "rerun"}), spark=spark,
                      out=out)
    assert summary.complete and summary.rows_out == 12 and summary.delta_version == 0, out.getvalue()
    while time.time() < released_at + 2:  # whatever survived of the killed job has given up by now
        time.sleep(0.5)
    table = _table(server, f"s3://lake/{prefix}")
    rows = table.to_pyarrow_table(columns=["doc_id", "run_id"])
    ids = rows["doc_id"].to_pylist()
    assert len(ids) == len(set(ids)) == 12, "each key once"
    assert table.version() == 0, "the killed job never committed, not even after the kill"
    assert set(rows["run_id"].to_pylist()) == {summary.run_id}
    live = {f"{prefix}/" + unquote(p) for p in table.get_add_actions(flatten=True).column("path").to_pylist()}
    assert live and not live & orphans
    assert orphans <= set(_keys(server, prefix + "/")), "no sweep on S3: the dead write's files stay, in no version"


@pytest.mark.drills  # a Python worker killed
@pytest.mark.timeout(300)
def test_a_worker_killed_mid_write_on_s3_is_retried_and_its_object_is_never_live(spark, request, writer):
    """The worker drill of tests/run/test_commits.py on S3: the deltalake writer's commit leaves exactly the objects
    its log adds; the connector leaves the dead attempt's object (S3A uploads what it has when the task aborts),
    in no version, until Delta's VACUUM."""
    server = request.getfixturevalue("lake" if writer == "deltalake" else "s3")
    prefix = f"killed-worker-{writer}"
    uri = f"s3a://lake/{prefix}"
    result = write_with_a_worker_killed(spark, uri, writer, f"exit-write-s3-{writer}")
    assert result.version == 0
    table = _table(server, uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(300))

    def data_objects() -> set[str]:  # Parquet data files: not the log's, not the writer's markers
        return {k for k in _keys(server, prefix + "/") if k.endswith(".parquet")
                and not any(part.startswith("_") for part in k.split("/")[1:])}

    live = {unquote(u).split("://lake/", 1)[1] for u in table.file_uris()}
    assert live and live <= data_objects()
    if writer == "deltalake":
        assert data_objects() == live, "the commit left no object of the dead attempt"
        return
    dead = data_objects() - live
    assert len(dead) == 1 and next(iter(dead)).rsplit("/", 1)[1].startswith("part-00001-"), (dead, live)
    vacuum_now(spark, uri)
    assert data_objects() == live, "Delta's VACUUM removes the dead attempt's object"


def _overwrite_race_on_s3(spark, server, path: str, writer: str, barrier) -> None:
    """Two overwrites of one new day of ``path`` at once (a barrier before their commits): one writer's rows
    stand, once each; the other fails with a conflict naming the winner; the other day is untouched."""
    from pyspark.sql import functions as F

    from tests.support.drills import D0, D1, SIZES, overwrite_race

    sink = sink_config(path=path, mode="overwrite_partition", partition_by=["ds"], writer=writer)
    write_sink(spark.range(5).withColumn("writer", F.lit("other day")).withColumn("ds", F.lit(D0)), sink,
               partition_values={"ds": D0})
    outcomes = overwrite_race(spark, path, sink, ("a", "b"), barrier)
    won = [n for n, o in outcomes.items() if not isinstance(o, SinkError)]
    assert len(won) == 1, outcomes
    loser = ({"a", "b"} - set(won)).pop()
    assert "conflict" in str(outcomes[loser]) and f"run run-{won[0]}" in str(outcomes[loser]), outcomes[loser]
    rows = [r.asDict() for r in spark.read.format("delta").load(path).collect()] if writer == "delta" else \
        _table(server, path).to_pyarrow_table().to_pylist()
    day = [r for r in rows if str(r["ds"]) == str(D1)]
    assert {r["writer"] for r in day} == {won[0]} and sorted(r["id"] for r in day) == list(range(100, 100 + SIZES[won[0]]))
    assert len([r for r in rows if str(r["ds"]) == str(D0)]) == 5


def test_two_overwrites_of_a_new_day_on_s3_leave_one_writers_rows_deltalake(spark, lake, tmp_path):
    _overwrite_race_on_s3(spark, lake, "s3a://lake/overwrite-race", "deltalake", tmp_path / "barrier")


@pytest.mark.connector
def test_two_overwrites_of_a_new_day_on_s3_leave_one_writers_rows_connector(spark, s3, tmp_path):
    _overwrite_race_on_s3(spark, s3, "s3a://lake/overwrite-race", "delta", tmp_path / "barrier")
