"""Delete only what a run wrote and marked: every path that removes files leaves a foreign table or file
exactly where it looks byte for byte, and says what it left alone.

The delete paths and the proof each relies on are listed in ``docs/guarantees.md`` ("What a run deletes").
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.io.delta.markers import MARKER_DIR
from pipeline.runner import run_job
from pipeline.journal.layout import OWNER_FILE
from pipeline.journal.plans import StagePlan, open_plan
from pipeline.journal.sweep import StagingLayoutError, check_root, sweep_staging

from tests.support.data import make_documents, sink_config, write_delta
from tests.support.jobs import job_config, read_scores

D1 = dt.date(2026, 11, 28)
FIVE_DAYS = 5 * 24 * 3600


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the sha256 of its bytes: equal snapshots mean byte for byte intact."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        os.utime(p, (then, then))


def _foreign_table(path: Path) -> dict[str, str]:
    """A user's own partitioned Delta table at ``path`` (two days), aged five days; its snapshot."""
    rows = pa.table({"id": list(range(6)), "ds": ["2026-11-01"] * 3 + ["2026-11-02"] * 3})
    write_delta(path, rows, partition_by=["ds"])
    _age(path, FIVE_DAYS)
    return _snapshot(path)


# ----------------------------------------------------------------------------- the staging root
def test_a_users_table_beside_the_sink_named_like_its_staging_is_refused_and_intact(spark, tmp_path,
                                                                                    tiny_embed_model, writer):
    """A user's table ``scores_staging`` beside the job's ``scores``: before any work the run refuses to stage
    there, saying what it found and what to set; the table reads back whole."""
    from deltalake import DeltaTable

    write_delta(tmp_path / "docs", make_documents(12))
    before = _foreign_table(tmp_path / "scores_staging")
    with pytest.raises(StagingLayoutError, match=r"scores_staging already holds a Delta table.*run.staging_path"):
        run_job(job_config(tmp_path, tiny_embed_model), spark=spark, out=io.StringIO())
    assert _snapshot(tmp_path / "scores_staging") == before
    assert DeltaTable(str(tmp_path / "scores_staging")).to_pyarrow_table().num_rows == 6
    assert not (tmp_path / "scores").exists(), "refused before any work: no output written"

    summary = run_job(job_config(tmp_path, tiny_embed_model, run={"staging_path": str(tmp_path / "stage")}),
                      spark=spark, out=io.StringIO())
    assert summary.complete and read_scores(tmp_path).num_rows == 12, "the advice in the error works"
    assert _snapshot(tmp_path / "scores_staging") == before


def test_a_shared_folder_as_staging_path_is_refused_and_its_old_files_survive(spark, tmp_path, tiny_embed_model):
    """``run.staging_path`` pointed at a team's shared folder holding a five-day-old file no run wrote."""
    write_delta(tmp_path / "docs", make_documents(12))
    shared = tmp_path / "shared"
    (shared / "team_a").mkdir(parents=True)
    (shared / "team_a" / "results.csv").write_text("id,score\n1,0.5\n")
    _age(shared, FIVE_DAYS)
    before = _snapshot(shared)
    config = job_config(tmp_path, tiny_embed_model, run={"staging_path": str(shared), "staging_max_age_hours": 1})
    with pytest.raises(StagingLayoutError, match=r"1 entr\(ies\) no run of this project wrote \(team_a/\)"):
        run_job(config, spark=spark, out=io.StringIO())
    assert _snapshot(shared) == before
    gone = sweep_staging(str(shared), max_age_s=0)  # what `pipeline vacuum` and a run's start call
    assert (gone.removed, gone.left_alone) == ([], ["team_a/"]) and _snapshot(shared) == before


