"""Streaming jobs (``source.stream``) on both writers: a Delta source and a folder of JSON lines, the two triggers,
the runs table fed per run or per interval, SIGTERM after the running micro-batch, a schema change named.

Rows are checked by key on the tables read back (each id once, in the output or the quarantine), not by count.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from pipeline.errors import DriftRefused, JobError, RunStopped, SourceError
from pipeline.runner import run_job
from pipeline.records.runs import read_runs

from tests.support.data import CONNECT_MODE, make_corpus, make_documents, write_delta
from tests.support.drivers import Helper, wait_for
from tests.support.jobs import job_config, read_scores

POISON = "POISON"


def _docs(start: int, n: int, *, poison: int | None = None, bad: bool = False) -> pa.Table:
    """``n`` documents ``d<start>``...; the row ``poison`` fails any batch it is in (the drill below)."""
    docs = make_documents(start + n, with_bad_rows=bad).slice(start)
    if poison is None:
        return docs
    texts = docs["text"].to_pylist()
    texts[poison - start] = f"a {POISON} review that fails every time"
    return docs.set_column(1, "text", pa.array(texts, pa.string()))


def _stream_config(tmp_path: Path, model: Path, stream: dict, **sections):
    run = {"faults": {"poison_marker": POISON}, "max_error_fraction": 0.2, **sections.pop("run", {})}
    source = {"stream": {"checkpoint_path": str(tmp_path / "checkpoint"), **stream}, **sections.pop("source", {})}
    return job_config(tmp_path, model, source=source, run=run, **sections)


def _rows(table: str | Path) -> list[dict]:
    """The table's rows; none when it does not exist yet (any other error reading it is raised)."""
    try:
        delta = DeltaTable(str(table))
    except TableNotFoundError:
        return []
    return pa.table(delta.to_pyarrow_table()).to_pylist()


def _each_once(tmp_path: Path, ids: list[str], *, quarantined: set[str]) -> None:
    """Every id once over the output and the quarantine, the ``quarantined`` ones in the quarantine only."""
    out = [r["doc_id"] for r in _rows(tmp_path / "scores")]
    bad = [r["doc_id"] for r in _rows(tmp_path / "scores_quarantine")]
    assert sorted(out + bad, key=str) == sorted(ids, key=str), "each id once, by key"
    assert sorted(bad, key=str) == sorted(quarantined, key=str)


