"""Resuming a killed run: finished inference tasks are staged, a rerun of the same run reuses them and
commits once; each id lands in the output once, and nothing staged outlives the commit.

The drivers killed here are real processes (``tests/support/commit_job.py``, SIGKILL of their process group from
outside, JVM and Python workers included); their reruns run the same config file.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipeline.errors import InjectedFaultError
from pipeline.runner import run_job
from pipeline.journal.plans import staged_tasks

from tests.support.data import make_documents, write_delta
from tests.support.drivers import kill_when, start_driver
from tests.support.jobs import job_config, read_scores

TASKS = 4


def _config(tmp_path: Path, model: Path, **sections):
    """20 rows in 4 inference tasks, the summary as JSON beside the tables."""
    run = {"summary_path": str(tmp_path / "summary.json"), **sections.pop("run", {})}
    source = {"repartition": TASKS, **sections.pop("source", {})}
    return job_config(tmp_path, model, run=run, source=source, **sections)


def _plan_folders(tmp_path: Path) -> list[Path]:
    root = tmp_path / "scores_staging"
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def _markers(tmp_path: Path) -> int:
    return sum(len(staged_tasks(str(folder))) for folder in _plan_folders(tmp_path))


def _ids_once(tmp_path: Path, rows: int) -> None:
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert len(ids) == rows and len(set(ids)) == rows, "each id once in the output"


def _runs(tmp_path: Path) -> list[tuple[str, str]]:
    """``(run id, outcome)`` of each run in the runs table, oldest first (one row per run id)."""
    from pipeline.records.runs import read_runs

    return [(r["run_id"], r["outcome"]) for r in read_runs(str(tmp_path / "scores_runs"))]


def test_a_staged_task_is_reused_only_for_the_same_input_and_a_half_written_one_never(tmp_path):
    import pyarrow as pa

    from pipeline.journal.plans import StagePlan, open_plan
    from pipeline.journal.tasks import InputDigest, TaskStage

    folder = open_plan(str(tmp_path), StagePlan("sbi-j-1", "delta:1", "fp", rows=3, tasks=1, job="j", ds="d"))
    rows = pa.record_batch({"id": ["a", "b", "c"], "content_hash": ["1", "2", "3"]})
    digest = InputDigest()
    digest.update(rows)
    killed = TaskStage(folder, 0)
    killed.add(rows)  # killed before finish(): its rows file stays a temp file, and no marker names it
    assert not killed.has_marker() and TaskStage(folder, 0).reusable(digest.value()) is None
    done = TaskStage(folder, 0)
    done.add(rows)
    done.finish(digest=digest.value(), counts={"status": {"ok": 3}})
    table, counts = TaskStage(folder, 0).reusable(digest.value())
    assert table.num_rows == 3 and counts == {"status": {"ok": 3}}
    other = InputDigest()
    other.update(pa.record_batch({"id": ["a", "b", "d"], "content_hash": ["1", "2", "3"]}))
    assert TaskStage(folder, 0).reusable(other.value()) is None, "other rows dealt to the task: scored again"
    assert TaskStage(str(tmp_path / "elsewhere"), 0).failed, "a folder this host cannot see: no staging, no failure"


@pytest.mark.drills  # the resume drill
def test_a_rerun_replays_the_finished_tasks_and_scores_the_rest(spark, tmp_path, tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(20))
    with pytest.raises(InjectedFaultError):  # every task scored and staged, the driver dies before any commit
        run_job(_config(tmp_path, tiny_embed_model, run={"run_id": "died", "faults": {"fail_before_commit": True}}),
                spark=spark, out=io.StringIO())
    assert not (tmp_path / "scores" / "_delta_log").exists()
    (folder,) = _plan_folders(tmp_path)
    assert staged_tasks(str(folder)) == list(range(TASKS))
    for task in (1, 3):  # as if the driver had died with two tasks still running
        (folder / f"task-{task}.done.json").unlink()
    kept = sum(json.loads((folder / f"task-{t}.done.json").read_text())["rows"] for t in (0, 2))

    out = io.StringIO()
    summary = run_job(_config(tmp_path, tiny_embed_model, run={"run_id": "rerun"}), spark=spark, out=out)
    assert summary.complete and summary.rows_out == 20
    assert (summary.resumed_tasks, summary.rows_reused, summary.rows_scored) == (2, kept, 20 - kept)
    assert summary.status == {"ok": 18, "skipped_null": 1, "skipped_empty": 1}, "reused rows keep their statuses"
    assert sum(summary.rows_per_worker.values()) == 20 - kept, "only the rows scored count as worker rows"
    assert "resuming: 2 of 4 task(s)" in out.getvalue() and "resumed                 : 2 of 4" in out.getvalue()
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert (saved["resumed_tasks"], saved["rows_reused"], saved["rows_scored"]) == (2, kept, 20 - kept)
    _ids_once(tmp_path, 20)
    assert DeltaTable(str(tmp_path / "scores")).version() == 0, "one commit"
    assert not _plan_folders(tmp_path), "the run's staging goes once its commit landed"
    assert _runs(tmp_path) == [("died", "failed"), ("rerun", "ok")]


def test_a_changed_setting_reuses_nothing_and_says_why_and_vacuum_removes_it(spark, tmp_path, tiny_embed_model):
    write_delta(tmp_path / "docs", make_documents(20))
    with pytest.raises(InjectedFaultError):
        run_job(_config(tmp_path, tiny_embed_model, run={"run_id": "died", "faults": {"fail_before_commit": True}}),
                spark=spark, out=io.StringIO())
    (old,) = _plan_folders(tmp_path)
    labels = {"kind": "embed", "labels": {"pos": "good great fun", "neg": "bad awful"}}
    out = io.StringIO()
    summary = run_job(_config(tmp_path, tiny_embed_model, task=labels, run={"run_id": "changed"}),
                      spark=spark, out=out)
    assert summary.complete and summary.resumed_tasks == 0 and summary.rows_scored == 20
    assert summary.resume_note and "4 staged task(s) of an earlier try not reused: the task fingerprint changed" \
        in summary.resume_note, summary.resume_note
    assert "not resumed             : 4 staged task(s)" in out.getvalue()
    assert _plan_folders(tmp_path) == [old], "another key's staging is left to its age, never read"

    from pipeline.cli import main

    assert main(["vacuum", str(tmp_path / "scores"), "--dry-run", "--staging-max-age-hours", "0"]) == 0
    assert _plan_folders(tmp_path) == [old], "a dry run deletes nothing"
    assert main(["vacuum", str(tmp_path / "scores"), "--staging-max-age-hours", "0"]) == 0
    assert not _plan_folders(tmp_path)


# ----------------------------------------------------------------------------- real drivers, killed
SLOW = {"slow_batch_s": 0.4}  # batches of 2 rows: a task of 5 rows takes 1.2 s or more


@pytest.fixture
def killed_setup(tmp_path, tiny_embed_model):
    """A source of 20 rows and one config file, run by every driver of the test."""
    write_delta(tmp_path / "docs", make_documents(20))
    config = _config(tmp_path, tiny_embed_model, batching={"batch_size": 2}, sink={"writer": "deltalake"})
    config_file = tmp_path / "job.json"
    config_file.write_text(config.model_dump_json())
    return config_file


@pytest.mark.drills  # a driver killed
@pytest.mark.timeout(900)  # two drivers in JVMs of their own
def test_a_driver_killed_at_half_resumes_with_the_same_command(tmp_path, killed_setup):
    driver = start_driver(killed_setup, tmp_path / "first.log", SLOW)
    kill_when(driver, lambda: _markers(tmp_path) >= TASKS // 2, tmp_path / "first.log")
    finished = _markers(tmp_path)  # a marker is written last: these tasks finished before the kill
    assert 0 < finished < TASKS and not (tmp_path / "scores" / "_delta_log").exists()

    rerun = start_driver(killed_setup, tmp_path / "rerun.log")
    assert rerun.wait(timeout=600) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["resumed_tasks"] == finished and saved["complete"]
    assert saved["rows_reused"] + saved["rows_scored"] == 20 and saved["rows_scored"] > 0
    _ids_once(tmp_path, 20)
    assert not _plan_folders(tmp_path)
    runs = _runs(tmp_path)  # no run id set: each try has its own, and the killed one stays "started"
    assert [outcome for _, outcome in runs] == ["started", "ok"] and runs[1][0] == saved["run_id"], runs


@pytest.mark.drills  # drivers killed
@pytest.mark.timeout(1200)  # three drivers, two in JVMs of their own
def test_a_driver_killed_twice_the_second_time_in_its_commit_resumes_every_task(spark, tmp_path, killed_setup):
    driver = start_driver(killed_setup, tmp_path / "first.log", SLOW)
    kill_when(driver, lambda: _markers(tmp_path) >= 1, tmp_path / "first.log")
    first = _markers(tmp_path)
    barrier = tmp_path / "barrier"
    committing = start_driver(killed_setup, tmp_path / "second.log",
                              {"commit_barrier": {"dir": str(barrier), "parties": 9, "timeout_s": 15}})
    kill_when(committing, lambda: bool(list(barrier.glob("*.ready"))), tmp_path / "second.log")
    second_log = (tmp_path / "second.log").read_text()
    assert f"resuming: {first} of {TASKS} task(s)" in second_log, second_log[-3000:]
    assert _markers(tmp_path) == TASKS and not (tmp_path / "scores" / "_delta_log").exists()

    from pipeline.config import JobConfig

    config = JobConfig.model_validate_json(killed_setup.read_text())
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete and summary.resumed_tasks == TASKS
    assert (summary.rows_reused, summary.rows_scored) == (20, 0)
    time.sleep(2)  # nothing of the killed drivers survives to commit late
    _ids_once(tmp_path, 20)
    assert DeltaTable(str(tmp_path / "scores")).version() == 0, "committed once"
    assert not _plan_folders(tmp_path)
