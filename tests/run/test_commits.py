"""Commits that are checked, not assumed: idempotent retries, crash leftovers swept, overlapping commits.

Real Spark, real Delta tables read back, real processes killed (``os._exit`` in a Python worker,
SIGKILL of a driver from outside).
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import json
import os
import time
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet  # noqa: F401 - pa.parquet
import pytest
from deltalake import DeltaTable

from pipeline.config import SinkConfig
from pipeline.errors import SinkError
from pipeline.io.delta.history import commit_metadata, consistent_history
from pipeline.io.delta.markers import MARKER_DIR, claim_for_commit, running_marker, write_id_of
from pipeline.io.delta.plan import CommitOptions
from pipeline.io.delta.sink import write_sink
from pipeline.io.delta.sweep import sweep_leftovers
from pipeline.runner import run_job

from tests.support.data import make_documents, sink_config, write_delta
from tests.support.drivers import at_once, kill_when, start_driver
from tests.support.drills import ids_frame, kill_driver_at_its_commit, table_rows, vacuum_now, write_with_a_worker_killed
from tests.support.jobs import job_config, read_scores

D1, D2 = dt.date(2026, 11, 28), dt.date(2026, 11, 29)


def on_disk(path: Path) -> set[str]:
    """Every Parquet data file in the table folder (not the log's checkpoints)."""
    return {p.relative_to(path).as_posix() for p in path.rglob("*.parquet")
            if not p.relative_to(path).parts[0].startswith("_")}


def in_log(path: Path) -> set[str]:
    """Every data file any version of the table adds (the current snapshot and time travel)."""
    files = set()
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if line.strip() and "add" in json.loads(line):
                files.add(unquote(json.loads(line)["add"]["path"]))
    return files


def finished(path: Path) -> set[str]:
    """The data files in the table folder that their task finished writing (a whole Parquet file ends in PAR1)."""
    return {f for f in on_disk(path) if (path / f).read_bytes()[-4:] == b"PAR1"}


def live(path: Path) -> set[str]:
    """The data files of the current snapshot."""
    return {unquote(p) for p in DeltaTable(str(path)).get_add_actions(flatten=True).column("path").to_pylist()}


# ----------------------------------------------------------------------------- idempotent commits
def test_append_with_the_same_run_key_adds_nothing_and_overwrite_records_it(spark, tmp_path, writer):
    path = tmp_path / "t"
    append = sink_config(path=str(path), mode="append", partition_by=["ds"])
    first = write_sink(ids_frame(spark, range(10), D1), append, commit=CommitOptions(txn_app_id="sbi-run-1"))
    retry = write_sink(ids_frame(spark, range(10), D1), append, commit=CommitOptions(txn_app_id="sbi-run-1"))
    assert (first.version, first.already_committed) == (0, False)
    assert (retry.version, retry.already_committed) == (0, True), "the retry points at the commit that landed"
    other = write_sink(ids_frame(spark, range(10, 12), D2), append, commit=CommitOptions(txn_app_id="sbi-run-2"))
    assert other.version == 1 and not other.already_committed
    table = DeltaTable(str(path))
    ids = table.to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == list(range(12)), "no duplicate rows"
    assert table.transaction_version("sbi-run-1") == 0 and table.version() == 1
    assert on_disk(path) == in_log(path), "the retry's own files are deleted"

    # overwrite_partition stays a clean replace (a deliberate rerun replaces), and records the transaction
    replace = sink_config(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    again = write_sink(ids_frame(spark, range(3), D1, writer="y"), replace, partition_values={"ds": D1},
                       commit=CommitOptions(txn_app_id="sbi-run-1"))
    assert again.version == 2 and not again.already_committed
    table = DeltaTable(str(path))
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows if r["ds"] == D1) == [0, 1, 2]
    assert {r["writer"] for r in rows if r["ds"] == D1} == {"y"}


def test_a_retried_run_that_already_committed_is_a_no_op(spark, tmp_path, tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(12))
    first = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "first"}), spark=spark, out=io.StringIO())
    assert first.rows_out == 12 and first.delta_version == 0
    out = io.StringIO()
    # the scheduler retries the run (its driver was killed after the commit landed): new run id, same logical run
    retry = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "retry"}), spark=spark, out=out)
    assert "already committed at version 0 by run first; nothing to do" in out.getvalue()
    assert retry.complete and (retry.rows_in, retry.rows_out, retry.delta_version) == (0, 0, 0)
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert len(ids) == 12 and len(set(ids)) == 12
    assert DeltaTable(str(tmp_path / "scores")).version() == 0
    # another day is another logical run: it appends
    other = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "next", "ds": "2026-11-30"}), spark=spark,
                    out=io.StringIO())
    assert other.rows_out == 12 and read_scores(tmp_path).num_rows == 24