def test_available_now_scores_each_arrival_once_and_records_each_run(spark, tmp_path, tiny_embed_model, writer):
    """A Delta source read from version 0, a commit per micro-batch: the first run scores both arrivals in two
    micro-batches (the poison row quarantined once), the second only the third arrival, the third nothing."""
    write_delta(tmp_path / "docs", _docs(0, 12, poison=5, bad=True))
    write_delta(tmp_path / "docs", _docs(12, 10), mode="append")
    config = _stream_config(tmp_path, tiny_embed_model, {"starting_version": 0, "max_files_per_trigger": 1},
                            run={"run_id": "night-1"})
    out = io.StringIO()
    first = run_job(config, spark=spark, out=out)
    assert (first.rows_in, first.rows_out, first.rows_quarantined) == (22, 21, 1) and first.complete, out.getvalue()
    assert first.status["error"] == 1 and first.stream["micro_batches"] == 2 and first.stream["batch_ids"] == [0, 1]
    # built as a batch run's summary is (tests/run/test_summaries.py): the run's own lines too
    assert "torch threads" in first.details and "torch threads" in first.render(), first.render()
    assert "micro-batch 0: 12 rows in, 11 out, 1 quarantined" in out.getvalue(), out.getvalue()
    (source,) = first.stream["sources"]
    assert source["start_offset"] is None and source["end_offset"], source
    _each_once(tmp_path, [f"d{i:05d}" for i in range(22)], quarantined={"d00005"})
    assert {r["run_id"] for r in _rows(tmp_path / "scores")} == {"night-1"}

    write_delta(tmp_path / "docs", _docs(22, 5), mode="append")
    second = run_job(job_config(tmp_path, tiny_embed_model, source=config.source.model_dump(),
                                run={"run_id": "night-2", "faults": {"poison_marker": POISON}}),
                     spark=spark, out=io.StringIO())
    assert (second.rows_in, second.rows_out, second.stream["batch_ids"]) == (5, 5, [2, 2])
    assert second.stream["sources"][0]["start_offset"] == source["end_offset"], "it read on where the first stopped"
    third = run_job(config.model_copy(update={"run": config.run.model_copy(update={"run_id": "night-3"})}),
                    spark=spark, out=io.StringIO())
    assert (third.rows_in, third.stream["micro_batches"]) == (0, 0), "nothing new: no micro-batch, nothing written"
    _each_once(tmp_path, [f"d{i:05d}" for i in range(27)], quarantined={"d00005"})

    runs = read_runs(str(tmp_path / "scores_runs"))
    assert [(r["run_id"], r["outcome"], r["rows_in"]) for r in runs] == \
        [("night-1", "ok", 22), ("night-2", "ok", 5), ("night-3", "ok", 0)]
    recorded = json.loads(runs[0]["summary_json"])["stream"]
    assert recorded["sources"] == first.stream["sources"] and recorded["checkpoint"] == str(tmp_path / "checkpoint")
    # the drift gate ran on each micro-batch; the run's row profiles both together (22 statuses), and the next
    # night was compared with it
    assert sum(json.loads(runs[0]["profile"])["cat"]["status"].values()) == 22, runs[0]["profile"]
    assert json.loads(runs[1]["drift"])["history"] == ["night-1"], runs[1]["drift"]

    # the error budget holds per micro-batch: one over it stops the stream with nothing of it committed, and
    # the same micro-batch is read again once the budget allows it
    write_delta(tmp_path / "docs", _docs(27, 3, poison=28), mode="append")
    with pytest.raises(JobError, match=r"1 of 3 rows failed .* over the error budget"):
        run_job(config, spark=spark, out=io.StringIO())
    _each_once(tmp_path, [f"d{i:05d}" for i in range(27)], quarantined={"d00005"})
    allowed = run_job(_stream_config(tmp_path, tiny_embed_model, {"starting_version": 0, "max_files_per_trigger": 1},
                                     run={"run_id": "night-5", "max_error_fraction": 0.5}),
                      spark=spark, out=io.StringIO())
    assert (allowed.rows_in, allowed.rows_quarantined, allowed.stream["batch_ids"]) == (3, 1, [3, 3])
    _each_once(tmp_path, [f"d{i:05d}" for i in range(30)], quarantined={"d00005", "d00028"})


@pytest.mark.timeout(900)
def test_below_spark_4_2_an_available_now_run_reads_in_limited_micro_batches_and_stops(spark, tmp_path,
                                                                                      tiny_embed_model, monkeypatch):
    """Spark 4.0 and 4.1 hand a Python stream reader no read limit and run an available-now query as one
    micro-batch: the jar-free reader then applies the limit itself and the job runs the query on a processing-time
    trigger to the version the table had at the start (``OpenStream.until``), stopping it there. Taken here on
    the suite's Spark by moving the line that passes limits; the wheel's smoke set runs it on a real 4.0."""
    import pipeline.core.compat
    from pipeline.io.streams import open_stream

    monkeypatch.setattr(pipeline.core.compat, "STREAM_READ_LIMITS_SINCE", (99, 0))
    write_delta(tmp_path / "docs", _docs(0, 4))
    for start in (4, 8):
        write_delta(tmp_path / "docs", _docs(start, 4), mode="append")
    config = _stream_config(tmp_path, tiny_embed_model, {"starting_version": 0, "max_files_per_trigger": 1})
    assert open_stream(spark, config.source).until == 2, "an available-now run to version 2 on a processing trigger"
    first = run_job(config, spark=spark, out=io.StringIO())
    assert (first.rows_in, first.stream["batch_ids"]) == (12, [0, 2]), "a commit per micro-batch, then it stopped"
    _each_once(tmp_path, [f"d{i:05d}" for i in range(12)], quarantined=set())

    write_delta(tmp_path / "docs", _docs(12, 3), mode="append")
    assert open_stream(spark, config.source).until == 3, "read on from the checkpoint's last offset (version 2)"
    second = run_job(config, spark=spark, out=io.StringIO())
    assert (second.rows_in, second.stream["batch_ids"]) == (3, [3, 3])
    assert open_stream(spark, config.source).until is None, "nothing left to read: a plain available-now query"
    third = run_job(config, spark=spark, out=io.StringIO())
    assert (third.rows_in, third.stream["micro_batches"]) == (0, 0)
    _each_once(tmp_path, [f"d{i:05d}" for i in range(15)], quarantined=set())