def test_a_staging_root_of_ours_keeps_what_others_put_in_it_and_names_it(spark, tmp_path, tiny_embed_model):
    """A root a run created is swept of its own old plans only: a file someone dropped beside them, and one
    inside an old plan folder, stay byte for byte, and the run says so in one line."""
    write_delta(tmp_path / "docs", make_documents(12))
    root = tmp_path / "scores_staging"
    old = Path(open_plan(str(root), StagePlan("sbi-old", "delta:0", "fp", rows=5, tasks=1, job="score_test",
                                              ds="2026-11-01")))
    (old / "task-0.0123456789ab.arrow").write_bytes(b"staged rows")
    (old / "task-0.done.json").write_text("{}")
    (old / "my_notes.txt").write_text("mine, inside an old plan folder")
    (root / "README.txt").write_text("the team's own file, beside the plans")
    _age(root, FIVE_DAYS)
    foreign = {k: v for k, v in _snapshot(root).items() if k in (f"{old.name}/my_notes.txt", "README.txt")}
    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model), spark=spark, out=out)
    assert summary.complete and read_scores(tmp_path).num_rows == 12
    after = _snapshot(root)
    assert {k: after.get(k) for k in foreign} == foreign, "what others wrote is intact"
    assert sorted(after) == sorted([*foreign, OWNER_FILE, f"{old.name}/plan.json"]), \
        "the old plan's own files went (its proof stays beside the foreign file), the run's plan after its commit"
    assert "left alone in staging folder" in out.getvalue() and "README.txt" in out.getvalue()
    assert f"{old.name}/my_notes.txt" in out.getvalue()


def test_check_root_tells_ours_from_theirs(tmp_path):
    root = tmp_path / "stage"
    assert check_root(str(root)) is None, "a new root is ours to create"
    folder = Path(open_plan(str(root), StagePlan("k", None, "fp", rows=1, tasks=1)))
    assert (root / OWNER_FILE).is_file() and check_root(str(root)).refusal() is None
    (folder / "plan.json").write_text(json.dumps({"run_key": "forged", "rows": 1, "tasks": 1,
                                                  "task_fingerprint": "fp", "source_version": None}))
    (root / OWNER_FILE).unlink()
    check = check_root(str(root))
    assert check.foreign == (f"{folder.name}/",) and check.refusal(), \
        "a plan.json that does not hash to its folder's name proves nothing"
    assert sweep_staging(str(root), max_age_s=0).removed == [] and folder.is_dir()


# ----------------------------------------------------------------------------- table folders: quarantine, leftovers
PLANTED = ("ds=2026-11-28/notes.txt", f"ds=2026-11-28/part-00000-a0-{'f' * 32}-0123456789ab.snappy.parquet",
           f"{MARKER_DIR}/{'e' * 32}.finished", f"{MARKER_DIR}/README")


def _plant(table: Path) -> None:
    """Foreign files where the leftover sweep looks (``PLANTED``): a note in a partition, a Parquet file named
    like ours whose write has no marker of ours, and files in the marker folder that are no markers of ours."""
    bodies = [b"ours, not the job's", b"PAR1 theirs", json.dumps({"note": "not a marker of ours"}).encode(),
              b"hands off"]
    for rel, body in zip(PLANTED, bodies):
        (table / rel).parent.mkdir(parents=True, exist_ok=True)
        (table / rel).write_bytes(body)
    _age(table / "ds=2026-11-28", 3600)
    _age(table / MARKER_DIR, FIVE_DAYS)


def _planted(table: Path) -> dict[str, str | None]:
    snapshot = _snapshot(table)
    return {rel: snapshot.get(rel) for rel in PLANTED}


def test_foreign_files_in_the_output_and_quarantine_folders_survive_every_sweep(spark, tmp_path, tiny_embed_model,
                                                                               writer):
    """Two nights with a poison row (quarantine commits) and a tiny leftover grace, so every file a sweep can
    judge is judged at once; then ``pipeline vacuum`` with no grace and no marker retention."""
    docs = make_documents(20)
    texts = docs["text"].to_pylist()
    texts[3] = "a POISON row"
    write_delta(tmp_path / "docs", docs.set_column(1, "text", pa.array(texts)))
    scores, quarantine = tmp_path / "scores", tmp_path / "scores_quarantine"
    run = {"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1}
    sink = {"leftover_grace_s": 0.001, "mode": "overwrite_partition", "partition_by": ["ds"]}
    first = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={**run, "ds": "2026-11-27"}),
                    spark=spark, out=io.StringIO())
    assert first.complete and first.rows_quarantined == 1
    for table in (scores, quarantine):
        _plant(table)
    before = {t: _planted(t) for t in (scores, quarantine)}
    assert all(None not in b.values() for b in before.values()), before
    out = io.StringIO()
    second = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={**run, "ds": "2026-11-29"}),
                     spark=spark, out=out)
    assert second.complete and (second.rows_out, second.rows_quarantined) == (19, 1)
    assert {t: _planted(t) for t in (scores, quarantine)} == before, "foreign files intact after the run's sweeps"
    if writer == "deltalake":  # the connector runs no sweep of ours; Delta's VACUUM is the user's to call
        assert "warning: left alone in" in out.getvalue() and "f" * 32 in out.getvalue(), out.getvalue()

    from contextlib import redirect_stdout

    from pipeline.cli import main

    printed = io.StringIO()
    with redirect_stdout(printed):
        for table in (scores, quarantine):
            assert main(["vacuum", str(table), "--grace-s", "0", "--marker-retention-hours", "0",
                         "--staging-max-age-hours", "0"]) == 0
    assert {t: _planted(t) for t in (scores, quarantine)} == before, "and after vacuum"
    assert printed.getvalue().count("left alone (named like ours, but no marker of ours") == 2, printed.getvalue()
    assert read_scores(tmp_path).num_rows == 38