# ----------------------------------------------------------------------------- crash leftovers
@pytest.mark.drills  # a Python worker killed
@pytest.mark.timeout(300)  # one write (and the connector's VACUUM): a minute on a loaded 2-core machine
def test_a_worker_killed_in_the_middle_of_write_is_retried_and_its_file_is_never_live(spark, tmp_path, writer):
    """The deltalake writer's commit deletes the dead attempt's half-written file. The connector leaves it in
    the folder, in no version, until Delta's VACUUM removes it."""
    path = tmp_path / "t"
    result = write_with_a_worker_killed(spark, str(path), writer, f"exit-write-{tmp_path.name}")
    assert result.version == 0
    ids = DeltaTable(str(path)).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == list(range(300))
    assert in_log(path) == live(path)
    if writer == "deltalake":
        assert on_disk(path) == in_log(path)
        return
    dead = on_disk(path) - in_log(path)
    assert len(dead) == 1 and next(iter(dead)).startswith("part-00001-"), (dead, in_log(path))
    vacuum_now(spark, path)
    assert on_disk(path) == in_log(path), "Delta's VACUUM removes the dead attempt's file"


@pytest.mark.drills  # a driver killed
@pytest.mark.timeout(1500)  # two whole jobs, one in its own JVM: minutes on a loaded 2-core machine
def test_a_driver_killed_before_its_commit_leaves_nothing_after_the_rerun(spark, tmp_path, tiny_embed_model, writer):
    """The deltalake writer's driver is killed with its executors' files in the table folder; the connector's
    right before its ``save`` (which writes and commits in one call). Either way nothing is ever committed by
    the killed run, and the same logical run again commits each key once."""
    write_delta(tmp_path / "docs", make_documents(20))
    barrier = tmp_path / "barrier"
    config = job_config(tmp_path, tiny_embed_model, sink={"leftover_grace_s": 1},
                        run={"run_id": "killed", "faults": {"commit_barrier": {"dir": str(barrier), "parties": 9,
                                                                               "timeout_s": 15}}})
    released_at = kill_driver_at_its_commit(config, tmp_path, barrier)
    scores = tmp_path / "scores"
    orphans = on_disk(scores)
    assert not (scores / "_delta_log").exists(), "nothing committed"
    if writer == "deltalake":
        dead = {write_id_of(Path(f).name) for f in orphans}
        assert orphans and len(dead) == 1, "files written"
        assert (scores / MARKER_DIR / f"{next(iter(dead))}.running").exists()

        from pipeline.cli import main

        assert main(["vacuum", str(scores), "--dry-run", "--grace-s", "1"]) == 0
        assert on_disk(scores) == orphans, "a dry run deletes nothing"
    else:
        assert not orphans, "the connector had not begun its write"

    rerun = job_config(tmp_path, tiny_embed_model, sink={"leftover_grace_s": 1}, run={"run_id": "rerun"})
    out = io.StringIO()
    summary = run_job(rerun, spark=spark, out=out)
    assert summary.complete and (summary.rows_in, summary.rows_out) == (20, 20), out.getvalue()
    if writer == "deltalake":
        assert f"swept {len(orphans)} leftover file(s)" in out.getvalue(), out.getvalue()
    while time.time() < released_at + 2:  # whatever survived of the killed job has given up by now
        time.sleep(0.5)
    rows = read_scores(tmp_path)
    ids = rows["doc_id"].to_pylist()
    assert len(ids) == 20 and len(set(ids)) == 20
    assert set(rows["run_id"].to_pylist()) == {"rerun"}, "no row of the killed run"
    table = DeltaTable(str(scores))
    assert table.version() == 0, "the killed job never committed, not even after the kill"
    assert [commit_metadata(e).get("sbi.run_id") for e in consistent_history(str(scores))] == ["rerun"]
    # the log and the table read back agree: the files it adds, their row counts, the rows Spark reads
    assert on_disk(scores) == in_log(scores) == live(scores)
    assert sum(table.get_add_actions(flatten=True).column("num_records").to_pylist()) == 20
    assert sorted(r["doc_id"] for r in table_rows(spark, scores)) == sorted(ids)
    assert not on_disk(scores) & orphans
    if writer == "deltalake":  # the killed write's marker stays as the proof its files were ours (a week), dead
        markers = {p.name for p in (scores / MARKER_DIR).iterdir()}
        killed = {m for m in markers if m.startswith(next(iter(dead)))}
        assert killed and all(m.endswith((".claimed", ".finished")) for m in killed), markers


