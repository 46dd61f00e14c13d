"""The runs table (pipeline.records.runs): rows written and replaced through deltalake, read back; no Spark."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.config import load_config
from pipeline.core.metrics import WorkerCounts, batch_metrics
from pipeline.records.recorder import RunRecorder
from pipeline.records.runs import RUNS_SCHEMA, read_runs, redact_config, run_row, write_run_row
from tests.support.runs import job_config, quality_record, summary


def test_started_row_is_replaced_by_the_final_row(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    out = io.StringIO()
    recorder = RunRecorder.begin(config, run_id="r1", ds=dt.date(2026, 11, 30), out=out)
    path = str(tmp_path / "scores_runs")
    assert config.resolved_runs_path() == path
    [started] = read_runs(path)
    assert (started["run_id"], started["outcome"], started["ended_at"], started["rows_in"]) == ("r1", "started", None, None)

    recorder.note(model_name="tiny", model_revision="abc123")
    recorder.end(summary=summary("r1"))
    [row] = read_runs(path)  # one row per run: the final row replaced the started one
    assert row["outcome"] == "ok" and row["error_class"] is None
    assert (row["rows_in"], row["rows_out"], row["rows_flagged"], row["rows_quarantined"]) == (100, 99, 2, 1)
    assert json.loads(row["status_counts"]) == {"error": 1, "ok": 98, "truncated": 1}
    assert (row["model_loads"], row["workers"], row["precision"], row["delta_version"]) == (2, 2, "fp32", 4)
    assert row["docs_per_s"] == pytest.approx(9.9) and row["padding_efficiency"] == pytest.approx(6 / 9)
    assert row["ds"] == dt.date(2026, 11, 30) and row["seconds"] >= 0
    metrics = json.loads(row["batch_metrics"])
    assert metrics["by_length"][0]["batches"] == 3 and len(metrics["slowest"]) == 3
    assert out.getvalue() == f"runs table              : {path} (version 1)\n"  # no warning


def test_failed_run_keeps_error_class_and_message(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    recorder = RunRecorder.begin(config, run_id="bad", ds=dt.date(2026, 11, 30))
    RunRecorder.begin(config, run_id="other", ds=dt.date(2026, 11, 30))  # a second run, left "started"
    recorder.end(error=FileNotFoundError("no such model folder /m"))
    rows = {r["run_id"]: r for r in read_runs(str(tmp_path / "scores_runs"))}
    assert rows["bad"]["outcome"] == "failed"
    assert rows["bad"]["error_class"] == "FileNotFoundError"
    assert rows["bad"]["error_message"] == "no such model folder /m"
    assert rows["bad"]["rows_in"] is None  # it failed before counting anything
    assert rows["other"]["outcome"] == "started"  # a crash mid-run leaves this


def test_an_unwritable_runs_table_fails_the_run_unless_the_job_says_best_effort(tmp_path: Path) -> None:
    """run.record: required (the default) refuses to start a run it cannot record, and fails a finished run
    whose final row cannot be written, saying what was committed; best_effort warns and goes on."""
    from pipeline.errors import RecordError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    config = job_config(tmp_path, runs_path=str(blocker / "runs"))
    assert config.run.record == "required"
    with pytest.raises(RecordError, match=r"could not write the 'started' row of run r1 to the runs table "
                                          r".*/file/runs: FileExistsError: .*Nothing was run; .*run.record: best_effort"):
        RunRecorder.begin(config, run_id="r1", ds=dt.date(2026, 11, 30), out=io.StringIO())

    recorder = RunRecorder.begin(job_config(tmp_path), run_id="r2", ds=dt.date(2026, 11, 30), out=io.StringIO())
    recorder.path = str(blocker / "runs")  # the table became unwritable while the run ran
    with pytest.raises(RecordError, match=r"the run's output is committed \(/out, version 4\), but its row in the "
                                          r"runs table .*/file/runs could not be written: FileExistsError"):
        recorder.end(summary=summary("r2"))
    failing = RunRecorder.begin(job_config(tmp_path), run_id="r3", ds=dt.date(2026, 11, 30), out=io.StringIO())
    failing.path = str(blocker / "runs")
    failing.end(error=ValueError("boom"))  # a run that already fails is not failed again by its record: a line

    out = io.StringIO()
    recorder = RunRecorder.begin(job_config(tmp_path, runs_path=str(blocker / "runs"), record="best_effort"),
                                 run_id="r4", ds=dt.date(2026, 11, 30), out=out)
    recorder.end(summary=summary("r4"))  # must not raise
    assert "warning: could not record the run (started)" in out.getvalue()
    assert "warning: could not record the run (ok)" in out.getvalue()
    assert "(run.record: best_effort, the run goes on unrecorded)" in out.getvalue()
    assert f"runs table              : not recorded at {blocker / 'runs'}: FileExistsError" in out.getvalue()
    assert recorder.row is not None and recorder.row["outcome"] == "ok"


def test_secrets_are_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "job.yaml"
    conf.write_text(
        "job: j\nsource: {path: '${SRC_PATH}'}\nmodel: {path: /m}\ntask: {kind: embed}\n"
        "sink: {path: /out}\nspark: {conf: {spark.hadoop.fs.s3a.secret.key: pl41n-s3cret, spark.hadoop.fs.s3a.access.key: ak}}\n"
        "batching: {token_budget: 4096}\n"
    )
    monkeypatch.setenv("SRC_PATH", "s3://bucket/docs?sig=xyz")
    config = load_config(conf, overrides=["sink.path=/out2"])
    row = run_row(config=config, run_id="r", ds=dt.date(2026, 1, 1), started_at=dt.datetime.now(dt.timezone.utc),
                  outcome="started")
    stored = json.loads(row["config_json"])
    assert stored["source"]["path"] == "***"  # from ${SRC_PATH}
    assert stored["spark"]["conf"] == {"spark.hadoop.fs.s3a.secret.key": "***", "spark.hadoop.fs.s3a.access.key": "***"}
    assert stored["batching"]["token_budget"] == 4096 and stored["sink"]["path"] == "/out2"
    assert "xyz" not in row["config_json"] and "pl41n-s3cret" not in row["config_json"]
    # same settings on another night: same hash; another setting: another hash
    other_night = load_config(conf, overrides=["sink.path=/out2", "run.ds=2026-02-02"])
    changed = load_config(conf, overrides=["sink.path=/out3"])
    kw = dict(run_id="r", ds=dt.date(2026, 1, 1), started_at=dt.datetime.now(dt.timezone.utc), outcome="started")
    assert run_row(config=other_night, **kw)["config_hash"] == row["config_hash"]
    assert run_row(config=changed, **kw)["config_hash"] != row["config_hash"]


def test_redact_lists_and_key_names() -> None:
    data = {"a": ["x", "y"], "password_file": "/p", "max_new_tokens": 8, "auth": {"user": "u"}}
    assert redact_config(data, {"a[1]"}) == {"a": ["x", "***"], "password_file": "***", "max_new_tokens": 8,
                                             "auth": "***"}


def test_write_run_row_matches_schema_and_appends(tmp_path: Path) -> None:
    path = str(tmp_path / "runs")
    config = job_config(tmp_path)
    now = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.timezone.utc)
    for i in range(3):
        row = run_row(config=config, run_id=f"r{i}", ds=dt.date(2026, 11, 28 + i),
                      started_at=now + dt.timedelta(days=i), outcome="ok", summary=summary(f"r{i}", rows=10 * (i + 1)))
        write_run_row(path, row)
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table()
    assert table.schema.names == RUNS_SCHEMA.names
    assert [r["rows_in"] for r in read_runs(path)] == [10, 20, 30]
    assert [r["run_id"] for r in read_runs(path, run_id="r1")] == ["r1"]


def test_per_batch_metrics_stay_small_and_keep_totals() -> None:
    """A long task (20,000 batches over ~4 hours) and a second worker: bounded volume, exact totals."""
    from pipeline.core.metrics import SLOWEST_PER_TASK, TIMELINE_POINTS, TIMELINE_TASK_POINTS, merge_counts

    clock = [1_700_000_000.0]
    merged: dict = {}
    for worker, batches in (("host:1", 20_000), ("host:2", 50)):
        counts = WorkerCounts(worker=worker, task=0, clock=lambda: clock[0])
        for i in range(batches):
            clock[0] += 0.7
            length = 8 * (1 + i % 32)
            counts.add_batch(rows=4, tokens=3 * length, padded_tokens=4 * length, padded_length=length,
                             seconds=0.01 * (i % 97))
        assert len(counts.counts["timeline"][worker]) <= TIMELINE_TASK_POINTS
        merge_counts(merged, json.loads(json.dumps(counts.counts)))  # as they travel: plain JSON
    assert len(json.dumps(merged)) < 50_000
    metrics = batch_metrics(merged)
    assert sum(b["batches"] for b in metrics["by_length"]) == 20_050 and len(metrics["by_length"]) == 32
    assert all(len(points) <= TIMELINE_POINTS for points in metrics["timeline"].values())
    assert sum(p[1] for points in metrics["timeline"].values() for p in points) == 4 * 20_050
    assert len(metrics["slowest"]) == 2 * SLOWEST_PER_TASK  # the slowest of each task
    assert metrics["slowest"][0]["seconds"] == pytest.approx(0.96)


def test_run_job_failing_before_spark_leaves_a_failed_row(tmp_path: Path) -> None:
    """A run that dies on the driver (here: no model folder) is on the record too, with its error."""
    from pipeline.models.loading import ModelError
    from pipeline.runner import run_job

    config = job_config(tmp_path, ds="2026-11-30", run_id="nomodel")
    with pytest.raises(ModelError):
        run_job(config, out=io.StringIO())
    [row] = read_runs(str(tmp_path / "scores_runs"))
    assert (row["run_id"], row["outcome"], row["ds"]) == ("nomodel", "failed", dt.date(2026, 11, 30))
    assert row["error_class"] == "pipeline.errors.ModelError" and "does not exist" in row["error_message"]
    assert row["ended_at"] >= row["started_at"] and row["spark_app_id"] is None


def test_spark_identity_on_both_session_kinds(any_spark) -> None:
    """The runs table's application id and master, from a classic and a Spark Connect session alike."""
    from pipeline.records.runs import spark_identity

    app_id, master = spark_identity(any_spark)
    assert app_id and master and master.startswith("local")


