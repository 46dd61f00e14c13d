"""Batch mode of the endpoint backend against a real batch API: files in, batches, files out, on both writers.

The server (``tests/support/batch_server.py``) is the endpoint tests' OpenAI-compatible server on a tiny
random Llama and BERT, with OpenAI's ``/v1/files`` and ``/v1/batches`` over it: each batch line is answered
by the live routes' own code, batches go validating -> in_progress -> finalizing -> completed unless a
test scripts them to expire, fail or stay in progress, and the server logs every upload, every batch
created (with the request keys it held) and every line it ran. "Nothing submitted twice" and "nothing
paid twice" are read from that log, at the server.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from tests.support.batch_server import BatchScript, BatchServer
from tests.support.data import build_tiny_bert, current_writer, read_delta, write_delta
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA, save_model_folder

KEY = "sk-test-batch-0123456789abcdef"
REVIEWS = ["the film is funny", "a dull mess", "smart and moving", "the story drags", "superb acting",
           "der Film ist langweilig", "a big heart", "one of the best movies of the year", "never finds its footing",
           "uneven comedy", "charming ride", "too long by half"]
EXTRACT = {"template": "Review: {text}", "output_schema": EXTRACT_SHORT_SCHEMA, "schema_in_prompt": False,
           "max_new_tokens": 48}
FAST = {"poll_s": 0.05, "max_poll_s": 0.2}


def reviews(tag: str, n: int = len(REVIEWS)) -> list[str]:
    """``n`` reviews of this test's own (the server is shared: what it ran for another test is not counted)."""
    return [f"{text} ({tag})" for text in REVIEWS[:n]]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served")
    served = BatchServer(llm_dir=save_model_folder(folder / "llm"), embed_dir=build_tiny_bert(folder / "embed"),
                         api_key=KEY).start()
    yield served
    served.stop()


@pytest.fixture(autouse=True)
def _fresh(server, monkeypatch):
    """Each test starts with no scripted batch, nothing held, and the key in the environment."""
    monkeypatch.setenv("SBI_TEST_ENDPOINT_KEY", KEY)
    server.scripts.clear()
    server.hold.set()
    yield
    server.hold.set()


def raw_job(tmp_path: Path, server, *, kind: str, texts, task=None, run=None, mode: str = "batch",
            out: str = "out", batch=None, key: str = "${SBI_TEST_ENDPOINT_KEY}") -> dict:
    """The job's config as a dict: ``kind`` on the endpoint backend in ``mode``, its source the ``texts``."""
    ids = [f"r{i:02d}" for i in range(len(texts))]
    if not (tmp_path / "reviews").exists():
        write_delta(tmp_path / "reviews", pa.table({"doc_id": ids, "text": pa.array(texts, pa.string())}))
    model = "tiny-embed" if kind == "embed" else "tiny-llm"
    endpoint = {"base_url": server.url, "model": model, "api_key": key, "mode": mode, "backoff_s": 0.01,
                "max_backoff_s": 0.05, "batch": {**FAST, **(batch or {})}}
    return {
        "job": f"{kind}_batch_test",
        "source": {"format": "delta", "path": str(tmp_path / "reviews"), "id_column": "doc_id"},
        "model": {"name": model},
        "task": {"kind": kind, "backend": "endpoint", "endpoint": endpoint, **(task or {})},
        "sink": {"path": str(tmp_path / out), "mode": "overwrite_partition", "writer": current_writer()},
        "run": {"progress": False, "ds": "2026-11-30", "max_error_fraction": 0.5, **(run or {})},
    }


def job(tmp_path: Path, server, **settings):
    from pipeline.config import build_config

    return build_config(raw_job(tmp_path, server, **settings))


def by_id(path: Path) -> dict[str, dict]:
    rows = read_delta(path).to_pylist()
    found = {r["doc_id"]: r for r in rows}
    assert len(found) == len(rows), "an id written twice"
    return found