@pytest.mark.drills  # a driver killed
@pytest.mark.connector
@pytest.mark.timeout(900)  # a job in a JVM of its own, its rerun, and for the MERGE a seed run before
@pytest.mark.parametrize("call", ["save", "merge"])
def test_a_driver_killed_inside_the_connectors_write_commits_nothing_and_the_rerun_writes_each_id_once(
        spark, tmp_path, tiny_embed_model, call):
    """The connector writes and commits in one call: ``save`` into a new table, or the insert-only ``MERGE`` of
    a keyed append into a table that holds 8 of the day's ids. The driver is killed inside that call while
    its write job runs: one task held (``stall_write``), another's whole Parquet file in the table folder.
    Inference ran in a stage before (the scored rows are persisted for the checks), so ``slow_batch_s``
    could not hold the write. Nothing of the killed run is ever committed, its files stay on disk in no
    version, and the same logical run again writes each id once."""
    write_delta(tmp_path / "docs", make_documents(20))
    scores = tmp_path / "scores"
    # 4 write tasks, 2 at a time. A MERGE into a partitioned table shuffles its rows by the partition column
    # before it writes (Delta's merge.repartitionBeforeWrite): the day's rows reach one write task with no
    # Python step of ours in front of it, so the drill could hold the MERGE only before its write stage. Into
    # an unpartitioned table the MERGE's write tasks are the source's, as a save's are.
    sink = {"writer": "delta", **({"partition_by": []} if call == "merge" else {})}
    sections = {"sink": sink, "source": {"repartition": 4}}
    seeded: set[str] = set()
    if call == "merge":
        seed = run_job(job_config(tmp_path, tiny_embed_model, sink=sink,
                                  source={"repartition": 4, "limit": 8}, run={"run_id": "seed"}),
                       spark=spark, out=io.StringIO())
        assert seed.complete and seed.rows_out == 8
        seeded = set(read_scores(tmp_path)["doc_id"].to_pylist())
    before = on_disk(scores)
    stall = {"stall_write": {"partitions": [1], "s": 120}}  # far longer than the kill takes to come
    config = job_config(tmp_path, tiny_embed_model, **sections, run={"run_id": "killed", "faults": stall})
    config_file = tmp_path / "job.json"
    config_file.write_text(config.model_dump_json())
    driver = start_driver(config_file, tmp_path / "driver.log")
    kill_when(driver, lambda: bool(finished(scores) - before), tmp_path / "driver.log")
    killed_at = time.time()
    orphans = on_disk(scores) - before  # a whole file of one task at least, maybe another's begun
    assert not any(Path(f).name.startswith("part-00001-") for f in orphans), "the held task had written nothing"
    versions = sorted((scores / "_delta_log").glob("*.json"))
    assert len(versions) == (1 if seeded else 0), "the killed run committed nothing"

    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model, **sections, run={"run_id": "rerun"}), spark=spark,
                      out=out)
    new = 20 - len(seeded)
    assert summary.complete and (summary.rows_in, summary.rows_out) == (new, new), out.getvalue()
    assert summary.resumed_tasks == 4, "the killed run had scored and staged every task: it died in the write"
    while time.time() < killed_at + 3:  # whatever survived of the killed job has had its chance to commit
        time.sleep(0.5)
    rows = read_scores(tmp_path)
    ids = rows["doc_id"].to_pylist()
    assert sorted(ids) == [f"d{i:05d}" for i in range(20)], "each id once"
    assert {i for i, r in zip(ids, rows["run_id"].to_pylist()) if r == "seed"} == seeded
    assert set(rows["run_id"].to_pylist()) == {"rerun"} | ({"seed"} if seeded else set()), "no row of the killed run"
    history = [(commit_metadata(e).get("sbi.run_id"), e["operation"]) for e in consistent_history(str(scores))]
    assert history == ([("rerun", "MERGE"), ("seed", "WRITE")] if seeded else [("rerun", "WRITE")]), history
    # the log and the table read back agree; the killed tasks' files are on disk in no version
    table = DeltaTable(str(scores))
    assert in_log(scores) == live(scores) and on_disk(scores) - in_log(scores) == orphans
    assert sum(table.get_add_actions(flatten=True).column("num_records").to_pylist()) == 20
    assert sorted(r["doc_id"] for r in table_rows(spark, scores)) == sorted(ids)


