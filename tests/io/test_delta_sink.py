"""The Delta sink: one commit per job, partition overwrite, nothing committed on failure. Real Spark + deltalake."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline.errors import SinkError
from pipeline.io.delta.sink import write_sink

from tests.support.data import sink_config

D1, D2 = dt.date(2026, 11, 28), dt.date(2026, 11, 29)


def _frame(spark, ids, ds, *, label="x"):
    from pyspark.sql import functions as F

    rows = [(i, f"{label}{i}", [0.5, float(i)], {"a": 0.25}) for i in ids]
    df = spark.createDataFrame(rows, "id long, label string, embedding array<float>, scores map<string,float>")
    return df.withColumn("ds", F.lit(ds)).withColumn("scored_at", F.current_timestamp()).repartition(3)


def _read(path: Path) -> pa.Table:
    return pa.table(DeltaTable(str(path)).to_pyarrow_table())


def _parquet_files(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.rglob("*.parquet")}


def _logged_files(path: Path) -> set[str]:
    """Every data file any version of the table adds."""
    import json
    from urllib.parse import unquote

    return {unquote(json.loads(line)["add"]["path"]) for commit in (path / "_delta_log").glob("*.json")
            for line in commit.read_text().splitlines() if line.strip() and "add" in json.loads(line)}


def _live_files(path: Path) -> set[str]:
    return set(DeltaTable(str(path)).file_uris())


def test_append_then_overwrite_partition_replaces_only_that_day(spark, tmp_path, writer):
    path = tmp_path / "scores"
    sink = sink_config(path=str(path), mode="append", partition_by=["ds"])
    r0 = write_sink(_frame(spark, range(10), D1), sink)
    r1 = write_sink(_frame(spark, range(10, 15), D2), sink)
    assert (r0.version, r1.version, r0.writer) == (0, 1, writer)

    rerun = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    r2 = write_sink(_frame(spark, range(10, 13), D2, label="y"), rerun, partition_values={"ds": D2})
    assert r2.version == 2
    table = _read(path)
    by_day = {d: sorted(i for i, dd in zip(table["id"].to_pylist(), table["ds"].to_pylist()) if dd == d)
              for d in (D1, D2)}
    assert by_day == {D1: list(range(10)), D2: [10, 11, 12]}
    assert set(table.filter(pa.compute.equal(table["ds"], D2))["label"].to_pylist()) == {"y10", "y11", "y12"}

    dt_ = DeltaTable(str(path))
    assert dt_.version() == 2 and dt_.metadata().partition_columns == ["ds"]
    ops = [h["operation"] for h in sorted(dt_.history(), key=lambda h: h["version"])]
    assert len(ops) == 3
    # the schema survives the round trip: arrays, maps, UTC timestamps, the date partition
    schema = table.schema
    assert pa.types.is_list(schema.field("embedding").type)
    assert pa.types.is_map(schema.field("scores").type)
    assert schema.field("scored_at").type == pa.timestamp("us", tz="UTC")
    # no stray files: every Parquet file on disk is one some version adds (day 2's first files stay for
    # time travel), and every file of the current snapshot is on disk
    assert _parquet_files(path) == _logged_files(path)
    assert {Path(p).relative_to(path).as_posix() for p in _live_files(path)} <= _parquet_files(path)


def test_a_column_added_since_joins_an_older_table(spark, tmp_path, writer):
    """An output written before a column existed (task_fingerprint, say) takes it on the next write."""
    from pyspark.sql import functions as F

    path = tmp_path / "scores"
    sink = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    write_sink(_frame(spark, range(4), D1), sink, partition_values={"ds": D1})
    newer = _frame(spark, range(4, 6), D2).withColumn("task_fingerprint", F.lit("fp1"))
    write_sink(newer, sink, partition_values={"ds": D2})
    table = _read(path)
    assert "task_fingerprint" in table.column_names and table.num_rows == 6
    by_id = {r["id"]: r["task_fingerprint"] for r in table.to_pylist()}
    assert by_id == {0: None, 1: None, 2: None, 3: None, 4: "fp1", 5: "fp1"}


def test_rerun_of_same_day_is_idempotent(spark, tmp_path, writer):
    path = tmp_path / "scores"
    sink = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    for _ in range(3):
        write_sink(_frame(spark, range(20), D1), sink, partition_values={"ds": D1})
    table = _read(path)
    assert sorted(table["id"].to_pylist()) == list(range(20))
    assert DeltaTable(str(path)).version() == 2


def test_overwrite_replaces_everything(spark, tmp_path, writer):
    path = tmp_path / "scores"
    write_sink(_frame(spark, range(5), D1), sink_config(path=str(path), mode="append"))
    write_sink(_frame(spark, range(100, 102), D2), sink_config(path=str(path), mode="overwrite"))
    assert sorted(_read(path)["id"].to_pylist()) == [100, 101]


def test_empty_result_still_commits_and_empties_the_partition(spark, tmp_path, writer):
    path = tmp_path / "scores"
    sink = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    write_sink(_frame(spark, range(5), D1), sink, partition_values={"ds": D1})
    write_sink(_frame(spark, range(5, 7), D2), sink, partition_values={"ds": D2})
    result = write_sink(_frame(spark, [], D1), sink, partition_values={"ds": D1})
    assert result.version == 2
    assert sorted(_read(path)["id"].to_pylist()) == [5, 6]


def test_new_empty_table_has_the_schema(spark, tmp_path, writer):
    path = tmp_path / "empty"
    write_sink(_frame(spark, [], D1), sink_config(path=str(path), mode="append"))
    table = _read(path)
    assert table.num_rows == 0 and "embedding" in table.column_names and "ds" in table.column_names


def test_failed_job_commits_nothing_and_leaves_no_files(spark, tmp_path, writer):
    from pyspark.sql import functions as F
    from pyspark.sql.functions import udf

    path = tmp_path / "scores"
    sink = sink_config(path=str(path), mode="append", partition_by=["ds"])
    write_sink(_frame(spark, range(6), D1), sink)
    before_files = _parquet_files(path)
    live_before = _live_files(path)

    @udf("long")
    def explode_on_13(i):
        if i == 13:
            raise ValueError("poison row 13")
        return i

    bad = _frame(spark, range(10, 30), D1).withColumn("id", explode_on_13(F.col("id")))
    with pytest.raises(SinkError, match="poison row 13"):
        write_sink(bad, sink)
    assert DeltaTable(str(path)).version() == 0
    assert sorted(_read(path)["id"].to_pylist()) == list(range(6))
    if writer == "delta":
        # the connector leaves a failed job's files in the folder, in no version (VACUUM removes them): no
        # reader sees them, and the table's files are still the first commit's
        assert _live_files(path) == live_before and _logged_files(path) == before_files
        return
    # tasks still running when the job aborted finish (or are killed) a moment later
    deadline = time.monotonic() + 30
    while _parquet_files(path) != before_files and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _parquet_files(path) == before_files, "files of failed attempts must be deleted"


def test_rows_outside_the_replaced_partition_are_refused(spark, tmp_path, writer):
    path = tmp_path / "scores"
    sink = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    write_sink(_frame(spark, range(3), D1), sink, partition_values={"ds": D1})
    with pytest.raises(SinkError, match="every row must belong to the replaced partition"):
        write_sink(_frame(spark, range(3), D2), sink, partition_values={"ds": D1})
    assert DeltaTable(str(path)).version() == 0
    assert _parquet_files(path) == _logged_files(path)


def test_partitioning_mismatch_is_refused(spark, tmp_path, writer):
    path = tmp_path / "scores"
    write_sink(_frame(spark, range(3), D1), sink_config(path=str(path), mode="append", partition_by=[]))
    with pytest.raises(SinkError, match=r"partitioned by nothing .* set sink.partition_by"):
        write_sink(_frame(spark, range(3), D1), sink_config(path=str(path), mode="append", partition_by=["ds"]))


def test_unwritable_path_is_refused_before_work(spark, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(SinkError, match="is a file, not a folder"):
        write_sink(_frame(spark, range(3), D1), sink_config(path=str(blocker / "scores"), mode="append"))


def test_overwrite_partition_needs_its_value(spark, tmp_path, writer):
    sink = sink_config(path=str(tmp_path / "s"), mode="overwrite_partition", partition_by=["ds"])
    with pytest.raises(SinkError, match="needs a value for partition column"):
        write_sink(_frame(spark, range(3), D1), sink)


def test_a_straggler_finishing_after_the_job_takes_its_files_back(tmp_path):
    from pipeline.io.delta.writer import DeltaLakeArrowWriter

    schema = pa.schema([("id", pa.int64())])
    writer = DeltaLakeArrowWriter({"path": str(tmp_path / "t"), "write_id": "w1"}, schema=schema, overwrite=False)
    batch = pa.record_batch([pa.array([1, 2, 3], pa.int64())], schema=schema)
    live = writer.write(iter([batch]))
    assert live.rows == 3 and len(_parquet_files(tmp_path / "t")) == 1

    writer.abort([live])  # the driver gives up on the job (or commits it) ...
    assert _parquet_files(tmp_path / "t") == set()
    late = writer.write(iter([batch]))  # ... and an attempt still running finishes afterwards
    assert late.adds == [] and _parquet_files(tmp_path / "t") == set()


@pytest.mark.parametrize("sink_path", ["gs://lake/scores", "abfss://c@acct.dfs.core.windows.net/scores"])
def test_remote_sink_without_connector_fails_before_any_work(spark, tmp_path, monkeypatch, tiny_embed_model, sink_path):
    """The cluster example of docs/getting-started/cluster.md without the connector: refused before the source is read."""
    import io

    from pipeline.config import build_config
    from pipeline.runner import run_job

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    config = build_config({
        "job": "remote_sink",
        # no table here: were the source read (or anything scored) first, this would fail with a SourceError
        "source": {"format": "delta", "path": str(tmp_path / "no-such-docs"), "id_column": "doc_id"},
        "model": {"path": str(tiny_embed_model)},
        "task": {"kind": "embed"},
        "sink": {"path": sink_path},
        "run": {"progress": False, "ds": "2026-11-29"},
    })
    out = io.StringIO()
    with pytest.raises(SinkError) as err:
        run_job(config, spark=spark, out=out)
    text = str(err.value)
    assert f"sink.path {sink_path!r} is a" in text
    assert "--packages io.delta:delta-spark_4.2_2.13:4.4.0" in text and "DeltaSparkSessionExtension" in text
    # not even the "scoring N rows" line: nothing was read; only that the failed run's row could not be written
    # (its runs table beside the sink goes through the connector the session lacks)
    assert [line for line in out.getvalue().splitlines() if "could not record the run (failed)" not in line] == []
    assert list(cwd.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cwd"]
    assert not (Path(__file__).resolve().parents[2] / "s3:").exists()


@pytest.mark.parametrize("where", ["sink.path", "sink.quarantine_path", "below a file"])
def test_a_sink_path_that_is_a_file_is_refused_before_any_spark_job_and_the_file_is_left_intact(
        spark, tmp_path, tiny_embed_model, where):
    """A sink.path that names a file (not a folder) used to end in a raw ``Not a directory (os error 20)``
    traceback: the pre-flight names the path, and the file keeps its bytes."""
    import io

    from pipeline.config import build_config
    from pipeline.runner import run_job

    existing = tmp_path / "scores.csv"
    existing.write_bytes(b"id,score\n1,0.5\n")
    sink = {"sink.path": {"path": str(existing)},
            "sink.quarantine_path": {"path": str(tmp_path / "scores"), "quarantine_path": str(existing)},
            "below a file": {"path": str(existing / "scores")}}[where]
    config = build_config({
        "job": "file_sink",
        # no table here: were the source read (or anything scored) first, this would fail with a SourceError
        "source": {"format": "delta", "path": str(tmp_path / "no-such-docs"), "id_column": "doc_id"},
        "model": {"path": str(tiny_embed_model)},
        "task": {"kind": "embed"},
        "sink": sink,
        "run": {"progress": False, "ds": "2026-11-29", "runs_path": str(tmp_path / "runs")},
    })
    out = io.StringIO()
    with pytest.raises(SinkError) as err:
        run_job(config, spark=spark, out=out)
    key = "sink.quarantine_path" if where == "sink.quarantine_path" else "sink.path"
    assert f"{key} {str(existing)!r} is a file, not a folder" in str(err.value) if where != "below a file" else (
        f"sink.path {str(existing / 'scores')!r} is inside {str(existing)!r}, a file" in str(err.value))
    assert "a Delta table is a folder" in str(err.value)
    # not even the "scoring N rows" line: nothing was read; only that the failed run's row could not be written
    # (its runs table beside the sink goes through the connector the session lacks)
    assert [line for line in out.getvalue().splitlines() if "could not record the run (failed)" not in line] == []
    assert existing.read_bytes() == b"id,score\n1,0.5\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "scores.csv"]


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "plain"])
def test_two_commits_that_both_create_the_table_write_each_row_once(tmp_path, monkeypatch, keyed):
    """Both commits found no table and call delta-rs's create at the same instant (a thread barrier in front of
    it, five times over). delta-rs retried the losing create as a second ``CREATE TABLE`` holding its rows
    (35 of 40 such races here doubled every row); the loser now writes into the winner's table instead."""
    import functools

    import deltalake.transaction

    from pipeline.io.delta.writer import DeltaLakeArrowWriter

    from tests.support.drivers import at_once, entered_together

    monkeypatch.setattr(deltalake.transaction, "create_table_with_add_actions",
                        entered_together(deltalake.transaction.create_table_with_add_actions))
    schema = pa.schema([("id", pa.int64())])
    for trial in range(5):
        path = tmp_path / f"t{trial}"
        writers = {
            name: DeltaLakeArrowWriter({"path": str(path), "write_id": f"w{trial}{name}",
                                        **({"key_columns": '["id"]'} if keyed else {})}, schema=schema, overwrite=False)
            for name in "ab"
        }
        ids = {"a": range(0, 6), "b": range(4, 10)}
        messages = {n: w.write(iter([pa.record_batch([pa.array(ids[n], pa.int64())], schema=schema)]))
                    for n, w in writers.items()}
        at_once({n: functools.partial(w.commit, [messages[n]]) for n, w in writers.items()}, timeout_s=120)
        got = sorted(_read(path)["id"].to_pylist())
        assert got == (list(range(10)) if keyed else sorted([*ids["a"], *ids["b"]])), f"trial {trial}"
        assert len([c for c in DeltaTable(str(path)).history() if c.get("operation") == "CREATE TABLE"]) == 1