def every_id_once(tmp_path: Path, n: int, out: str = "out") -> tuple[dict[str, dict], dict[str, dict]]:
    """The output's and the quarantine's rows by id: each input id in exactly one of them, once."""
    written = read_delta(tmp_path / out).to_pylist()
    quarantine_path = tmp_path / f"{out}_quarantine"
    quarantined = read_delta(quarantine_path).to_pylist() if quarantine_path.exists() else []
    assert sorted(r["doc_id"] for r in written + quarantined) == [f"r{i:02d}" for i in range(n)]
    return {r["doc_id"]: r for r in written}, {r["doc_id"]: r for r in quarantined}


# -- equal rows, failed lines, expiry, --submit-only, the budget: both writers ---------------------------------

def test_batch_mode_rows_equal_live_mode_rows_at_temperature_0(spark, tmp_path, server, writer):
    """The same extract job live and through the batch API on one server: every row the same (text, typed fields,
    usage, status); each request created in one batch and run once there; the staging folder gone after."""
    from pipeline.runner import run_job

    texts = reviews(f"equal {writer}")
    run_job(job(tmp_path, server, kind="extract", texts=texts, task=EXTRACT, mode="live", out="live"), spark=spark,
            out=io.StringIO())
    printed = io.StringIO()
    summary = run_job(job(tmp_path, server, kind="extract", texts=texts, task=EXTRACT), spark=spark, out=printed)
    live, batch = by_id(tmp_path / "live"), by_id(tmp_path / "out")
    assert sorted(batch) == sorted(live) == [f"r{i:02d}" for i in range(len(REVIEWS))]
    fields = ("status", "completion", "fields", "prompt_tokens", "completion_tokens", "finish_reason", "error")
    assert {k: {f: batch[k][f] for f in fields} for k in batch} == {k: {f: live[k][f] for f in fields} for k in live}
    assert sum(r["status"] == "ok" for r in batch.values()) >= len(REVIEWS) - 1
    created = server.creates()[-1]  # this test's requests are its own (reviews(...)): none ran for another
    assert len(created["keys"]) == len(REVIEWS) and all(server.executed[k] == 1 for k in created["keys"])
    assert summary.complete and summary.batch_api["states"] == {"completed": 1}
    paid = summary.prompt_tokens + summary.completion_tokens
    assert summary.tokens == summary.batch_api["tokens"] == summary.endpoint["tokens_paid"] == paid > 0
    assert "batch API               : 1 batch(es) (completed x1)" in printed.getvalue()
    assert not (tmp_path / "out_staging").exists()  # the batch journal went with the run's staging


def test_failed_lines_are_quarantined_exactly_with_the_providers_error(spark, tmp_path, server, writer):
    """Lines the provider answered with an error (HTTP 400 in the error file) quarantine exactly their rows, with
    its message; they are not submitted again (the request's fault), and every other row is written once."""
    from pipeline.runner import run_job
    from pipeline.records.runs import read_runs

    texts = [*reviews(f"failed lines {writer}", 6), "<<refuse>> this one", *reviews(f"more failed lines {writer}", 3),
             "<<refuse>> and this", ""]
    since = server.mark()
    summary = run_job(job(tmp_path, server, kind="generate", texts=texts,
                          task={"template": "Summarise: {text}", "max_new_tokens": 8}), spark=spark, out=io.StringIO())
    written, quarantined = every_id_once(tmp_path, len(texts))
    assert sorted(quarantined) == ["r06", "r10"]
    assert all(r["error"] == "endpoint: batch API: HTTP 400: the server refuses this prompt (test marker)"
               for r in quarantined.values())
    assert written["r11"]["status"] == "skipped_empty" and not server.executed.get("r11")
    assert all(r["status"] == "ok" and r["completion_tokens"] > 0 for k, r in written.items() if k != "r11")
    assert set(server.created_keys(since).values()) == {1} and len(server.creates(since)) == 1  # none again
    assert (summary.rows_quarantined, summary.batch_api["failed"], summary.batch_api["resubmitted"]) == (2, 2, 0)
    row = read_runs(str(tmp_path / "out_runs"))[-1]
    assert row["outcome"] == "ok" and json.loads(row["batch_api"])["states"] == {"completed": 1}