def test_a_sweep_leaves_running_writes_alone_and_a_claimed_write_cannot_commit(tmp_path):
    root = tmp_path / "t"
    (root / "ds=x").mkdir(parents=True)
    live, dead_id = "a" * 32, "b" * 32
    for write_id in (live, dead_id):
        (root / "ds=x" / f"part-00000-a0-{write_id}-0123456789ab.snappy.parquet").write_bytes(b"PAR1")
    (root / "ds=x" / "part-00000-ea0c89cc-c000.snappy.parquet").write_bytes(b"PAR1")  # not ours: no write id
    with running_marker(str(root), live, table_version=None, heartbeat_s=0.1):
        dead_marker = root / MARKER_DIR / f"{dead_id}.running"
        dead_marker.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
        os.utime(dead_marker, (time.time() - 60, time.time() - 60))  # silent for a minute
        time.sleep(0.3)
        report = sweep_leftovers(root, grace_s=5)
        assert report.files == [f"ds=x/part-00000-a0-{dead_id}-0123456789ab.snappy.parquet"]
        assert report.live_writes == [live]
        assert {p.name for p in (root / "ds=x").iterdir()} == {
            f"part-00000-a0-{live}-0123456789ab.snappy.parquet", "part-00000-ea0c89cc-c000.snappy.parquet"}
        with pytest.raises(RuntimeError, match="was given up"):
            claim_for_commit(str(root), dead_id)
        assert claim_for_commit(str(root), live)["pid"] == os.getpid()
    # the write ended without committing (its marker is finished): `pipeline vacuum` removes its file and marker
    from pipeline.cli import main

    time.sleep(0.05)
    assert main(["vacuum", str(root), "--grace-s", "0.01", "--marker-retention-hours", "0"]) == 0
    assert {p.name for p in (root / "ds=x").iterdir()} == {"part-00000-ea0c89cc-c000.snappy.parquet"}
    assert list((root / MARKER_DIR).iterdir()) == []


# ----------------------------------------------------------------------------- overlapping commits
def _concurrently(writes: dict[str, callable]) -> dict[str, object]:
    return at_once(writes, expected=(SinkError,), timeout_s=400)  # a lost race is a SinkError; else a fault