# ----------------------------------------------------------------------------- a failed write's clean-up
def _failing_write(spark, sink, *, fail: bool, late: Path | None = None):
    """``write_sink`` of 30 rows in 3 tasks; with ``fail`` every attempt of one task raises mid-write (after
    its first rows reached the writer), so the job aborts and cleans up. With ``late`` (a folder) another
    task closes its file after the abort began and its worker dies before it can see that (the fault
    ``late_close``, which touches ``<late>/<partition>.closed`` once its file is in the table)."""
    from pyspark.sql import functions as F

    from pipeline.io.delta.sink import write_sink

    faults = None
    if late is not None:
        tasks = spark.range(30).repartition(3, "id").select("id", F.spark_partition_id().alias("task"))
        failing = tasks.where("id = 25").first()["task"]
        # one of the two tasks that start first (local[2]): a task queued behind the failing one never starts
        faults = {"late_close": {"partitions": [1 if failing == 0 else 0], "dir": str(late)}}

    @F.udf("long")
    def boom(i):
        if fail and i == 25:
            raise ValueError("row 25 fails on every attempt")
        return i

    frame = spark.range(30).repartition(3, "id").withColumn("id", boom("id")).withColumn("ds", F.lit(D1))
    return write_sink(frame, sink, partition_values={"ds": D1}, faults=faults)


def test_a_failed_write_removes_its_own_files_and_nothing_else(spark, tmp_path):
    table = tmp_path / "t"
    sink = sink_config(path=str(table), mode="overwrite_partition", partition_by=["ds"], writer="deltalake",
                       leftover_grace_s=0.001)
    _failing_write(spark, sink, fail=False)
    _plant(table)
    before = _planted(table)
    with pytest.raises(Exception, match="row 25 fails"):
        _failing_write(spark, sink, fail=True, late=tmp_path)
    assert list(tmp_path.glob("*.closed")), "a task closed its file after the abort began (the late_close fault)"
    assert _planted(table) == before
    data = [p for p in (table / "ds=2026-11-28").iterdir() if p.name.endswith(".parquet") and "f" * 32 not in p.name]
    from deltalake import DeltaTable

    assert {f"ds=2026-11-28/{p.name}" for p in data} == _files(DeltaTable(str(table))), \
        "the failed write's own files went; nothing else"