def test_storage_keys_are_secrets_everywhere_a_config_shows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage: keys, from ${VAR} or written in the file, never show in the runs row, `pipeline check`,
    a dump of the config or an error message the row records; they still reach the stores."""
    conf = tmp_path / "job.yaml"
    conf.write_text(
        "job: j\nsource: {path: /d}\nmodel: {path: /m}\ntask: {kind: embed}\nsink: {path: s3a://lake/out}\n"
        "storage: {access_key_id: '${T_KEY_ID}', secret_access_key: '${T_SECRET}', session_token: literal-tok,"
        " region: eu-west-1, endpoint_url: 'http://127.0.0.1:9', allow_http: true}\n"
    )
    monkeypatch.setenv("T_KEY_ID", "AKIDSEEN0")
    monkeypatch.setenv("T_SECRET", "s3cr3t-never-shown")
    config = load_config(conf)
    assert config.storage.options() == {
        "aws_access_key_id": "AKIDSEEN0", "aws_secret_access_key": "s3cr3t-never-shown",
        "aws_session_token": "literal-tok", "aws_region": "eu-west-1", "aws_endpoint_url": "http://127.0.0.1:9",
        "aws_allow_http": "true"}
    error = PermissionError("denied for AKIDSEEN0 with s3cr3t-never-shown")
    row = run_row(config=config, run_id="r", ds=dt.date(2026, 1, 1), started_at=dt.datetime.now(dt.timezone.utc),
                  outcome="failed", error=error)
    shown = [row["config_json"], row["error_message"], json.dumps(config.printable()), config.model_dump_json(),
             repr(config), str(config.model_dump())]
    for text in shown:
        for secret in ("AKIDSEEN0", "s3cr3t-never-shown", "literal-tok"):
            assert secret not in text, (secret, text)
    stored = json.loads(row["config_json"])["storage"]
    assert stored["access_key_id"] == stored["secret_access_key"] == stored["session_token"] == "***"
    assert stored["region"] == "eu-west-1" and row["error_message"] == "denied for *** with ***"
    shown_by_check = config.printable()["storage"]  # a ${VAR} shows as its name, a key named like a secret as ***
    assert (shown_by_check["access_key_id"], shown_by_check["secret_access_key"]) == ("${T_KEY_ID}", "***")
    # the keys (rotating) are not settings of the run: same hash with other keys
    monkeypatch.setenv("T_SECRET", "rotated")
    kw = dict(run_id="r", ds=dt.date(2026, 1, 1), started_at=dt.datetime.now(dt.timezone.utc), outcome="started")
    assert run_row(config=load_config(conf), **kw)["config_hash"] == row["config_hash"]


def test_a_runs_table_the_deltalake_package_cannot_reach_waits_for_the_runs_spark_session(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gs:// (abfss://, a Volume) runs table is written through the run's session and its Delta connector: the
    started row waits for the session; a run that ends before it has one is not recorded, and says why."""
    import pipeline.records.recorder
    from pipeline.errors import RecordError

    monkeypatch.setattr(pipeline.records.recorder, "_active_session", lambda: None)  # no other test's session in reach

    config = job_config(tmp_path, runs_path="gs://bucket/runs")
    recorder = RunRecorder.begin(config, run_id="r1", ds=dt.date(2026, 11, 30), out=io.StringIO())
    assert recorder.pending and recorder.version is None and recorder.via_spark.endswith("not gs:")
    with pytest.raises(RecordError, match=r"runs table gs://bucket/runs could not be written: it is written "
                                          r"through the run's Spark session \(.*not gs:\), and the run ended "
                                          "before it had one"):
        recorder.end(summary=summary("r1"))
    out = io.StringIO()
    recorder = RunRecorder.begin(job_config(tmp_path, runs_path="gs://bucket/runs", record="best_effort"),
                                 run_id="r2", ds=dt.date(2026, 11, 30), out=out)
    recorder.end(summary=summary("r2"))
    assert "runs table              : not recorded at gs://bucket/runs: it is written through the run's Spark " \
           "session" in out.getvalue()
    assert recorder.row is not None and recorder.row["outcome"] == "ok"