@pytest.mark.drills  # a race: writers at a barrier
def test_overlapping_overwrites_of_one_partition_one_wins_the_other_fails_clearly(spark, tmp_path):
    path, barrier = tmp_path / "t", tmp_path / "barrier"
    sink = SinkConfig(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    write_sink(ids_frame(spark, range(5), D1, writer="seed"), sink, partition_values={"ds": D1})
    faults = {"commit_barrier": {"dir": str(barrier), "parties": 2, "timeout_s": 120}}
    outcomes = _concurrently({
        name: (lambda name=name, n=n: write_sink(ids_frame(spark, range(n), D1, writer=name), sink,
                                                 partition_values={"ds": D1}, faults=faults))
        for name, n in (("a", 30), ("b", 20))
    })
    failed = {n: o for n, o in outcomes.items() if isinstance(o, SinkError)}
    assert len(failed) == 1, outcomes
    (loser, error), = failed.items()
    winner = ({"a", "b"} - {loser}).pop()
    assert "conflict: another job committed" in str(error) and "committed nothing" in str(error)
    table = DeltaTable(str(path))
    rows = table.to_pyarrow_table()
    assert set(rows["writer"].to_pylist()) == {winner}, "never a mixed partition"
    assert sorted(rows["id"].to_pylist()) == list(range({"a": 30, "b": 20}[winner]))
    assert table.version() == 1
    # both commits had read the table before either committed: they really overlapped
    ready = [p.stat().st_mtime for p in barrier.glob("*.ready")]
    committed = max(h["timestamp"] for h in table.history()) / 1000
    assert len(ready) == 2 and max(ready) <= committed + 0.01
    assert on_disk(path) == in_log(path), "the loser's files are deleted; the seed's stay for time travel"
    assert DeltaTable(str(path), version=0).to_pyarrow_table().num_rows == 5


@pytest.mark.drills  # a race: writers at a barrier
@pytest.mark.parametrize("mode", ["keyed append", "overwrite_partition"])
def test_two_first_writes_that_both_create_the_table_write_each_row_once(spark, tmp_path, writer, mode):
    """The first night: both writes found no table and commit at once (the barrier). The losing create never
    adds its rows as a second ``CREATE TABLE`` (delta-rs's retry did: every key twice); a keyed append then
    writes only the keys the winner did not, and a partition overwrite fails as a conflict (plain appends:
    ``test_delta_sink``)."""
    path, barrier = tmp_path / "t", tmp_path / "barrier"
    keyed = mode == "keyed append"
    sink = sink_config(path=str(path), mode="append" if keyed else mode, partition_by=["ds"])
    faults = {"commit_barrier": {"dir": str(barrier), "parties": 2, "timeout_s": 120}}
    ranges = {"a": range(0, 30), "b": range(20, 45)}
    keys = {"key_columns": ("id", "ds"), "read_version": None} if keyed else {}
    outcomes = _concurrently({
        name: (lambda name=name: write_sink(ids_frame(spark, ranges[name], D1, writer=name), sink,
                                            partition_values={"ds": D1}, faults=faults,
                                            commit=CommitOptions(txn_app_id=f"sbi-{name}", **keys)))
        for name in ranges
    })
    assert len(list(barrier.glob("*.ready"))) == 2, "both had found no table before either committed"
    failed = {n: o for n, o in outcomes.items() if isinstance(o, SinkError)}
    ids = sorted(r["id"] for r in table_rows(spark, path))
    if mode == "overwrite_partition":
        assert len(failed) == 1, outcomes
        (loser, error), = failed.items()
        winner = ({"a", "b"} - {loser}).pop()
        assert "conflict" in str(error) and "committed nothing" in str(error), error
        assert ids == list(ranges[winner]), "the winner's rows, once"
        return
    assert not failed, outcomes
    assert ids == list(range(45)), "each key once"
    assert sorted(o.overlapped for o in outcomes.values()) == [0, 10]
    if writer == "deltalake":
        assert on_disk(path) - in_log(path) == set(), "the loser's rewritten or unused files are swept"


def test_history_read_while_another_job_commits_keeps_the_right_versions(tmp_path):
    """deltalake labels the commits of a table loaded before another commit off by one (version -1 for the first)."""
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    for n in range(2):
        write_deltalake(path, pa.table({"a": [n]}), mode="append", commit_properties=None)
    stale = DeltaTable(path)
    write_deltalake(path, pa.table({"a": [2]}), mode="append")
    assert [e["version"] for e in stale.history()] == [1, 0, -1], "deltalake's own labels, shifted"
    got = consistent_history(path, table=DeltaTable(path, version=1))
    assert [e["version"] for e in got] == [2, 1, 0]
    assert [e["timestamp"] for e in got] == [e["timestamp"] for e in DeltaTable(path).history()]


@pytest.mark.drills  # a race: writers at a barrier
def test_two_appends_to_different_days_at_once_both_land(spark, tmp_path):
    path, barrier = tmp_path / "t", tmp_path / "barrier"
    sink = SinkConfig(path=str(path), mode="append", partition_by=["ds"])
    write_sink(ids_frame(spark, [], D1), sink)
    faults = {"commit_barrier": {"dir": str(barrier), "parties": 2, "timeout_s": 120}}
    outcomes = _concurrently({
        str(day): (lambda day=day: write_sink(ids_frame(spark, range(10), day, writer=str(day)), sink,
                                              commit=CommitOptions(txn_app_id=f"sbi-{day}"), faults=faults))
        for day in (D1, D2)
    })
    assert not [o for o in outcomes.values() if isinstance(o, SinkError)], outcomes
    assert sorted(o.version for o in outcomes.values()) == [1, 2]
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert sorted((r["ds"], r["id"]) for r in rows) == sorted((d, i) for d in (D1, D2) for i in range(10))
    assert len(list(barrier.glob("*.ready"))) == 2
    assert on_disk(path) == in_log(path)


@pytest.mark.drills  # a race: writers at a barrier
def test_two_overlapping_keyed_appends_write_each_key_once(spark, tmp_path, writer):
    """Two runs read the day's keys at the same version (both saw none of the other's), scored overlapping
    rows, and commit one after the other: the second writes only the keys the first did not."""
    from pipeline.io.sources import table_version

    path = tmp_path / "t"
    sink = sink_config(path=str(path), mode="append", partition_by=["ds"])
    write_sink(ids_frame(spark, range(3), D1, writer="seed"), sink, partition_values={"ds": D1},
               commit=CommitOptions(key_columns=("id", "ds"), read_version=None))
    read_at = table_version(spark, str(path))
    first = write_sink(ids_frame(spark, range(3, 12), D1, writer="a"), sink, partition_values={"ds": D1},
                       commit=CommitOptions(key_columns=("id", "ds"), read_version=read_at))
    second = write_sink(ids_frame(spark, range(8, 20), D1, writer="b"), sink, partition_values={"ds": D1},
                        commit=CommitOptions(key_columns=("id", "ds"), read_version=read_at))
    # the other day's same ids are other keys
    other_day = write_sink(ids_frame(spark, range(5), D2, writer="c"), sink, partition_values={"ds": D2},
                           commit=CommitOptions(key_columns=("id", "ds"), read_version=read_at))
    assert (first.overlapped, second.overlapped, other_day.overlapped) == (0, 4, 0)
    rows = table_rows(spark, path)
    keys = sorted((r["ds"], r["id"]) for r in rows)
    assert keys == sorted(set(keys)), "each key once"
    assert keys == sorted([(D1, i) for i in range(20)] + [(D2, i) for i in range(5)])
    assert {r["id"]: r["writer"] for r in rows if r["ds"] == D1 and 8 <= r["id"] < 12} == dict.fromkeys(range(8, 12), "a")
    if writer == "deltalake":
        assert on_disk(path) - in_log(path) == set(), "the rewritten file's original is swept"


@pytest.mark.drills  # a race: writers at a barrier
def test_overlapping_keyed_appends_that_commit_at_once_write_each_key_once(spark, tmp_path):
    """Both commits read the table before either commits (the barrier): the second loses the race on the day's
    conflict token, checks the winner's keys, and commits only the rest. Nothing fails, nothing doubles."""
    path, barrier = tmp_path / "t", tmp_path / "barrier"
    sink = SinkConfig(path=str(path), mode="append", partition_by=["ds"])
    write_sink(ids_frame(spark, [], D1), sink)
    faults = {"commit_barrier": {"dir": str(barrier), "parties": 2, "timeout_s": 120}}
    outcomes = _concurrently({
        name: (lambda name=name, ids=ids: write_sink(
            ids_frame(spark, ids, D1, writer=name), sink, partition_values={"ds": D1}, faults=faults,
            commit=CommitOptions(key_columns=("id", "ds"), read_version=0)))
        for name, ids in (("a", range(0, 30)), ("b", range(20, 45)))
    })
    assert not [o for o in outcomes.values() if isinstance(o, SinkError)], outcomes
    assert sorted(o.overlapped for o in outcomes.values()) == [0, 10]
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(45)), "each key once"
    assert len(list(barrier.glob("*.ready"))) == 2, "both had read the table before either committed"
    assert DeltaTable(str(path)).version() == 2, "both committed: the seed, the winner, the rest of the loser"
    assert on_disk(path) - in_log(path) == set(), "the loser's rewritten file's original is swept"