def _json_lines(folder: Path, name: str, docs: pa.Table, *, malformed: str | None = None) -> None:
    lines = [json.dumps(row) for row in docs.to_pylist()] + ([malformed] if malformed else [])
    (folder / f".{name}").write_text("\n".join(lines) + "\n")
    os.replace(folder / f".{name}", folder / name)  # whole files only: the stream lists the folder meanwhile


def _sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_once_stopping_the_next_micro_batch_is_refused_untouched():
    """What a SIGTERM leaves to Spark: the micro-batch it starts after the running one finished raises (so the
    checkpoint never counts it done) before reading a row; a restart reads it."""
    from types import SimpleNamespace

    from pipeline.stages.micro_batch import MicroBatches

    class Untouchable:
        def __getattr__(self, name: str):
            raise AssertionError(f"the refused micro-batch was read: .{name}")

    batches = MicroBatches(SimpleNamespace(config=SimpleNamespace(job="j")), SimpleNamespace(run_id="r"),
                           fixed_ds=True)
    batches.begin("q")
    assert batches.stop(timeout_s=0), "nothing runs: the stop returns at once"
    with pytest.raises(RunStopped, match="stopped by SIGTERM before micro-batch 5: a restart reads it"):
        batches(Untouchable(), 5)
    assert batches.take_results() == [] and batches.failure is None


@pytest.mark.timeout(300)
def test_a_stream_on_spark_connect_is_refused_before_its_query_starts(spark_connect, tmp_path, tiny_embed_model,
                                                                      monkeypatch):
    monkeypatch.setenv(CONNECT_MODE, "1")
    write_delta(tmp_path / "docs", _docs(0, 4))
    with pytest.raises(JobError, match="source.stream: this job cannot run as a stream: its micro-batches commit "
                                       "through foreachBatch, which a Spark Connect session runs on the server"):
        run_job(_stream_config(tmp_path, tiny_embed_model, {"starting_version": 0}), spark=spark_connect,
                out=io.StringIO())
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "scores").exists()


@pytest.mark.timeout(300)
def test_a_stream_on_a_served_model_is_refused_before_its_query_starts(spark, tmp_path, tiny_embed_model):
    from tests.support.openai_server import OpenAIServer

    write_delta(tmp_path / "docs", _docs(0, 4))
    server = OpenAIServer(embed_dir=tiny_embed_model, api_key="sk-test-0123456789abcdef").start()
    try:
        task = {"kind": "embed", "backend": "endpoint",
                "endpoint": {"base_url": server.url, "model": "tiny-embed", "api_key": "sk-test-0123456789abcdef"}}
        with pytest.raises(JobError, match="cannot run as a stream: a served model's answers are journaled in a "
                                           "run's staging folder"):
            run_job(_stream_config(tmp_path, tiny_embed_model, {"starting_version": 0}, task=task), spark=spark,
                    out=io.StringIO())
    finally:
        server.stop()
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "scores").exists()