def test_two_first_runs_create_one_runs_table_and_keep_both_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs that both find no runs table write their rows at the same instant (a thread barrier in front
    of delta-rs's write, five times over). delta-rs retried the losing create as a second ``CREATE TABLE``,
    which gave the table a new id under every reader; the loser now merges its row into the table that won."""
    import functools

    import deltalake
    from deltalake import DeltaTable

    from tests.support.drivers import at_once, entered_together

    monkeypatch.setattr(deltalake, "write_deltalake", entered_together(deltalake.write_deltalake))
    config = job_config(tmp_path)
    now = dt.datetime(2026, 11, 30, 1, 0, tzinfo=dt.timezone.utc)
    for trial in range(5):
        path = str(tmp_path / f"runs{trial}")
        rows = {name: run_row(config=config, run_id=name, ds=dt.date(2026, 11, 30), started_at=now, outcome="ok",
                              summary=summary(name)) for name in ("a", "b")}
        at_once({name: functools.partial(write_run_row, path, row) for name, row in rows.items()})
        assert sorted(r["run_id"] for r in read_runs(path)) == ["a", "b"], f"trial {trial}"
        log = sorted((Path(path) / "_delta_log").glob("*.json"))
        creates = [f.name for f in log if any("metaData" in json.loads(line) for line in f.read_text().splitlines())]
        assert creates == [f"{0:020d}.json"], f"trial {trial}: the table's metadata set in {creates}"
        assert DeltaTable(path).version() == 1


def test_a_runs_table_from_before_gains_the_profile_and_drift_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "scores_runs")
    old_schema = pa.schema([f for f in RUNS_SCHEMA if f.name not in ("profile", "drift")])
    old = run_row(config=job_config(tmp_path), run_id="old", ds=dt.date(2026, 11, 29),
                  started_at=dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc), outcome="ok", summary=summary("old"))
    write_deltalake(path, pa.Table.from_pylist([{k: old[k] for k in old_schema.names}], schema=old_schema))
    new = summary("new")
    new.quality = quality_record()
    write_run_row(path, run_row(config=job_config(tmp_path), run_id="new", ds=dt.date(2026, 11, 30),
                                started_at=dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc), outcome="ok",
                                summary=new))
    rows = {r["run_id"]: r for r in read_runs(path)}
    assert rows["old"]["profile"] is None and rows["old"]["drift"] is None
    assert json.loads(rows["new"]["drift"])["action"] == "warned"
    assert json.loads(rows["new"]["profile"])["cat"]["status"]["skipped_empty"] == 133
    assert "quality" not in json.loads(rows["new"]["summary_json"]), "kept once, in its own columns"


def test_a_refused_run_is_recorded_refused_with_what_moved(tmp_path: Path) -> None:
    from pipeline.errors import DriftRefused

    recorder = RunRecorder.begin(job_config(tmp_path), run_id="n2", ds=dt.date(2026, 11, 30))
    recorder.end(error=DriftRefused("refused to publish: status moved", quality=quality_record("refused")))
    [row] = read_runs(str(tmp_path / "scores_runs"))
    assert row["outcome"] == "refused" and row["error_class"] == "pipeline.errors.DriftRefused"
    assert json.loads(row["drift"])["action"] == "refused" and json.loads(row["profile"])["cat"]["status"]


def test_every_row_records_what_the_run_ran_with_and_an_older_table_gains_the_column(tmp_path: Path) -> None:
    """The library, pyspark, torch and transformers versions go into every row (a started or failed one too)
    and into the summary; a runs table written before the column existed gains it on the next write."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from pipeline.core.compat import runtime_versions

    config = job_config(tmp_path)
    path = str(tmp_path / "scores_runs")
    old_schema = pa.schema([f for f in RUNS_SCHEMA if f.name != "versions"])
    old = run_row(config=config, run_id="old", ds=dt.date(2026, 11, 29), started_at=dt.datetime.now(dt.timezone.utc),
                  outcome="ok")
    write_deltalake(path, pa.Table.from_pylist([{k: v for k, v in old.items() if k != "versions"}], schema=old_schema))
    recorder = RunRecorder.begin(config, run_id="r1", ds=dt.date(2026, 11, 30))
    [started] = [r for r in read_runs(path) if r["run_id"] == "r1"]
    assert json.loads(started["versions"]) == runtime_versions()
    recorder.end(summary=summary("r1"))
    rows = {r["run_id"]: r for r in read_runs(path)}
    assert rows["old"]["versions"] is None  # nothing invented for a row written before
    recorded = json.loads(rows["r1"]["versions"])
    assert {"spark_batch_inference", "pyspark", "torch", "transformers", "python"} <= set(recorded)
    assert recorded == runtime_versions()


@pytest.mark.connector
def test_the_runs_table_through_the_connector_on_both_session_kinds(any_spark, tmp_path: Path) -> None:
    """The connector's runs table (a Volume's, an abfss:// one): created by the first row, the started row replaced
    by the final one in one MERGE, an older table's missing columns added, and every row read back by deltalake
    (the report and the drift gate read it so), from a classic and a Spark Connect session alike."""
    from pipeline.records.runs import write_run_row_through_spark

    config = job_config(tmp_path)
    path = str(tmp_path / "runs")
    started = run_row(config=config, run_id="r1", ds=dt.date(2026, 11, 30), started_at=dt.datetime.now(dt.timezone.utc),
                      outcome="started")
    old = {k: v for k, v in started.items() if k not in ("versions", "profile", "drift")}
    any_spark.createDataFrame(pa.Table.from_pylist([old], schema=pa.schema(
        [f for f in RUNS_SCHEMA if f.name in old]))).write.format("delta").save(path)  # a table from before
    final = run_row(config=config, run_id="r1", ds=dt.date(2026, 11, 30), started_at=started["started_at"],
                    outcome="ok", ended_at=dt.datetime.now(dt.timezone.utc), summary=summary("r1"),
                    model_name="tiny")
    quality = quality_record()
    final.update(profile=json.dumps(quality["profile"]), drift=json.dumps(quality["drift"]))
    version = write_run_row_through_spark(any_spark, path, final)
    write_run_row_through_spark(any_spark, path, {**started, "run_id": "r2"})
    rows = {r["run_id"]: r for r in read_runs(path)}
    assert version == 1 and set(rows) == {"r1", "r2"}
    assert rows["r1"]["outcome"] == "ok" and rows["r1"]["rows_in"] == 100 and json.loads(rows["r1"]["profile"])
    assert rows["r2"]["outcome"] == "started" and rows["r1"]["versions"]
