"""A run's lines and events through logging (pipeline.core.logs), and its Spark jobs named after it
(pipeline.spark.job_labels): JSON lines parsed one by one, an application's own handler, where the records go
when nothing handles them, a failed run's event, and every Spark job of a run read back from Spark's event log."""

from __future__ import annotations

import io
import json
import logging
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.core.logs import RunLog
from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import job_config

# the driver's stages, as StageClock laps them and as the run's Spark jobs are described
STAGES = {"runs table", "model check", "session", "pre-flight", "idempotency", "planning", "inference and check",
          "quality gate", "quarantine commit", "commit", "read-back", "summary"}


def _events(text: str) -> list[dict]:
    """Every line, parsed: a line that is not one JSON object fails the test."""
    events = [json.loads(line) for line in text.splitlines()]
    assert events and all(isinstance(e, dict) and e["ts"] and e["level"] and e["event"] for e in events)
    return events


def _stage_seconds(events: list[dict]) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for event in events:
        if event["event"] == "stage":
            seconds[event["stage"]] += event["seconds"]
    return dict(seconds)


class _Caught(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_json_lines_give_one_event_per_stage_and_the_summary_and_an_applications_handler_gets_them_too(
        spark, tmp_path, tiny_embed_model):
    docs = make_documents(40)
    texts = docs["text"].to_pylist()
    texts[7] = "a POISON review"  # one quarantined row: the quarantine commit is a stage of its own
    write_delta(tmp_path / "docs", docs.set_column(1, "text", pa.array(texts, pa.string())))
    config = job_config(tmp_path, tiny_embed_model, run={
        "run_id": "2026-11-29", "log_format": "json", "faults": {"poison_marker": "POISON"},
        "max_error_fraction": 0.2})
    caught, logger = _Caught(), logging.getLogger("pipeline")
    logger.addHandler(caught)  # as a notebook or Airflow configures logging
    logger.setLevel(logging.INFO)
    try:
        out = io.StringIO()
        summary = run_job(config, spark=spark, out=out)
    finally:
        logger.removeHandler(caught)
        logger.setLevel(logging.NOTSET)
    assert summary.complete and (summary.rows_in, summary.rows_quarantined) == (40, 1)

    events = _events(out.getvalue())
    assert {(e["job"], e["run_id"]) for e in events} == {("score_test", "2026-11-29")}
    seconds = _stage_seconds(events)
    assert set(seconds) == set(summary.stage_seconds) and {"inference and check", "quarantine commit"} <= set(seconds)
    assert set(seconds) <= STAGES
    assert all(abs(seconds[k] - summary.stage_seconds[k]) < 0.01 for k in seconds)
    stage = {e["stage"]: e for e in events if e["event"] == "stage"}
    assert stage["planning"]["rows"] == 40 and stage["planning"]["tasks"] == summary.tasks
    assert stage["quarantine commit"]["rows"] == 1 and stage["quarantine commit"]["version"] == 0
    assert stage["commit"]["version"] == summary.delta_version and stage["read-back"]["rows"] == summary.rows_out
    assert [e["stage"] for e in events if e["event"] == "stage"].count("runs table") == 2  # before and after
    [ended] = [e for e in events if e["event"] == "summary"]
    assert ended["summary"]["rows_out"] == summary.rows_out and "message" not in ended
    said = [e["message"] for e in events if e["event"] == "message"]
    assert any(m.startswith("[score_test] run 2026-11-29: scoring 40 rows in") for m in said), said
    assert any(m.startswith("runs table              : ") for m in said)

    # the application's handler got every record, its text as a user reads it
    assert {r.name for r in caught.records} >= {"pipeline.run", "pipeline.run.stage", "pipeline.run.summary"}
    texts_seen = [r.getMessage() for r in caught.records]
    assert any(t.startswith("[score_test] run 2026-11-29: scoring 40 rows in") for t in texts_seen)
    assert any(t.startswith("[score_test] run 2026-11-29: stage planning took ") for t in texts_seen)
    assert sum(r.name == "pipeline.run.stage" for r in caught.records) == sum(e["event"] == "stage" for e in events)


def test_a_failed_run_is_an_event_naming_its_stage_and_plain_text_shows_no_event(spark, tmp_path):
    from pipeline.errors import ModelError

    write_delta(tmp_path / "docs", make_documents(5))
    missing = tmp_path / "no-model"
    out = io.StringIO()
    with pytest.raises(ModelError):
        run_job(job_config(tmp_path, missing, run={"run_id": "broken", "log_format": "json"}), spark=spark, out=out)
    events = _events(out.getvalue())
    [failed] = [e for e in events if e["event"] == "run_failed"]
    assert (failed["level"], failed["stage"], failed["error_class"], failed["run_id"]) == (
        "ERROR", "model check", "ModelError", "broken")
    assert str(missing) in failed["error"]
    plain = io.StringIO()
    with pytest.raises(ModelError):
        run_job(job_config(tmp_path, missing, run={"run_id": "broken-2"}), spark=spark, out=plain)
    assert plain.getvalue() == ""  # the error line is the caller's (the CLI prints it); events stay out of plain text


def test_records_go_to_stdout_when_nothing_handles_them_and_only_to_the_application_when_it_does(capsys):
    logger = logging.getLogger("pipeline")
    logger.propagate = False  # nothing above: as in a spark-submit job that configures no logging
    try:
        RunLog(job="j", run_id="r1").line("[j] run r1: scoring 3 rows")
        RunLog(job="j", run_id="r1", fmt="json").warning("[j] run r1: warning: staging off")
        printed = capsys.readouterr().out.splitlines()
        assert printed[0] == "[j] run r1: scoring 3 rows"
        warned = json.loads(printed[1])
        assert warned["level"] == "WARNING" and warned["message"].endswith("staging off")
        logger.setLevel(logging.WARNING)  # the pipeline loggers' own level holds for that output too
        RunLog(job="j", run_id="r1").line("an info line")
        assert capsys.readouterr().out == ""
        logger.setLevel(logging.NOTSET)

        caught = _Caught()
        logger.addHandler(caught)
        logger.setLevel(logging.INFO)
        RunLog(job="j", run_id="r1").line("[j] run r1: to the application")
        assert capsys.readouterr().out == "" and [r.getMessage() for r in caught.records] == [
            "[j] run r1: to the application"]
        logger.removeHandler(caught)
    finally:
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def test_log_json_on_the_command_line_is_run_log_format_json(tmp_path):
    from pipeline.cli import build_parser, config_from_args
    from pipeline.config.identity import config_hash

    path = tmp_path / "job.yaml"
    path.write_text("job: t\nsource: {path: /d}\nmodel: {path: /m}\ntask: {kind: embed}\nsink: {path: /out}\n")
    plain = config_from_args(build_parser().parse_args(["run", str(path)]))
    as_json = config_from_args(build_parser().parse_args(["run", str(path), "--log-json"]))
    assert (plain.run.log_format, as_json.run.log_format) == ("plain", "json")
    # how the lines look is no setting of the run: the runs table's config hash stays
    assert config_hash(plain.model_dump(mode="json")) == config_hash(as_json.model_dump(mode="json"))


@pytest.mark.beside
def test_every_spark_job_of_a_run_carries_its_job_run_id_and_stage_in_the_event_log(own_process_run):
    """A run in a process of its own (a small job: its warm-up job runs on a thread of its own), its JSON lines
    on stdout, then Spark's event log: every job started carries the run's description and run tag."""
    result, lines = own_process_run  # the run tests/spark/test_threads.py reads too (tests/conftest.py)
    events = _events("\n".join(lines))
    assert {(e["job"], e["run_id"]) for e in events} == {("labelled", "20261129")}
    assert set(_stage_seconds(events)) == set(result["stage_seconds"])
    assert sum(e["event"] == "summary" for e in events) == 1
    assert any(e["event"] == "message" and "small job" in e["message"] for e in events)

    # Spark 4 rolls its event log: a folder eventlog_v2_<app id> of events_<n>_<app id> files
    logged = [line for f in sorted(Path(result["events"]).rglob("events_*")) for line in f.read_text().splitlines()]
    starts = [e for e in map(json.loads, logged) if e["Event"] == "SparkListenerJobStart"]
    assert len(starts) >= 3
    for start in starts:
        properties = start["Properties"]
        assert "sbi-run-20261129" in properties.get("spark.job.tags", "").split(","), properties
        assert properties.get("spark.job.description", "").startswith("[labelled] run 20261129: "), properties
    named = {s["Properties"]["spark.job.description"].split(": ", 1)[1] for s in starts}
    # (the read-back reads the commits' log entries: no Spark job of its own unless they disagree)
    assert {"warm-up", "inference and check", "commit"} <= named <= STAGES | {"warm-up"}, named