@pytest.mark.drills  # a processing-time stream, SIGTERM
def test_processing_time_reads_a_folder_until_sigterm_and_a_restart_reads_on(spark, tmp_path, tiny_embed_model,
                                                                             writer):
    """A folder of JSON lines (with a malformed line), a micro-batch every second, a runs-table row per second of
    micro-batches and none for a quiet stretch; a SIGTERM while a micro-batch runs (held after its output commit,
    the next file already there) lets that one finish and starts no other; the same job again reads only what
    was not committed (as a nightly available-now run on the same checkpoint)."""
    incoming, barrier = tmp_path / "incoming", tmp_path / "barrier"
    incoming.mkdir()
    barrier.mkdir()
    _json_lines(incoming, "a.json", _docs(0, 8, poison=3), malformed='{"doc_id": "d99999", "text": "cut off')
    # every micro-batch waits after its output commit until barrier/release exists (at most 120 s)
    held = {"output_barrier": {"dir": str(barrier), "parties": 99, "timeout_s": 120}}
    config = _stream_config(tmp_path, tiny_embed_model, {"trigger": "processing_time", "interval_s": 1,
                                                         "record_every_s": 1},
                            source={"format": "json", "path": str(incoming), "keep_columns": []},
                            run={"run_id": "live", "max_error_fraction": 0.3,
                                 "faults": {"poison_marker": POISON, **held}})
    scored = lambda: len(_rows(tmp_path / "scores")) + len(_rows(tmp_path / "scores_quarantine"))  # noqa: E731
    out = io.StringIO()
    release = barrier / "release"

    def feed() -> None:
        wait_for(lambda: list(barrier.glob("*.ready")), "micro-batch 0 at its output barrier")
        release.touch()
        wait_for(lambda: "micro-batch 0:" in out.getvalue(), "micro-batch 0's line")
        release.unlink()
        time.sleep(3)  # a quiet stretch: three record intervals without a micro-batch
        _json_lines(incoming, "b.json", _docs(8, 6))
        wait_for(lambda: scored() >= 15, "micro-batch 1's output commit (15 rows in the two tables)")
        _json_lines(incoming, "c.json", _docs(14, 4))  # the next micro-batch's rows, there before the SIGTERM
        _sigterm_self()
        time.sleep(3)  # the run saw it and waits for the micro-batch held at its barrier
        release.touch()

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a SIGTERM outside the run must not end pytest
    feeder = Helper(feed, on_error=lambda: (release.touch(), _sigterm_self()))
    try:
        feeder.start()
        with pytest.raises(RunStopped, match="stopped by SIGTERM after the micro-batch that was running"):
            run_job(config, spark=spark, out=out)
    finally:
        signal.signal(signal.SIGTERM, previous)
        feeder.join()
    assert "micro-batch 1:" in out.getvalue() and "micro-batch 2:" not in out.getvalue(), out.getvalue()
    ids = [f"d{i:05d}" for i in range(14)]
    _each_once(tmp_path, [*ids, None], quarantined={"d00003", None})  # c.json's rows: none
    malformed = [r for r in _rows(tmp_path / "scores_quarantine") if r["status"] == "malformed"]
    assert len(malformed) == 1 and "cut off" in malformed[0]["input_text"]
    runs = read_runs(str(tmp_path / "scores_runs"))
    assert runs[0]["run_id"] == "live" and [r["run_id"] for r in runs[1:]] == \
        [f"live.{n}" for n in range(2, len(runs) + 1)], "one row per interval, each under its own run id"
    assert [r["outcome"] for r in runs][-1] == "stopped" and {r["outcome"] for r in runs[:-1]} <= {"ok"}
    assert [r["rows_in"] for r in runs] == [9, 6], "a row per interval with micro-batches; none for the quiet one"
    assert {r["run_id"] for r in _rows(tmp_path / "scores")} <= {r["run_id"] for r in runs}

    stream = {**config.source.stream.model_dump(), "trigger": "available_now"}
    nightly = run_job(_stream_config(tmp_path, tiny_embed_model, stream, run={"run_id": "after"},
                                     source={"format": "json", "path": str(incoming), "keep_columns": []}),
                      spark=spark, out=io.StringIO())
    assert (nightly.rows_in, nightly.rows_out) == (4, 4), "only the file the stopped run did not commit"
    _each_once(tmp_path, [*ids, None, *[f"d{i:05d}" for i in range(14, 18)]], quarantined={"d00003", None})