def _two_runs_at_once(tmp_path, model, spark, **sections) -> tuple[dict, dict]:
    outs = {"night": io.StringIO(), "backfill": io.StringIO()}

    def run(name):
        config = job_config(tmp_path, model, **{**sections, "run": {**sections.get("run", {}), "run_id": name}})
        return run_job(config, spark=spark, out=outs[name])

    results = at_once({n: functools.partial(run, n) for n in outs}, expected=(Exception,), timeout_s=800)
    return results, {k: v.getvalue() for k, v in outs.items()}


@pytest.mark.drills  # a race: writers at a barrier
@pytest.mark.timeout(900)
def test_two_overlapping_runs_of_one_day_write_each_row_once(spark, tmp_path, tiny_embed_model):
    """Two whole runs of the same day (a backfill during the nightly run) score the same rows and meet at the
    commit: one writes them, the other finds them written, and both runs' checks pass."""
    write_delta(tmp_path / "docs", make_documents(16))
    faults = {"commit_barrier": {"dir": str(tmp_path / "barrier"), "parties": 2, "timeout_s": 300}}
    results, outs = _two_runs_at_once(tmp_path, tiny_embed_model, spark, run={"faults": faults})
    assert all(getattr(r, "complete", False) for r in results.values()), (results, outs)
    assert sorted(r.rows_in for r in results.values()) == [16, 16], "both scored the day: they overlapped"
    assert [r.rows_out for r in results.values()] == [16, 16], "both account for every row"
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert sorted(ids) == [f"d{i:05d}" for i in range(16)], "each row once"
    said = [name for name, o in outs.items() if "were committed meanwhile by an overlapping run" in o]
    assert len(said) == 1, outs


