"""A streaming job's driver killed (SIGKILL of its whole process tree) at each point of a micro-batch's commits (inside
the quarantine's, inside the output's, after the output's), and restarted from its checkpoint: each id lands once, by
key, and the poison row once in the quarantine.

The drivers are real processes (``tests/support/commit_job.py`` on one config file); Spark replays the micro-batch
a kill interrupted with the same batch id and rows, and both writers skip a commit whose transaction
(``sbi-<job>-stream-<query id>``, batch id) the table already holds.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline.config import JobConfig
from pipeline.io.delta.history import commit_metadata, consistent_history
from pipeline.runner import run_job
from pipeline.records.runs import read_runs

from tests.support.data import make_documents, write_delta
from tests.support.drivers import kill_when, start_driver
from tests.support.jobs import job_config

# each drill holds the driver where the test kills it (a wait far longer than the kill takes to come), one point after
# the other on one checkpoint: inside the quarantine commit (the deltalake writer: its files written, the commit not
# made; the connector: right before its save), so nothing of the micro-batch is committed; inside the output commit,
# after the quarantine's landed; and after the output commit landed, before Spark's checkpoint records the
# micro-batch done, so the restart replays a micro-batch both tables already hold.
# (where, the fault that holds the driver there, whether the quarantine's commit landed, whether the output's did)
DRILLS = [
    ("inside the quarantine commit", "quarantine_commit_barrier", False, False),
    ("inside the output commit, after the quarantine's", "commit_barrier", True, False),
    ("after the output commit landed, before the checkpoint records it", "output_barrier", True, True),
]


def _ids(table: Path) -> list[str]:
    return sorted(pa.table(DeltaTable(str(table)).to_pyarrow_table())["doc_id"].to_pylist())


@pytest.mark.drills  # drivers killed
@pytest.mark.timeout(1500)  # three drivers in JVMs of their own, each killed within 300 s, then the restart
def test_a_stream_killed_at_each_point_of_its_commits_writes_each_id_once_after_the_restart(
        spark, tmp_path, tiny_embed_model, writer):
    docs = make_documents(20, with_bad_rows=False)
    texts = docs["text"].to_pylist()
    texts[5] = "a POISON review that fails every time"
    docs = docs.set_column(1, "text", pa.array(texts, pa.string()))
    write_delta(tmp_path / "docs", docs.slice(0, 12))  # micro-batch 0: 12 rows, d00005 fails
    write_delta(tmp_path / "docs", docs.slice(12), mode="append")  # micro-batch 1: 8 rows
    config = job_config(tmp_path, tiny_embed_model,
                        source={"stream": {"checkpoint_path": str(tmp_path / "checkpoint"), "starting_version": 0,
                                           "max_files_per_trigger": 1}},
                        run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.2})
    config_file = tmp_path / "job.json"
    config_file.write_text(config.model_dump_json())
    scores, quarantine = tmp_path / "scores", tmp_path / "scores_quarantine"

    for n, (where, drill, quarantined, landed) in enumerate(DRILLS):
        barrier = tmp_path / f"barrier-{n}"
        log = tmp_path / f"driver-{n}.log"
        driver = start_driver(config_file, log, {drill: {"dir": str(barrier), "parties": 9, "timeout_s": 600}})
        kill_when(driver, lambda: bool(list(barrier.glob("*.ready"))), log, timeout_s=300)
        assert (quarantine / "_delta_log").exists() == quarantined, f"killed {where}: quarantine landed: {quarantined}"
        if quarantined:
            assert _ids(quarantine) == ["d00005"], f"killed {where}: the poison row once in the quarantine"
        assert (scores / "_delta_log").exists() == landed, f"killed {where}: the output commit landed: {landed}"
        assert "micro-batch 0:" not in log.read_text(), "the killed driver never finished micro-batch 0"
    assert _ids(scores) == [f"d{i:05d}" for i in range(12) if i != 5]

    out = io.StringIO()
    summary = run_job(JobConfig.model_validate_json(config_file.read_text()), spark=spark, out=out)
    assert summary.stream["replayed"] == [0] and summary.stream["batch_ids"] == [0, 1], out.getvalue()
    assert "micro-batch 0: committed by an earlier try" in out.getvalue()
    assert (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (8, 8, 0), "this run wrote batch 1 only"
    assert _ids(scores) == [f"d{i:05d}" for i in range(20) if i != 5], "each id once in the output"
    assert _ids(quarantine) == ["d00005"], "the poison row once in the quarantine"
    # one commit per micro-batch in each table, under the stream's transaction
    runs = [commit_metadata(e).get("sbi.run_id") for e in consistent_history(str(scores))]
    assert len(runs) == 2 and runs[0] == summary.run_id, runs
    assert len(consistent_history(str(quarantine))) == 1
    assert DeltaTable(str(scores)).transaction_version(_app_id(scores)) == 1
    outcomes = [r["outcome"] for r in read_runs(str(tmp_path / "scores_runs"))]
    assert outcomes == ["started"] * len(DRILLS) + ["ok"], "the killed drivers' rows stay started"


def _app_id(table: Path) -> str:
    (app_id,) = {commit_metadata(e)["sbi.app_id"] for e in consistent_history(str(table))}
    assert app_id.startswith("sbi-score_test-stream-")
    return app_id
