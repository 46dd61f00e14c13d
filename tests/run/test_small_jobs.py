"""Small jobs (pipeline.stages.small_jobs): when a job runs light, and that a light job writes what any job writes.

The decision is tested condition by condition without Spark; the driver-side commit against the
Spark-side one on the suite's session (same rows, same types, same transaction, nothing left on
failure); and one small job end to end in a process of its own (a light session is only built by a
process that has none), its output compared row by row with the same job run the usual way.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline.config import DELTA_CONNECTOR_CONF, build_config
from pipeline.errors import SinkError
from pipeline.io.delta.markers import MARKER_DIR
from pipeline.io.delta.history import commit_metadata
from pipeline.io.delta.plan import CommitOptions
from pipeline.io.delta.sink import write_sink
from pipeline.runner import run_job
from pipeline.stages.small_jobs import small_job

from tests.support.data import CONNECTOR_RUN, make_documents, sink_config, write_delta

REPO = Path(__file__).resolve().parents[2]
DS = "2026-12-01"


def _config(tmp_path: Path, model: Path | str = "/m", **sections):
    data = {
        "job": "small_test",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id",
                   "keep_columns": ["source"]},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "batching": {"batch_size": 16, "max_length": 256},
        "sink": {"path": str(tmp_path / "scores")},
        "spark": {"master": "local[2]"},
        "run": {"progress": False, "ds": DS, "summary_path": None},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return build_config(data)


def _why(config, **kwargs) -> str:
    decided = small_job(config, environ=kwargs.pop("environ", {}), active_session=kwargs.pop("active", False),
                        **kwargs)
    return ("small: " if decided else "not small: ") + decided.why


def test_a_small_delta_source_by_its_log_and_a_limit_by_itself(tmp_path):
    write_delta(tmp_path / "docs", make_documents(50))
    assert _why(_config(tmp_path)) == ("small: the source's 50 rows (its Delta log) <= spark.small_job_rows "
                                       "10,000")
    assert _why(_config(tmp_path, spark={"small_job_rows": 40})) == (
        "not small: the source's 50 rows (its Delta log) > spark.small_job_rows 40")
    # a limit bounds the rows whatever the table holds; a limit above the bar leaves it to the log
    assert _why(_config(tmp_path, spark={"small_job_rows": 40}, source={"limit": 30})) == (
        "small: source.limit 30 <= spark.small_job_rows 40")
    assert _why(_config(tmp_path, spark={"small_job_rows": 100}, source={"limit": 5000})) == (
        "small: the source's 50 rows (its Delta log) <= spark.small_job_rows 100")
    assert _why(_config(tmp_path, source={"path": str(tmp_path / "nothing")})).startswith(
        "not small: the Delta log of")
    assert _why(_config(tmp_path, source={"format": "json"})) == (
        "not small: the row count of a json source is not known before reading it")
    assert _why(_config(tmp_path, source={"format": "json", "limit": 10})).startswith("small: source.limit 10")


@pytest.mark.parametrize(("change", "why"), [
    ({"spark": {"small_job_rows": 0}}, "spark.small_job_rows is 0"),
    ({"spark": {"master": "spark://host:7077"}}, "spark.master spark://host:7077 is not local"),
    ({"spark": {"remote": "sc://host:15002"}}, "a Spark Connect session"),
    ({"sink": {"writer": "delta"}}, "sink.writer is delta (the connector)"),
    ({"sink": {"path": None, "table": "main.s.scores", "quarantine_path": "/q"}},
     "a catalog table needs the Delta connector"),
    ({"sink": {"quarantine_path": "s3://lake/q"}}, "sink.quarantine_path s3://lake/q is not a local path"),
    ({"run": {"runs_path": "s3a://lake/runs"}}, "run.runs_path s3a://lake/runs is not a local path"),
    ({"spark": {"conf": {"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.0"}}},
     "spark.conf sets spark.jars.packages"),
    ({"run": {"faults": {"kill_task": 0}}}, "a fault drill is configured"),
])
def test_what_keeps_a_job_off_the_light_path(tmp_path, change, why):
    write_delta(tmp_path / "docs", make_documents(10))
    assert _why(_config(tmp_path, **change)) == f"not small: {why}"


def test_a_session_of_its_own_spark_submit_or_an_active_session_keep_a_job_off_it(tmp_path):
    write_delta(tmp_path / "docs", make_documents(10))
    config = _config(tmp_path)
    assert _why(config, spark=object()) == "not small: a session was passed in"
    assert _why(config, environ={"PYSPARK_GATEWAY_PORT": "4040"}) == (
        "not small: launched by spark-submit (its session is the job's)")
    assert _why(config, environ={"SPARK_REMOTE": "sc://h:1"}) == "not small: a Spark Connect session"
    assert _why(config, environ={"SBI_FAULTS": json.dumps({"kill_task": 0})}) == (
        "not small: a fault drill is configured")
    assert _why(config, active=True) == "not small: a SparkSession is active in this process"


@pytest.mark.parametrize("connector", [pytest.param(False, id="jar-free"),
                                       pytest.param(True, id="connector", marks=pytest.mark.connector)])
def test_a_session_built_here_says_whether_it_has_the_connector(spark, tmp_path, connector):
    """The suite's session (built by get_session) in each of the suite's runs: its flag and has_delta_connector
    say whether the Delta connector is there, and format("delta") agrees: a table written and read back
    through it in the connector run, DATA_SOURCE_NOT_FOUND in the jar-free run."""
    from pipeline.io.sources import has_delta_connector

    assert CONNECTOR_RUN is connector  # the markers route each case into its own run (tests/conftest.py)
    assert spark.conf.get(DELTA_CONNECTOR_CONF) == ("true" if connector else "false")
    assert has_delta_connector(spark) is connector
    probe = str(tmp_path / "probe")
    if connector:
        spark.range(3).write.format("delta").save(probe)
        assert spark.read.format("delta").load(probe).count() == 3
        assert DeltaTable(probe).version() == 0  # a Delta table any reader opens
    else:
        with pytest.raises(Exception, match="DATA_SOURCE_NOT_FOUND"):
            spark.range(3).write.format("delta").save(probe)


def _rows(spark, n: int = 30):
    """A DataFrame with the output's kinds of columns: strings, floats, an array, a timestamp, a date, nulls."""
    from pyspark.sql import functions as F

    return (spark.range(n).select(
        F.format_string("d%03d", "id").alias("doc_id"),
        F.when(F.col("id") % 5 == 0, F.lit(None)).otherwise(F.col("id") * 0.5).cast("float").alias("score"),
        F.array(F.col("id").cast("float"), F.lit(1.0).cast("float")).alias("embedding"),
        F.when(F.col("id") % 3 == 0, "ok").otherwise("truncated").alias("status"),
        F.lit(dt.datetime(2026, 12, 1, 8, 30, tzinfo=dt.timezone.utc)).cast("timestamp").alias("scored_at"),
        F.lit(dt.date(2026, 12, 1)).alias("ds"),
    ))