@pytest.mark.drills  # a race: writers at a barrier
@pytest.mark.timeout(900)
def test_overlapping_partition_overwrites_leave_the_output_and_its_quarantine_to_one_run(spark, tmp_path,
                                                                                        tiny_embed_model):
    """Run A commits its quarantine, run B replaces it, then both go on to the output: A stops with a conflict
    before its output commit, B commits, and both tables hold B's rows (before, A's output could stand beside
    B's quarantine: a failed row in neither table)."""
    docs = make_documents(12)
    texts = docs["text"].to_pylist()
    texts[3] = "a POISON row"
    write_delta(tmp_path / "docs", docs.set_column(1, "text", pa.array(texts)))
    run = {"faults": {"poison_marker": "POISON", "quarantine_barrier": {"dir": str(tmp_path / "barrier"),
                                                                         "parties": 2, "timeout_s": 120}},
           "max_error_fraction": 0.2}
    results, outs = _two_runs_at_once(tmp_path, tiny_embed_model, spark, sink={"mode": "overwrite_partition"},
                                      run=run)
    failed = {n: r for n, r in results.items() if isinstance(r, Exception)}
    assert len(failed) == 1, (results, outs)
    (loser, error), = failed.items()
    winner = ({"night", "backfill"} - {loser}).pop()
    assert results[winner].complete
    assert f"conflict: run {winner} replaced the quarantine of ds 2026-11-28" in str(error), error
    output = read_scores(tmp_path)
    quarantine = DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table()
    assert set(output["run_id"].to_pylist()) == set(quarantine["run_id"].to_pylist()) == {winner}
    assert sorted(output["doc_id"].to_pylist() + quarantine["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(12)]


# ----------------------------------------------------------------------------- nested tables
def test_a_quarantine_table_inside_the_output_folder_survives_the_next_nights_sweep(spark, tmp_path,
                                                                                   tiny_embed_model):
    """``sink.quarantine_path: <sink.path>/quarantine``: the output's leftover sweep never enters another table."""
    docs = make_documents(20)
    texts = docs["text"].to_pylist()
    texts[3] = "a POISON row"
    write_delta(tmp_path / "docs", docs.set_column(1, "text", pa.array(texts)))
    sink = {"quarantine_path": str(tmp_path / "scores" / "quarantine"), "leftover_grace_s": 0.001}
    run = {"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1}
    for day in ("2026-11-28", "2026-11-29"):  # a tiny grace: every file the sweep can judge is judged at once
        summary = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={**run, "ds": day}), spark=spark,
                          out=io.StringIO())
        assert summary.complete and (summary.rows_out, summary.rows_quarantined) == (19, 1)
    quarantine = DeltaTable(str(tmp_path / "scores" / "quarantine")).to_pyarrow_table()
    assert sorted(str(d) for d in quarantine["ds"].to_pylist()) == ["2026-11-28", "2026-11-29"]
    assert on_disk(tmp_path / "scores" / "quarantine") == in_log(tmp_path / "scores" / "quarantine")
    assert read_scores(tmp_path).num_rows == 38


# ----------------------------------------------------------------------------- appends keyed on rows
def test_an_append_retried_with_a_changed_setting_writes_each_key_once(spark, tmp_path, tiny_embed_model, writer):
    """The first try committed; the scheduler retries with a smaller batch (after an OOM, say): a new logical
    run by its config, the same rows by their keys (id, ds)."""
    write_delta(tmp_path / "docs", make_documents(12))
    first = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "first"}), spark=spark, out=io.StringIO())
    assert first.rows_out == 12
    out = io.StringIO()
    retry = run_job(job_config(tmp_path, tiny_embed_model, batching={"batch_size": 4}, run={"run_id": "retry"}),
                    spark=spark, out=out)
    assert "12 of 12 row(s) already in" in out.getvalue() and "(key: id, ds): not scored again" in out.getvalue()
    assert retry.complete and (retry.rows_in, retry.rows_out) == (0, 0)
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert sorted(ids) == [f"d{i:05d}" for i in range(12)], "each key once"

    # a source that grew since: only the new keys are appended to the day
    write_delta(tmp_path / "docs", make_documents(15), mode="overwrite")
    grown = run_job(job_config(tmp_path, tiny_embed_model, batching={"batch_size": 8}, run={"run_id": "grown"}),
                    spark=spark, out=io.StringIO())
    assert (grown.rows_in, grown.rows_out) == (3, 3)
    assert sorted(read_scores(tmp_path)["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(15)]


def test_a_deleted_day_is_written_again_by_the_rerun_of_its_run(spark, tmp_path, tiny_embed_model, writer):
    """The transaction id outlives the rows it stood for: a rerun finds it, sees the rows gone, and writes them."""
    write_delta(tmp_path / "docs", make_documents(12))
    first = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "first"}), spark=spark, out=io.StringIO())
    assert first.rows_out == 12
    DeltaTable(str(tmp_path / "scores")).delete("ds = '2026-11-28'")  # the on-call engineer's delete
    assert read_scores(tmp_path).num_rows == 0
    out = io.StringIO()
    rerun = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "rerun"}), spark=spark, out=out)
    assert "run first committed at version 0 but its rows are no longer in" in out.getvalue()
    assert rerun.complete and (rerun.rows_in, rerun.rows_out) == (12, 12)
    table = read_scores(tmp_path)
    assert sorted(table["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(12)]
    assert set(table["run_id"].to_pylist()) == {"rerun"}

    # and once the rows are back, the same run again scores nothing: every key is there
    again_out = io.StringIO()
    again = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "again"}), spark=spark, out=again_out)
    assert "12 of 12 row(s) already in" in again_out.getvalue() and again.rows_in == 0
    assert read_scores(tmp_path).num_rows == 12