def test_a_failed_write_on_s3_removes_its_own_objects_and_nothing_else(spark, tmp_path):
    from deltalake import DeltaTable

    from pipeline.io.local_s3 import local_s3
    from pipeline.io.stores import storage_options

    with local_s3(buckets=["lake"]) as server:
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        try:
            s3 = server.client()
            foreign = {"t/ds=2026-11-28/notes.txt": b"theirs",
                       f"t/ds=2026-11-28/part-00000-a0-{'f' * 32}-0123456789ab.snappy.parquet": b"PAR1 theirs",
                       f"t/_sbi_jobs/{'e' * 32}.finished": b'{"note": "not ours"}'}
            sink = sink_config(path="s3a://lake/t", mode="overwrite_partition", partition_by=["ds"],
                               writer="deltalake", leftover_grace_s=0.001)
            _failing_write(spark, sink, fail=False)
            for key, body in foreign.items():
                s3.put_object(Bucket="lake", Key=key, Body=body)
            with pytest.raises(Exception, match="row 25 fails"):
                _failing_write(spark, sink, fail=True, late=tmp_path)
            assert list(tmp_path.glob("*.closed")), "a task closed its file after the abort began"
            _failing_write(spark, sink, fail=False)  # a good night after it replaces the day
            for key, body in foreign.items():
                assert s3.get_object(Bucket="lake", Key=key)["Body"].read() == body, key
            listing = s3.list_objects_v2(Bucket="lake", Prefix="t/ds=2026-11-28/").get("Contents", [])
            # (pyarrow's S3 file system leaves a folder's empty marker object, "ds=.../": no data)
            ours = {o["Key"][len("t/"):] for o in listing if not o["Key"].endswith("/")} - {k[len("t/"):] for k in foreign}
            table = DeltaTable("s3://lake/t", storage_options=storage_options("s3://lake/t", environ=server.env()))
            in_versions = set()
            for version in range(table.version() + 1):
                table.load_as_version(version)
                in_versions |= _files(table)
            assert ours and ours <= in_versions, ("the failed write's objects went: what remains is in some version",
                                                  sorted(ours - in_versions))
        finally:
            for key, value in saved.items():
                os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def test_after_a_failed_write_a_connect_client_waits_as_long_as_spark_takes_to_kill_its_tasks(spark_connect,
                                                                                             monkeypatch):
    """A Connect client cannot see the failed job's tasks: it waits the task monitor's look (2 s), the
    server's ``spark.python.task.killTimeout`` (2 s there) and the settling time before it sweeps again."""
    from pipeline.io.delta import stragglers

    slept = []
    monkeypatch.setattr(stragglers.time, "sleep", slept.append)
    jobs = stragglers.WriteJobs(spark_connect)
    assert jobs.jobs is None and jobs.kill_timeout_s == 2.0
    assert jobs.wait_until_ended() and slept == [4.5]


def _files(table) -> set[str]:
    """The data files of ``table``'s loaded version, relative to its root."""
    from urllib.parse import unquote

    return {unquote(p) for p in table.get_add_actions(flatten=True).column("path").to_pylist()}


def test_a_gguf_conversion_never_replaces_a_folder_it_did_not_write(tmp_path):
    """``convert_gguf`` replaces its output folder whole: one an earlier conversion wrote (its marker), or an
    empty one; a user's folder is refused before the GGUF is even read, and stays byte for byte."""
    from pipeline.generation.gguf import convert_gguf

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF not read")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "weights.safetensors").write_bytes(b"the user's own model")
    before = _snapshot(out)
    with pytest.raises(FileExistsError, match="was not written by a GGUF conversion"):
        convert_gguf(gguf, out)
    assert _snapshot(out) == before


def test_a_plans_request_journal_goes_with_it_and_a_file_dropped_in_it_stays(tmp_path):
    """The endpoint backend's journal and token ledger (``pipeline.journal.request_log``) are the plan's own files;
    a file someone put among them is left alone, named, with the folders that hold it."""
    from pipeline.journal.request_log import RequestLog
    from pipeline.journal.sweep import remove_run

    root = tmp_path / "stage"
    folder = Path(open_plan(str(root), StagePlan("sbi-k", None, "fp", rows=2, tasks=1)))
    log = RequestLog(str(folder), task=0, try_id="0123456789abcdef")
    log.record("k1", {"choices": []}, tokens=3)
    log.publish(force=True)
    log.close()
    (folder / "task-0.0123456789ab.arrow").write_bytes(b"rows")
    assert sweep_staging(str(root), max_age_s=1e9).left_alone == []
    (folder / "requests" / "task-0" / "notes.txt").write_text("mine")
    assert remove_run(str(root), "sbi-k") == [f"{folder.name}/requests/task-0/notes.txt"]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        OWNER_FILE, f"{folder.name}/plan.json", f"{folder.name}/requests/task-0/notes.txt"], \
        "only the foreign file stays, with the proofs that the folders around it are ours"
    (folder / "requests" / "task-0" / "notes.txt").unlink()
    assert remove_run(str(root), "sbi-k") == [] and not root.exists(), "the plan's own folders go once empty"