def _sorted(path: Path) -> pa.Table:
    table = DeltaTable(str(path)).to_pyarrow_table()
    return table.sort_by("doc_id")


def test_a_commit_from_the_driver_writes_what_spark_writes(spark, tmp_path):
    sink = sink_config(path=str(tmp_path / "a"), mode="overwrite_partition", partition_by=["ds"], writer="deltalake")
    via_spark = write_sink(_rows(spark), sink, partition_values={"ds": dt.date(2026, 12, 1)},
                           commit_metadata={"sbi.job": "j"})
    from_driver = write_sink(_rows(spark), sink, partition_values={"ds": dt.date(2026, 12, 1)},
                             commit_metadata={"sbi.job": "j"}, path=str(tmp_path / "b"), in_driver=True)
    assert (via_spark.writer, from_driver.writer) == ("deltalake", "deltalake")
    assert via_spark.version == from_driver.version == 0
    a, b = _sorted(tmp_path / "a"), _sorted(tmp_path / "b")
    assert a.schema == b.schema and a.equals(b), (a.schema, b.schema)
    assert b.num_rows == 30 and b["score"].null_count == 6
    for path, result in ((tmp_path / "a", via_spark), (tmp_path / "b", from_driver)):
        table = DeltaTable(str(path))
        assert DeltaTable(str(path)).metadata().partition_columns == ["ds"]
        info = commit_metadata(table.history(1)[0])
        assert info.get("sbi.write_id") == result.write_id and info.get("sbi.job") == "j", info
        # every data file in the folder is one the commit references: nothing of the write is left over
        assert sorted(p.name for p in path.rglob("*.parquet")) == sorted(Path(f).name for f in table.file_uris())
        assert [m.suffix for m in (path / MARKER_DIR).iterdir()] == [".finished"]