def test_incremental_keys_are_checked_across_days_at_commit(tmp_path):
    """An incremental key (id, content_hash, task_fingerprint) has no day in it: a row another run committed
    on any day since this run read its keys is left out of this run's files; rows with another hash stay."""
    from deltalake import write_deltalake

    from pipeline.io.delta import keys as delta_keys
    from pipeline.io.delta.files import PartFile

    root = str(tmp_path / "t")
    keys = ["id", "content_hash", "task_fingerprint"]

    def rows(ids, digest, ds):
        return pa.table({"id": ids, "content_hash": [digest] * len(ids), "task_fingerprint": ["f1"] * len(ids),
                         "ds": [ds] * len(ids)})

    write_deltalake(root, rows(["a"], "h", "2026-11-27"), partition_by=["ds"])
    base = DeltaTable(root).version()
    write_deltalake(root, rows(["b", "c"], "h", "2026-11-29"), mode="append", partition_by=["ds"])  # the other run
    staged = []
    for ids, digest in ((["b", "x"], "h"), (["c"], "h2")):
        part = PartFile(root, ["ds"], ("2026-11-28",), "w1", "00000-a0")
        part.write(rows(ids, digest, "2026-11-28").drop(["ds"]))
        staged.append(part.close())
    added = delta_keys.files_added_since(DeltaTable(root), root, base)
    assert len(added) == 1 and added[0]["partition_values"] == {"ds": "2026-11-29"}
    taken = delta_keys.taken_keys(root, added, keys, ["ds"])

    def rewrite(values, table):
        part = PartFile(root, ["ds"], (values["ds"],), "w1", "keyed")
        part.write(table)
        return part.close()

    kept, dropped = delta_keys.drop_taken(root, staged, taken, keys, ["ds"], rewrite=rewrite)
    assert dropped == 1, "b with hash h was committed by the other run on another day"
    left = sorted(r["id"] for add in kept for r in pa.parquet.read_table(os.path.join(root, add["path"])).to_pylist())
    assert left == ["c", "x"], "c has another content hash: another key"
    assert staged[1] in kept, "a file without a taken key is kept as it is"
    assert delta_keys.key_token(keys, {"ds": "2026-11-28"}) == "sbi.keys", "one token for the whole table"