def test_an_expired_batch_resubmits_only_the_unanswered_rows(spark, tmp_path, server, writer):
    """A batch that expires after answering 5 of its 12 lines: the next batch holds exactly the 7 unanswered
    requests; each request ran once at the server, and every row is written once."""
    from pipeline.runner import run_job

    server.scripts[:] = [BatchScript("expired", answer_first=5)]
    summary = run_job(job(tmp_path, server, kind="generate", texts=reviews(f"expired {writer}"),
                          task={"template": "Summarise: {text}", "max_new_tokens": 8}), spark=spark, out=io.StringIO())
    first, second = server.creates()[-2:]
    assert first["outcome"] == "expired" and second["outcome"] == "completed"
    assert sorted(second["keys"]) == sorted(first["keys"][5:])  # the unanswered ones, and only those
    assert all(server.executed[k] == 1 for k in first["keys"])
    written, quarantined = every_id_once(tmp_path, len(REVIEWS))
    assert not quarantined and all(r["status"] == "ok" for r in written.values())
    assert summary.batch_api["states"] == {"completed": 1, "expired": 1}
    assert (summary.batch_api["requests"], summary.batch_api["resubmitted"]) == (12, 7)


def test_submit_only_then_a_second_run_commits_every_row_once(spark, tmp_path, server, writer):
    """``--submit-only`` submits and ends (nothing committed, runs-table outcome ``submitted``); the same job and
    run id later collects the batch it submitted (created once) and commits every row once."""
    from pipeline.io.sources import is_delta_table
    from pipeline.runner import run_job
    from pipeline.records.runs import read_runs

    server.hold.clear()  # the night: the batch is still running when the submitting run ends
    settings = dict(kind="embed", texts=[*reviews(f"submit only {writer}", 8), None, "good movie"])
    since = server.mark()
    night = run_job(job(tmp_path, server, **settings, run={"run_id": "nightly-1", "submit_only": True}), spark=spark,
                    out=io.StringIO())
    assert not night.complete and night.rows_out == 0 and night.batch_api["pending"] == 1
    assert not is_delta_table(spark, str(tmp_path / "out")) and len(server.creates(since)) == 1
    assert read_runs(str(tmp_path / "out_runs"))[-1]["outcome"] == "submitted"
    server.hold.set()  # the morning
    morning = run_job(job(tmp_path, server, **settings, run={"run_id": "nightly-1"}), spark=spark, out=io.StringIO())
    assert morning.complete and len(server.creates(since)) == 1 and set(server.created_keys(since).values()) == {1}
    written, quarantined = every_id_once(tmp_path, 10)
    assert not quarantined and written["r08"]["status"] == "skipped_null"
    assert all(len(written[k]["embedding"]) == 32 and written[k]["n_tokens"] > 0 for k in written if k != "r08")
    rows = read_runs(str(tmp_path / "out_runs"))
    assert [r["outcome"] for r in rows] == ["ok"]  # the same run id: the morning's row replaced the night's
    assert json.loads(rows[-1]["batch_api"])["submitted_by_this_try"] == 0


def test_a_submission_that_would_pass_the_token_budget_is_refused(spark, tmp_path, server):
    """``run.max_tokens`` below the request file's estimate: nothing is created, the run is ``stopped``; the rerun
    without the budget submits the file once and commits."""
    from pipeline.errors import TokenBudgetReached
    from pipeline.runner import run_job
    from pipeline.records.runs import read_runs

    settings = dict(kind="generate", texts=reviews("budget"), task={"template": "Summarise: {text}",
                                                                     "max_new_tokens": 8})
    since = server.mark()
    with pytest.raises(TokenBudgetReached, match="run.max_tokens 100 would be passed: batch-00000 "):
        run_job(job(tmp_path, server, **settings, run={"max_tokens": 100}), spark=spark, out=io.StringIO())
    assert not server.uploads(since) and not server.creates(since)  # refused before anything went out
    assert read_runs(str(tmp_path / "out_runs"))[-1]["outcome"] == "stopped"
    summary = run_job(job(tmp_path, server, **settings), spark=spark, out=io.StringIO())
    assert summary.complete and len(server.creates(since)) == 1
    every_id_once(tmp_path, len(REVIEWS))