def test_a_retry_of_a_committed_append_from_the_driver_adds_nothing(spark, tmp_path):
    sink = sink_config(path=str(tmp_path / "out"), mode="append", writer="deltalake")
    txn = CommitOptions(txn_app_id="sbi-run-1")
    first = write_sink(_rows(spark), sink, partition_values=None, commit_metadata={}, commit=txn, in_driver=True)
    again = write_sink(_rows(spark), sink, partition_values=None, commit_metadata={}, commit=txn, in_driver=True)
    assert not first.already_committed and again.already_committed and again.version == first.version == 0
    assert DeltaTable(str(tmp_path / "out")).to_pyarrow_table().num_rows == 30
    assert len(list((tmp_path / "out").rglob("*.parquet"))) == 1  # the retry's own file was deleted


def test_a_commit_from_the_driver_that_fails_leaves_nothing(spark, tmp_path):
    from pyspark.sql import functions as F

    @F.udf("string")
    def poison(doc_id: str) -> str:
        raise ValueError(f"poisoned row {doc_id}")

    sink = sink_config(path=str(tmp_path / "out"), mode="append", writer="deltalake")
    with pytest.raises(SinkError, match="poisoned row"):
        write_sink(_rows(spark).withColumn("doc_id", poison("doc_id")), sink, partition_values=None,
                   commit_metadata={}, in_driver=True)
    assert not (tmp_path / "out" / "_delta_log").exists() and not list((tmp_path / "out").rglob("*.parquet"))
    markers = [m.name for m in (tmp_path / "out" / MARKER_DIR).iterdir()]
    assert len(markers) == 1 and markers[0].endswith(".finished")
    assert json.loads((tmp_path / "out" / MARKER_DIR / markers[0]).read_text()).get("aborted") is True


_SMALL_JOB = """
import json, sys
from pipeline import load_config, run_job
from pipeline.io.sources import has_delta_connector
config = load_config(sys.argv[1])
summary = run_job(config)
from pyspark.sql import SparkSession
spark = SparkSession.getActiveSession()
conf = spark.sparkContext.getConf()
jvm = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print("RESULT " + json.dumps({
    "writer": summary.writer, "rows_out": summary.rows_out, "quarantined": summary.rows_quarantined,
    "jars": conf.get("spark.jars", ""), "jvm": " ".join(jvm.getInputArguments()),
    "connector": has_delta_connector(spark), "loads": sum(summary.model_loads.values())}))
"""


@pytest.mark.slow
def test_a_small_job_in_a_new_process_runs_light_and_writes_what_the_usual_path_writes(spark, tmp_path,
                                                                                   tiny_embed_model):
    """The job as ``python -m pipeline run`` starts it: no session yet, a local master, 60 rows. Its session
    has no jars and the quick-start JVM, its commit runs in the driver, and its output holds, row by row, what
    the same job writes through the suite's session (the usual path: Spark's data source write)."""
    from pipeline.spark.session import QUICK_START_JVM_OPTIONS

    write_delta(tmp_path / "docs", make_documents(60))
    light = _config(tmp_path, tiny_embed_model, run={"ds": DS, "progress": False, "summary_path": None})
    (tmp_path / "job.yaml").write_text(json.dumps(light.model_dump(mode="json")))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SBI_NO_JARS", None)  # the library's jar cache in reach: the light session leaves it off itself
    env.pop("SPARK_SUBMIT_OPTS", None)  # the suite's own quick-start JVM options: the light session sets them
    done = subprocess.run([sys.executable, "-c", _SMALL_JOB, str(tmp_path / "job.yaml")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "small job (the source's 60 rows (its Delta log) <= spark.small_job_rows 10,000)" in done.stdout
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    jvm = result.pop("jvm").split()
    assert all(flag in jvm for flag in QUICK_START_JVM_OPTIONS.split()), jvm
    # the warm-up's load is counted once, by the task that used the model (a second worker loads its own)
    assert 1 <= result.pop("loads") <= 2, result
    assert result == {"writer": "deltalake", "rows_out": 60, "quarantined": 0, "jars": "", "connector": False}

    usual = _config(tmp_path, tiny_embed_model, sink={"path": str(tmp_path / "usual"), "writer": "deltalake"})
    summary = run_job(usual, spark=spark)
    assert summary.rows_out == 60 and summary.writer == "deltalake"
    ours, theirs = _sorted(tmp_path / "scores"), _sorted(tmp_path / "usual")
    columns = [c for c in theirs.column_names if c not in ("run_id", "scored_at")]
    assert ours.select(columns).equals(theirs.select(columns))
    assert set(ours["status"].to_pylist()) == set(theirs["status"].to_pylist())
    runs = DeltaTable(str(tmp_path / "scores_runs")).to_pyarrow_table().to_pylist()
    assert [r["outcome"] for r in runs] == ["ok"]
