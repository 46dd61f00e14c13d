"""What a write does, without doing it: the write plan for every sink mode, target and writer; URI rules.

Pure: no SparkSession. The Delta connector's jars cannot be fetched here, so
its side of the sink is checked as a plan (format, save mode, options).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from pipeline.core import locations
from pipeline.config import SinkConfig, SourceConfig
from pipeline.errors import SinkError
from pipeline.io.delta.plan import WritePlan, plan_write
from pipeline.io.delta.target import check_sink
from pipeline.io.sources import SourceError, check_source
from pipeline.core.locations import is_local, local_path, resolve_location, uri_scheme
from pipeline.core.sessions import delta_package

REPO = Path(__file__).resolve().parents[2]
DS = dt.date(2026, 11, 29)
META = {"sbi.job": "score", "sbi.run_id": "r1"}
MODES = ("append", "overwrite", "overwrite_partition")
S3 = ("s3://lake/scores", "s3a://lake/scores")
UNREACHABLE = ("abfss://c@acct.dfs.core.windows.net/scores", "gs://lake/scores", "dbfs:/mnt/lake/scores",
               "hdfs://nn:8020/scores")  # by the deltalake writer
REMOTE = S3 + UNREACHABLE


def _plan(sink: SinkConfig, *, connector: bool, path: str | None = None) -> WritePlan:
    return plan_write(sink, partition_values={"ds": DS}, commit_metadata=META, path=path,
                      connector=connector, write_id="w1")


def _sink(mode: str, *, table: bool, writer: str = "auto", location: str = "/data/scores") -> SinkConfig:
    where = {"table": "main.ml.scores", "quarantine_path": "/data/q"} if table else {"path": location}
    return SinkConfig(mode=mode, writer=writer, **where)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("table", [False, True], ids=["path", "table"])
def test_connector_plan_for_every_mode(mode, table):
    plan = _plan(_sink(mode, table=table), connector=True)
    assert (plan.writer, plan.format, plan.partition_by, plan.write_id) == ("delta", "delta", ("ds",), "w1")
    assert plan.mode == ("append" if mode == "append" else "overwrite")
    assert json.loads(plan.options["userMetadata"]) == {**META, "sbi.write_id": "w1"}
    if mode == "overwrite_partition":
        assert plan.options["replaceWhere"] == "ds = '2026-11-29'"
    else:
        # append and a full overwrite must not narrow the write to one partition
        assert "replaceWhere" not in plan.options
    # a column added since joins an older table, and one someone else added stays: every mode merges
    assert {k: v for k, v in plan.options.items() if k not in ("userMetadata", "replaceWhere")} == {"mergeSchema": "true"}
    if table:
        assert (plan.table, plan.path, plan.target) == ("main.ml.scores", None, "main.ml.scores")
    else:
        assert (plan.table, plan.path, plan.target) == (None, "/data/scores", "/data/scores")


@pytest.mark.parametrize("mode", MODES)
def test_deltalake_plan_for_every_mode(mode):
    plan = _plan(_sink(mode, table=False), connector=False)
    assert (plan.writer, plan.format, plan.table, plan.path) == ("deltalake", "sbi_delta", None, "/data/scores")
    assert plan.mode == ("append" if mode == "append" else "overwrite")
    opts = plan.options
    assert (opts["path"], opts["partition_by"], opts["write_id"]) == ("/data/scores", "ds", "w1")
    assert json.loads(opts["commit_metadata"]) == {**META, "sbi.write_id": "w1"}
    if mode == "overwrite_partition":
        assert json.loads(opts["replace_where"]) == {"ds": "2026-11-29"}
    else:
        assert "replace_where" not in opts
    # an explicit sink.writer: deltalake plans the same even where the connector is present
    assert _plan(_sink(mode, table=False, writer="deltalake"), connector=True) == plan


@pytest.mark.parametrize("mode", MODES)
def test_catalog_table_without_connector_is_refused(mode):
    for writer in ("auto", "deltalake"):
        with pytest.raises(SinkError, match=r"sink.table 'main.ml.scores' needs the Delta Spark connector"):
            _plan(_sink(mode, table=True, writer=writer), connector=False)


def test_writer_delta_without_connector_names_the_package():
    with pytest.raises(SinkError, match=re.escape(f"--packages {delta_package()}")):
        _plan(_sink("append", table=False, writer="delta"), connector=False)


@pytest.mark.parametrize("uri", UNREACHABLE)
def test_remote_uri_without_connector_is_refused_naming_the_connector(uri):
    for writer in ("auto", "deltalake"):
        with pytest.raises(SinkError) as err:
            _plan(_sink("overwrite_partition", table=False, writer=writer, location=uri), connector=False)
        text = str(err.value)
        assert f"sink.path {uri!r} is a {uri_scheme(uri)}: URI" in text
        assert f"--packages {delta_package()}" in text
        assert "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension" in text
        assert "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog" in text
        with pytest.raises(SinkError, match="is a .*URI"):
            check_sink(_sink("append", table=False, writer=writer, location=uri), connector=False)


@pytest.mark.parametrize("uri", S3)
def test_s3_without_connector_goes_to_the_deltalake_writer_untouched(uri, monkeypatch):
    monkeypatch.delenv("AWS_S3_ALLOW_UNSAFE_RENAME", raising=False)
    plan = _plan(_sink("overwrite_partition", table=False, location=uri), connector=False)
    assert (plan.writer, plan.path, plan.target) == ("deltalake", uri, uri)
    assert not any("secret" in key for key in plan.options), "the plan carries no credentials"
    check_sink(_sink("append", table=False, location=uri), connector=False)
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    with pytest.raises(SinkError, match="sink.path: AWS_S3_ALLOW_UNSAFE_RENAME=true is set"):
        check_sink(_sink("append", table=False, location=uri), connector=False)


@pytest.mark.parametrize("uri", REMOTE)
def test_remote_uri_with_connector_is_passed_untouched(uri):
    plan = _plan(_sink("overwrite_partition", table=False, location=uri), connector=True)
    assert plan.path == uri == plan.target
    check_sink(_sink("append", table=False, location=uri), connector=True)


def test_quarantine_path_follows_the_same_rules():
    local = _sink("append", table=False)
    with pytest.raises(SinkError, match=r"sink.quarantine_path 'gs://lake/q' is a gs: URI"):
        _plan(local, connector=False, path="gs://lake/q")
    assert _plan(local, connector=True, path="s3://lake/q").path == "s3://lake/q"
    # a table's quarantine table goes to sink.quarantine_path: a missing one is refused up front
    with pytest.raises(SinkError, match="needs sink.quarantine_path"):
        check_sink(SinkConfig(table="main.ml.scores"), connector=True)
    with pytest.raises(SinkError, match=r"sink.quarantine_path 'gs://lake/q'"):
        check_sink(SinkConfig(path="/data/scores", quarantine_path="gs://lake/q"), connector=False)


def test_local_paths_and_file_uris(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a plain relative path is made absolute for both writers; a file: URI is local
    assert _plan(_sink("append", table=False, location="out/scores"), connector=False).path == str(tmp_path / "out/scores")
    assert _plan(_sink("append", table=False, location="out/scores"), connector=True).path == str(tmp_path / "out/scores")
    assert _plan(_sink("append", table=False, location="file:///data/My%20Scores"), connector=False).path == "/data/My Scores"
    assert _plan(_sink("append", table=False, location="file:/data/scores"), connector=True).path == "file:/data/scores"
    assert list(tmp_path.iterdir()) == []  # planning creates nothing


def test_overwrite_partition_needs_its_value():
    with pytest.raises(SinkError, match=r"needs a value for partition column\(s\) \['ds'\]"):
        plan_write(_sink("overwrite_partition", table=False), partition_values={}, commit_metadata=None,
                   connector=True)


def test_each_plan_gets_its_own_write_id():
    a, b = (plan_write(_sink("append", table=False), partition_values=None, commit_metadata=None, connector=False)
            for _ in range(2))
    assert a.write_id and b.write_id and a.write_id != b.write_id
    assert json.loads(a.options["commit_metadata"]) == {"sbi.write_id": a.write_id}


def test_uri_rules():
    assert [uri_scheme(p) for p in ("S3://x", "dbfs:/x", "file:/x", "/x", "x/y:z", "C:\\data", "c:/data")] == [
        "s3", "dbfs", "file", None, None, None, None]
    assert [is_local(p) for p in ("file:/x", "file:///x", "rel/x", "/x", "s3://x", "gs://x")] == [
        True, True, True, True, False, False]
    assert local_path("file:/data/x") == "/data/x" and local_path("file://localhost/data/x") == "/data/x"
    with pytest.raises(ValueError, match="not a local path"):
        local_path("s3://lake/x")
    with pytest.raises(ValueError, match="names host 'nn'"):
        local_path("file://nn/data/x")
    assert resolve_location("abfss://c@a.dfs.core.windows.net/t") == "abfss://c@a.dfs.core.windows.net/t"


def test_remote_delta_source_without_connector_is_refused():
    with pytest.raises(SourceError, match=r"source.path 'gs://lake/docs' is a gs: URI.*--packages io.delta"):
        check_source(SourceConfig(format="delta", path="gs://lake/docs"), connector=False)
    check_source(SourceConfig(format="delta", path="gs://lake/docs"), connector=True)
    check_source(SourceConfig(format="delta", path="s3a://lake/docs"), connector=False)  # delta-rs reaches S3
    # parquet/json/text go to Spark untouched: its file systems decide
    check_source(SourceConfig(format="parquet", path="s3://lake/docs"), connector=False)


def test_connector_coordinates_match_the_lock_everywhere():
    lock = dict(line.split("==") for line in (REPO / "requirements.lock").read_text().split()
                if line.startswith(("pyspark==", "delta-spark==", "delta_spark==")))
    spark_mm = ".".join(lock["pyspark"].split(".")[:2])
    expected = f"io.delta:delta-spark_{spark_mm}_2.13:{lock.get('delta-spark') or lock['delta_spark']}"
    assert delta_package() == expected
    shown = []
    for file in [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "conf").rglob("*.yaml")]:
        shown += re.findall(r"io\.delta:delta-spark_[\w.]+:[\w.<>]+", file.read_text())
    assert shown and set(shown) == {expected}


def test_doctests():
    import doctest

    from pipeline.io.delta import plan as sinks

    for module in (locations, sinks):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