def test_a_failed_batch_is_submitted_again_and_its_rows_end_once(spark, tmp_path, server):
    """A batch that fails validation as a whole: its requests go again in a new batch (batch.resubmits), which
    completes; once they keep failing past the resubmits, the rows are quarantined with the batch's error."""
    from pipeline.runner import run_job

    server.scripts[:] = [BatchScript("failed")]
    settings = dict(kind="generate", texts=reviews("failed batch", 4),
                    task={"template": "Summarise: {text}", "max_new_tokens": 8})
    summary = run_job(job(tmp_path, server, **settings), spark=spark, out=io.StringIO())
    assert summary.complete and summary.batch_api["states"] == {"completed": 1, "failed": 1}
    assert all(r["status"] == "ok" for r in every_id_once(tmp_path, 4)[0].values())

    server.scripts[:] = [BatchScript("failed")] * 2
    other = tmp_path / "again"
    summary = run_job(job(other, server, **settings, batch={"resubmits": 1}, run={"max_error_fraction": 1.0}),
                      spark=spark, out=io.StringIO())
    written, quarantined = every_id_once(other, 4)
    assert not written and len(quarantined) == 4
    assert all("batch failed: injected: the input file failed validation" in r["error"] for r in quarantined.values())
    assert summary.batch_api["states"] == {"failed": 2}


# -- the batch API client: a create whose answer was lost -----------------------------------------------------