@pytest.mark.drills  # a processing-time stream
def test_a_source_schema_change_stops_the_stream_naming_it_and_a_restart_reads_on(spark, tmp_path, tiny_embed_model,
                                                                                   writer):
    write_delta(tmp_path / "docs", _docs(0, 6))
    config = _stream_config(tmp_path, tiny_embed_model, {"trigger": "processing_time", "interval_s": 1},
                            run={"run_id": "live"})

    def change() -> None:
        wait_for(lambda: len(_rows(tmp_path / "scores")) >= 6, "the first micro-batch's 6 rows in the output")
        write_delta(tmp_path / "docs", _docs(6, 3).append_column("lang", pa.array(["en"] * 3)), mode="append",
                    schema_mode="merge")

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # the helper's SIGTERM, if it fails, stops the run
    changer = Helper(change, on_error=_sigterm_self)
    try:
        changer.start()
        with pytest.raises(SourceError, match=r"schema of the stream's source .*docs changed") as failed:
            run_job(config, spark=spark, out=io.StringIO())
    finally:
        signal.signal(signal.SIGTERM, previous)
        changer.join()
    if writer == "deltalake":  # the jar-free reader names the change itself; the connector's words are Delta's
        assert "column lang added (string)" in str(failed.value)
    assert "run the same command again" in str(failed.value)
    assert read_runs(str(tmp_path / "scores_runs"))[-1]["outcome"] == "failed"

    again = config.source.model_copy(update={"stream": config.source.stream.model_copy(
        update={"trigger": "available_now"})})
    rerun = run_job(job_config(tmp_path, tiny_embed_model, source=again.model_dump(), run={"run_id": "after"}),
                    spark=spark, out=io.StringIO())
    assert rerun.rows_in == 3 and rerun.complete
    assert sorted(r["doc_id"] for r in read_scores(tmp_path).to_pylist()) == [f"d{i:05d}" for i in range(9)]


@pytest.mark.slow  # three runs of 240 to 480 rows on a tiny encoder
def test_a_micro_batch_that_moved_is_refused_before_its_commit_and_accept_drift_publishes_it(spark, tmp_path,
                                                                                            tiny_embed_model):
    """The drift gate runs on each micro-batch: with on_drift refuse, the second night arrives in two appends, the
    first like the first night (committed) and the second with a third of its texts empty; that micro-batch stops
    the stream with nothing of it committed, and the runs-table row is refused with what moved and what the run
    committed before it; the same job with --accept-drift reads that micro-batch again and publishes it."""
    nights = [make_corpus(240, seed=1), make_corpus(240, seed=2, start=240),
              make_corpus(240, seed=3, start=480, empty_share=1 / 3)]
    ids = [i for night in nights for i in night["doc_id"].to_pylist()]
    write_delta(tmp_path / "docs", nights[0])

    def night(run_id: str, **run):
        return _stream_config(tmp_path, tiny_embed_model, {"starting_version": 0, "max_files_per_trigger": 1},
                              run={"run_id": run_id, "quality": {"on_drift": "refuse"}, **run})

    first = run_job(night("n1"), spark=spark, out=io.StringIO())
    assert first.rows_out == 240 and first.quality["drift"]["action"] == "passed", first.quality
    write_delta(tmp_path / "docs", nights[1], mode="append")
    write_delta(tmp_path / "docs", nights[2], mode="append")
    with pytest.raises(DriftRefused, match="status: PSI"):
        run_job(night("n2"), spark=spark, out=io.StringIO())
    _each_once(tmp_path, ids[:480], quarantined=set())
    refused = {r["run_id"]: r for r in read_runs(str(tmp_path / "scores_runs"))}["n2"]
    assert refused["outcome"] == "refused" and json.loads(refused["drift"])["action"] == "refused"
    # the record holds the micro-batch committed before the refused one, and its profile
    assert (refused["rows_in"], refused["rows_out"]) == (240, 240), refused
    assert json.loads(refused["summary_json"])["stream"]["batch_ids"] == [1, 1]
    assert sum(json.loads(refused["profile"])["cat"]["status"].values()) == 240, refused["profile"]

    accepted = run_job(night("n3", accept_drift=True), spark=spark, out=io.StringIO())
    assert accepted.stream["batch_ids"] == [2, 2] and accepted.rows_in == 240
    assert accepted.quality["drift"]["action"] == "accepted"
    _each_once(tmp_path, ids, quarantined=set())
