"""Overwrites of one day that race: the day ends holding exactly one writer's rows, each id once; every other
writer fails with a conflict that names the winner, and nothing else in the table changes.

The writes meet at a barrier right before their commits (``commit_barrier``: the deltalake writer after it
read the table, the connector right before its ``save``), so they really overlap.
"""

from __future__ import annotations

import io

import pytest

from pipeline.errors import SinkError
from pipeline.io.delta.sink import write_sink

from tests.support.data import make_documents, sink_config, write_delta
from tests.support.drivers import at_once
from tests.support.drills import D0, D1, SIZES, ids_frame, overwrite_race, table_rows
from tests.support.jobs import job_config

pytestmark = pytest.mark.drills  # races: writers at a barrier (make test-drills)

@pytest.mark.parametrize(("day", "names"), [("new day", ("a", "b")), ("new day", ("a", "b", "c")),
                                           ("existing day", ("a", "b"))], ids=["new-two", "new-three", "existing-two"])
def test_overwrites_of_one_day_at_once_leave_one_writers_rows(spark, tmp_path, writer, day, names):
    path, barrier = tmp_path / "t", tmp_path / "barrier"
    sink = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    write_sink(ids_frame(spark, range(5), D0, writer="other day"), sink, partition_values={"ds": D0})
    if day == "existing day":
        write_sink(ids_frame(spark, range(100, 107), D1, writer="seed"), sink, partition_values={"ds": D1})
    outcomes = overwrite_race(spark, path, sink, names, barrier)
    assert len(list(barrier.glob("*.ready"))) == len(names), "every write reached its commit before any landed"
    won = [n for n, o in outcomes.items() if not isinstance(o, SinkError)]
    assert len(won) == 1, outcomes
    winner = won[0]
    for name, outcome in outcomes.items():
        if name != winner:
            text = str(outcome)
            assert "conflict" in text and "committed nothing" in text, text
            assert f"run run-{winner}" in text, f"the conflict names the winner: {text}"
    rows = table_rows(spark, path)
    day_rows = [r for r in rows if r["ds"] == D1]
    assert {r["writer"] for r in day_rows} == {winner}, "one writer's rows, never two side by side"
    assert sorted(r["id"] for r in day_rows) == list(range(100, 100 + SIZES[winner])), "each id once"
    assert sorted((r["id"], r["writer"]) for r in rows if r["ds"] == D0) == [(i, "other day") for i in range(5)], \
        "the other day is untouched"


def test_two_runs_overwriting_a_new_day_at_once_one_stands_the_other_says_who(spark, tmp_path, tiny_embed_model,
                                                                            writer):
    """The nightly run and a backfill of the same new day (with a smaller batch: another logical run): one run's
    rows stand; the other fails naming it, its runs-table row says `failed` with the conflict, and its staged
    tasks stay for a rerun."""
    from pipeline.records.runs import read_runs
    from pipeline.journal.plans import staged_tasks

    write_delta(tmp_path / "docs", make_documents(40))
    other = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                       run={"run_id": "earlier", "ds": D0.isoformat()})
    from pipeline.runner import run_job

    assert run_job(other, spark=spark, out=io.StringIO()).complete
    barrier = {"dir": str(tmp_path / "barrier"), "parties": 2, "timeout_s": 180}

    def night(run_id):
        config = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                            batching={"batch_size": 16 if run_id == "nightly" else 8},
                            run={"run_id": run_id, "ds": D1.isoformat(), "faults": {"commit_barrier": barrier}})
        return run_job(config, spark=spark, out=io.StringIO())

    outcomes = at_once({name: (lambda name=name: night(name)) for name in ("nightly", "backfill")},
                       expected=(SinkError,), timeout_s=600)
    lost = {n: o for n, o in outcomes.items() if isinstance(o, SinkError)}
    assert len(lost) == 1, outcomes
    (loser, error), = lost.items()
    winner = ({"nightly", "backfill"} - {loser}).pop()
    assert outcomes[winner].complete and outcomes[winner].rows_out == 40
    assert f"run {winner}" in str(error), str(error)
    rows = table_rows(spark, tmp_path / "scores")
    day = [r for r in rows if r["ds"] == D1]
    assert len(day) == 40 and len({r["doc_id"] for r in day}) == 40 and {r["run_id"] for r in day} == {winner}
    assert len([r for r in rows if r["ds"] == D0]) == 40, "the other day is untouched"
    runs = {r["run_id"]: r for r in read_runs(str(tmp_path / "scores_runs"))}
    assert runs[winner]["outcome"] == "ok" and runs[loser]["outcome"] == "failed"
    assert f"run {winner}" in runs[loser]["error_message"], runs[loser]["error_message"]
    plans = [p for p in (tmp_path / "scores_staging").iterdir() if p.is_dir()]
    assert len(plans) == 1 and staged_tasks(str(plans[0])), "the loser's staged tasks stay for its rerun"
    staged = len(staged_tasks(str(plans[0])))

    rerun = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                       batching={"batch_size": 16 if loser == "nightly" else 8},
                       run={"run_id": f"{loser}-again", "ds": D1.isoformat()})
    again = run_job(rerun, spark=spark, out=io.StringIO())
    assert again.complete and again.resumed_tasks == staged, "the rerun reuses the loser's staged tasks"
    day = [r for r in table_rows(spark, tmp_path / "scores") if r["ds"] == D1]
    assert len(day) == 40 and {r["run_id"] for r in day} == {f"{loser}-again"}, "the rerun replaces the day"