def test_a_create_whose_answer_was_lost_is_found_by_its_metadata_not_created_again(tmp_path, server):
    """The create reaches the provider and its answer is cut off on the way back (a fault proxy), and a journaled
    ``creating`` with no batch id (a driver killed between the create and its journal line): both find the batch
    by its metadata in the listing, and the provider holds one batch of the file."""
    from pipeline.endpoint import EndpointConfig
    from pipeline.endpoint.batches import BatchApi
    from pipeline.stages.batch_api import Driver, submit
    from pipeline.journal.batch_log import BatchLog

    from tests.support.openai_server import FaultPlan, FaultProxy

    proxy = FaultProxy(server.url.rsplit("/v1", 1)[0], FaultPlan(every_cut=1, only_if='"input_file_id"')).start()
    try:
        endpoint = EndpointConfig(base_url=proxy.url(), model="tiny-llm", api_key=KEY, backoff_s=0.01)
        log = BatchLog(str(tmp_path / "journal"))
        line = json.dumps({"custom_id": "k1", "method": "POST", "url": "/v1/chat/completions",
                           "body": {"model": "tiny-llm", "messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 4}})
        log.add_file([("k1", line, 10)], round=1)
        driver = Driver(log=log, api=BatchApi(endpoint), endpoint=endpoint, path="/chat/completions", try_id="t1",
                        say=lambda _: None)
        since = server.mark()
        assert submit(driver) == 1 and proxy.injected["cut"] == 1
        batch = log.files()[0]
        assert [c["batch_id"] for c in server.creates(since)] == [batch.batch_id]
        # the driver died after the create went out, before the batch id was journaled: the rerun adopts it
        batch.batch_id, batch.status = None, "written"
        log.save(batch)
        rerun = Driver(log=log, api=BatchApi(endpoint), endpoint=endpoint, path="/chat/completions", try_id="t2",
                       say=lambda _: None)
        assert submit(rerun) == 0 and [c["batch_id"] for c in server.creates(since)] == [log.files()[0].batch_id]
    finally:
        proxy.stop()


# -- a driver killed after the upload, then again while polling: both writers ---------------------------------

@pytest.mark.drills  # SIGKILL, twice
@pytest.mark.timeout(1500)  # two drivers in JVMs of their own, then the run that commits
def test_a_driver_killed_after_the_upload_and_again_while_polling_submits_nothing_twice(spark, tmp_path, server,
                                                                                         writer):
    """SIGKILL (the driver's whole process tree) once the request file's upload is journaled, before its batch
    is created; the rerun uploads nothing again, creates the batch and is killed while it polls it; the third run
    polls the same batch to its end and commits. The server's log: one upload, one batch, each line run once;
    the tables: every row once."""
    from pipeline.config import JobConfig
    from pipeline.runner import run_job

    from tests.support.drivers import kill_when, start_driver

    texts = [*reviews(f"killed {writer}", 10), "<<refuse>> the killed run's bad row"]
    raw = raw_job(tmp_path, server, kind="generate", texts=texts, key=KEY,
                  task={"template": "Summarise: {text}", "max_new_tokens": 8},
                  run={"summary_path": str(tmp_path / "summary.json")})
    config_file = tmp_path / "job.json"
    config_file.write_text(json.dumps(raw))
    since, barrier = server.mark(), tmp_path / "barrier"
    server.hold.clear()  # a batch, once created, stays in progress until the test lets it end

    uploading = start_driver(config_file, tmp_path / "first.log",
                             {"batch_barrier": {"dir": str(barrier), "at": "uploaded", "parties": 2, "timeout_s": 900}})
    kill_when(uploading, lambda: (barrier / "uploaded.ready").exists(), tmp_path / "first.log", timeout_s=600)
    assert len(server.uploads(since)) == 1 and not server.creates(since)
    journal = next((tmp_path / "out_staging").glob("*/batch-00000.json"))
    state = json.loads(journal.read_text())
    assert state["file_id"] == server.uploads(since)[0]["file_id"] and state["batch_id"] is None

    polling = start_driver(config_file, tmp_path / "second.log")
    kill_when(polling, lambda: bool(server.creates(since)) and server.polls[server.creates(since)[0]["batch_id"]] >= 2,
              tmp_path / "second.log", timeout_s=600)
    created = server.creates(since)
    assert len(created) == 1 and created[0]["file_id"] == state["file_id"]  # the journaled upload, not a new one
    assert len(server.uploads(since)) == 1 and server.batches[created[0]["batch_id"]]["status"] == "in_progress"

    server.hold.set()
    summary = run_job(JobConfig.model_validate_json(config_file.read_text()), spark=spark, out=io.StringIO())
    assert summary.complete and summary.batch_api["submitted_by_this_try"] == 0
    assert len(server.creates(since)) == 1 and len(server.uploads(since)) == 1
    assert Counter(server.executed[k] for k in created[0]["keys"]) == Counter({1: len(texts)})
    written, quarantined = every_id_once(tmp_path, len(texts))
    assert sorted(quarantined) == ["r10"] and all(r["status"] == "ok" for r in written.values())


def test_a_runs_batch_journal_goes_with_its_staging_and_a_file_dropped_in_it_stays(tmp_path):
    """The batch journal (request files, their states, the provider's result files, the answers, the try's
    ledger entry) is the run's own: removed with the run's staging after its commit, except a file someone
    put in it, which stays, named, with the proofs that the folders around it are ours."""
    from pipeline.journal.batch_log import BatchLog, batch_plan
    from pipeline.journal.layout import OWNER_FILE
    from pipeline.journal.plans import open_plan
    from pipeline.journal.request_log import record_batch_usage
    from pipeline.journal.sweep import remove_run, sweep_staging
    from pipeline.stages.batch_api import Verdicts, write_answers

    root = tmp_path / "stage"
    plan = batch_plan(run_key="sbi-k", source_version=None, task_fingerprint="fp", job="j", ds="2026-11-30")
    folder = Path(open_plan(str(root), plan))
    log = BatchLog(str(folder))
    line = json.dumps({"custom_id": "k1", "method": "POST", "url": "/v1/embeddings", "body": {"input": ["a"]}})
    batch = log.add_file([("k1", line, 5)], round=1)
    batch.collected = True
    log.save(batch)
    answer = {"custom_id": "k1", "response": {"status_code": 200, "body": {"data": [{"embedding": [1.0]}]}}}
    log.save_results(batch, output=(json.dumps(answer) + "\n").encode(), errors=b"")
    write_answers(log, Verdicts(answered={"k1": 0}))
    record_batch_usage(str(folder), "0123456789abcdef", 3)
    assert sweep_staging(str(root), max_age_s=1e9).left_alone == []
    (folder / "answers" / "notes.txt").write_text("mine")
    assert remove_run(str(root), "sbi-k") == [f"{folder.name}/answers/notes.txt"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == sorted([
        OWNER_FILE, f"{folder.name}/answers/notes.txt", f"{folder.name}/plan.json"])
    (folder / "answers" / "notes.txt").unlink()
    assert remove_run(str(root), "sbi-k") == [] and not root.exists()


def test_a_run_past_max_wait_ends_submitted_a_sigterm_stops_the_wait_and_the_next_run_collects(spark, tmp_path,
                                                                                              server):
    """``batch.max_wait_s`` passed with the batch still running: the run ends like ``--submit-only`` (outcome
    ``submitted``); the rerun, SIGTERMed while it polls, stops (``stopped``), naming the batches left running;
    the third run collects the one batch and commits."""
    import os
    import signal
    import threading
    import time

    from pipeline.errors import RunStopped
    from pipeline.runner import run_job
    from pipeline.records.runs import read_runs

    settings = dict(kind="generate", texts=reviews("waits", 5), task={"template": "Summarise: {text}",
                                                                   "max_new_tokens": 8})
    since = server.mark()
    server.hold.clear()
    waited = run_job(job(tmp_path, server, **settings, batch={"max_wait_s": 0.5}), spark=spark, out=io.StringIO())
    assert waited.batch_api["pending"] == 1 and "still running after" in waited.batch_api["pending_reason"]
    assert read_runs(str(tmp_path / "out_runs"))[-1]["outcome"] == "submitted"
    batch_id = server.creates(since)[0]["batch_id"]
    polls = server.polls[batch_id]

    def stop() -> None:
        deadline = time.monotonic() + 300
        while server.polls[batch_id] < polls + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a SIGTERM outside the run must not end pytest
    stopper = threading.Thread(target=stop, daemon=True)
    try:
        stopper.start()
        with pytest.raises(RunStopped, match="the batches submitted so far stay at the provider"):
            run_job(job(tmp_path, server, **settings, batch={"poll_s": 0.5, "max_poll_s": 30}), spark=spark,
                    out=io.StringIO())
    finally:
        signal.signal(signal.SIGTERM, previous)
    stopper.join(timeout=5)
    assert read_runs(str(tmp_path / "out_runs"))[-1]["outcome"] == "stopped"
    server.hold.set()
    summary = run_job(job(tmp_path, server, **settings), spark=spark, out=io.StringIO())
    assert summary.complete and [c["batch_id"] for c in server.creates(since)] == [batch_id]
    assert all(r["status"] == "ok" for r in every_id_once(tmp_path, 5)[0].values())


def test_mode_changes_the_run_key_not_the_fingerprint_and_batch_settings_change_neither(tmp_path, server):
    """A run switched to the other mode is another logical run (its own staging and journal), and its rows the
    same output for incremental runs; the batch API's limits and waits may change between tries of one run."""
    from pipeline.config import build_config
    from pipeline.config.fingerprint import task_fingerprint
    from pipeline.config.identity import run_identity

    def ident(**settings):
        config = build_config(raw_job(tmp_path, server, kind="generate", texts=["a"], **settings))
        return (run_identity(config, model_revision="r", source_snapshot="s", try_id="t").run_key,
                task_fingerprint(config, revision="r"))

    batch, live = ident(), ident(mode="live")
    assert batch[0] != live[0] and batch[1] == live[1]
    assert ident(batch={"max_requests_per_file": 10, "max_wait_s": 60, "resubmits": 0}) == batch
    assert ident(run={"submit_only": True}) == batch
