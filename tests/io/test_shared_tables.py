"""Tables other people touch: a column they added to the output, a source they rebuilt, an upstream that came
back empty, a full staging disk, invalid bytes in a quarantined row, and a scheduler's SIGTERM."""

from __future__ import annotations

import datetime as dt
import io
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field

from pipeline.errors import SinkError
from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import job_config, read_scores

D1, D2 = "2026-11-28", "2026-11-29"


def _add_reviewed_column(scores) -> None:
    """A downstream job's change: a nullable ``reviewed`` column, set on every row of day 1."""
    table = DeltaTable(str(scores))
    table.alter.add_columns([Field("reviewed", "boolean", nullable=True)])
    DeltaTable(str(scores)).update(updates={"reviewed": "true"}, predicate=f"ds = '{D1}'")


def test_a_column_added_downstream_survives_the_next_nights_overwrite_with_its_data(spark, tmp_path,
                                                                                   tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(40))
    scores = tmp_path / "scores"
    sink = {"mode": "overwrite_partition"}
    assert run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"ds": D1}), spark=spark,
                   out=io.StringIO()).complete
    _add_reviewed_column(scores)
    for ds in (D2, D1):  # another day, then day 1 itself replaced
        summary = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"ds": ds, "run_id": f"r-{ds}"}),
                          spark=spark, out=io.StringIO())
        assert summary.complete and summary.rows_out == 40
        rows = read_scores(tmp_path)
        assert "reviewed" in rows.column_names, f"the column someone else added is still in the schema after {ds}"
        if ds == D2:
            by_day = {}
            for day, reviewed in zip(rows["ds"].to_pylist(), rows["reviewed"].to_pylist()):
                by_day.setdefault(str(day), []).append(reviewed)
            assert by_day[D1] == [True] * 40, "day 1's values are intact"
            assert by_day[D2] == [None] * 40, "the rows this run wrote have nulls there"
    assert read_scores(tmp_path).num_rows == 80


def test_a_column_of_ours_the_table_holds_with_another_type_is_refused_before_any_work(spark, tmp_path,
                                                                                      tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(12))
    theirs = pa.table({"doc_id": ["x"], "label": pa.array([7], pa.int64()), "ds": pa.array([dt.date(2026, 11, 1)])})
    write_delta(tmp_path / "scores", theirs, partition_by=["ds"])
    out = io.StringIO()
    with pytest.raises(SinkError, match=r"label: the table has long, this job writes string"):
        run_job(job_config(tmp_path, tiny_embed_model, sink={"partition_by": ["ds"]}), spark=spark, out=out)
    assert "scoring" not in out.getvalue(), "refused before any row was scored"
    assert DeltaTable(str(tmp_path / "scores")).version() == 0 and read_scores(tmp_path).num_rows == 1


def test_an_emptied_or_shrunk_source_does_not_replace_a_full_day_unless_allowed(spark, tmp_path, tiny_embed_model,
                                                                                 writer):
    from pipeline.cli import build_parser, config_from_args
    from pipeline.errors import JobError

    write_delta(tmp_path / "docs", make_documents(40))
    sink = {"mode": "overwrite_partition"}
    assert run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "full"}), spark=spark,
                   out=io.StringIO()).rows_out == 40
    for rows in (0, 12):  # the upstream emptied the source; then it came back with less than half the day
        write_delta(tmp_path / "docs", make_documents(rows), mode="overwrite")
        out = io.StringIO()
        with pytest.raises(JobError, match=rf"the source gives {rows} row\(s\) where it holds 40 now "
                                           r"\(run.min_rows_fraction 0.5 needs at least 20\).*--allow-empty"):
            run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": f"shrunk-{rows}"}), spark=spark,
                    out=out)
        assert "scoring" not in out.getvalue(), "refused before any work"
        assert sorted(set(read_scores(tmp_path)["run_id"].to_pylist())) == ["full"] and read_scores(tmp_path).num_rows == 40
    write_delta(tmp_path / "docs", make_documents(25), mode="overwrite")  # over half the day: a normal night
    assert run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "25"}), spark=spark,
                   out=io.StringIO()).rows_out == 25
    write_delta(tmp_path / "docs", make_documents(0), mode="overwrite")
    args = build_parser().parse_args(["run", "conf/score_documents.yaml", "--allow-empty"])
    assert config_from_args(args).run.allow_empty, "--allow-empty sets run.allow_empty"
    summary = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "empty", "allow_empty": True}),
                      spark=spark, out=io.StringIO())
    assert summary.complete and summary.rows_out == 0 and read_scores(tmp_path).num_rows == 0, "allowed: replaced"


def test_a_rebuilt_source_is_a_new_input_not_a_run_already_committed(spark, tmp_path, tiny_embed_model, writer):
    """The source table is dropped and rebuilt with 45 rows (version 0 again): the same append command scores
    the 5 new documents and says the source was rebuilt; it is not taken for the run that already committed."""
    import shutil

    write_delta(tmp_path / "docs", make_documents(40))
    first = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "first"}), spark=spark, out=io.StringIO())
    assert first.rows_out == 40 and first.source_snapshot.endswith(":0")
    shutil.rmtree(tmp_path / "docs")
    write_delta(tmp_path / "docs", make_documents(45))
    out = io.StringIO()
    again = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "again"}), spark=spark, out=out)
    assert "already committed" not in out.getvalue()
    assert "was rebuilt since run first (table id" in out.getvalue() and "(version 0 -> 0)" in out.getvalue()
    assert again.source_note and "source                  : the source" in out.getvalue()
    assert again.complete and again.rows_in == 5, "the 40 keys the output holds are not scored again"
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert len(ids) == 45 and len(set(ids)) == 45


@pytest.fixture
def small_disk(tmp_path):
    """A 16 kB tmpfs (a disk that fills up), mounted for the test and unmounted after; skipped where this
    process may not mount (not root)."""
    import subprocess

    mount = tmp_path / "small_disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}): the disk-full drill needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder, *, leave: int = 0) -> None:
    """Write to ``folder`` until its disk is full (``leave`` bytes given back after)."""
    with open(folder / "filler.bin", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 1024)
        except OSError:
            pass
    if leave:
        size = (folder / "filler.bin").stat().st_size
        with open(folder / "filler.bin", "r+b") as f:
            f.truncate(max(0, size - leave))


def _files(folder) -> list[str]:
    """Every file under ``folder`` (a folder that must exist), relative to it, sorted."""
    assert folder.is_dir(), f"{folder} does not exist"
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _free_bytes(folder) -> int:
    stat = os.statvfs(folder)
    return stat.f_bavail * stat.f_frsize


def test_a_full_staging_disk_turns_staging_off_and_the_run_goes_on(spark, tmp_path, tiny_embed_model, small_disk):
    """``run.staging_path`` on a disk with no room: the driver says staging is off in one line (no traceback),
    the run commits every row once, and nothing of the staging is on the disk."""
    write_delta(tmp_path / "docs", make_documents(40))
    stage = small_disk / "stage"
    _fill(small_disk)
    assert _free_bytes(small_disk) == 0
    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model, run={"staging_path": str(stage), "run_id": "full"}),
                      spark=spark, out=out)
    assert summary.complete and summary.rows_out == 40
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert len(ids) == 40 == len(set(ids))
    assert "warning: staging off for this run" in out.getvalue() and "No space left on device" in out.getvalue()
    assert out.getvalue().count("Traceback") == 0
    assert _files(small_disk) == ["filler.bin"], "no half-written staging file stays behind"


def test_a_staging_disk_with_room_for_the_plan_only_stages_no_task_and_the_run_goes_on(
        spark, tmp_path, tiny_embed_model, small_disk, monkeypatch):
    """``run.staging_path`` on a disk with room for the plan's small files and none for the rows: staging is
    on (no warning), every task's rows file runs out of space and is dropped, so no task is staged; the run
    commits every row once. Seen before the commit (a driver failure after inference keeps the staging for a
    rerun) and in the rerun, which finds nothing staged to reuse."""
    from pipeline.errors import InjectedFaultError
    from pipeline.journal.plans import staged_tasks

    write_delta(tmp_path / "docs", make_documents(40))
    stage = small_disk / "stage"
    stage.mkdir()
    _fill(small_disk, leave=8192)
    config = job_config(tmp_path, tiny_embed_model, run={"staging_path": str(stage), "run_id": "room"})
    monkeypatch.setenv("SBI_FAULTS", '{"fail_before_commit": true}')  # the same run: the config is unchanged
    out = io.StringIO()
    with pytest.raises(InjectedFaultError):
        run_job(config, spark=spark, out=out)
    assert "staging off" not in out.getvalue() and "Traceback" not in out.getvalue()
    (plan,) = [p for p in stage.iterdir() if p.is_dir()]
    assert _files(stage) == sorted(["_sbi_staging.json", f"{plan.name}/plan.json"]), "a task's rows or temp file"
    assert staged_tasks(str(plan)) == [] and _free_bytes(small_disk) < 4096, "the rows had room on the disk"

    monkeypatch.delenv("SBI_FAULTS")
    out = io.StringIO()
    summary = run_job(config.model_copy(update={"run": config.run.model_copy(update={"run_id": "room-2"})}),
                      spark=spark, out=out)
    assert summary.complete and summary.rows_out == 40
    assert (summary.resumed_tasks, summary.rows_reused) == (0, 0)
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert len(ids) == 40 == len(set(ids))
    assert not stage.exists() and _files(small_disk) == ["filler.bin"], "the run's staging went with its commit"


def test_a_quarantined_line_with_invalid_utf8_is_valid_text_with_its_bytes_kept(spark, tmp_path, tiny_embed_model,
                                                                               writer):
    bad = b'{"doc_id": "j2", "text": "caf\xe9 \xff"}'
    lines = [b'{"doc_id": "j1", "text": "good movie", "source": "log"}', bad,
             b'{"doc_id": "j3", "text": "great story", "source": "log"}', b'{"doc_id": "j4", "text": "fine", "source": "x"}']
    (tmp_path / "logs.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    config = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                        source={"format": "json", "path": str(tmp_path / "logs.jsonl")}, run={"max_error_fraction": 0.5})
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete and (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (4, 3, 1)
    quarantine = DeltaTable(str(tmp_path / "scores_quarantine")).to_pandas()  # any reader opens it
    (row,) = quarantine.to_dict("records")
    assert row["status"] == "malformed" and row["input_text"] == bad.decode("utf-8", errors="replace")
    assert "\ufffd" in row["input_text"] and bytes(row["input_text_bytes"]) == bad, "the original bytes, kept"
    assert str(next(f.type for f in DeltaTable(str(tmp_path / "scores_quarantine")).schema().fields
                    if f.name == "input_text_bytes")) == 'PrimitiveType("binary")'


@pytest.mark.drills  # SIGTERM
@pytest.mark.beside
@pytest.mark.timeout(900)  # two drivers in JVMs of their own
def test_sigterm_stops_the_run_records_it_and_the_same_command_resumes(tmp_path, tiny_embed_model):
    """A scheduler's stop: SIGTERM to ``python -m pipeline run`` once half its tasks are staged. It exits 143
    with one line saying nothing was committed and how to resume (no Java stack trace), the runs table says
    ``stopped``, and the same command again reuses the staged tasks and writes each id once."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from pipeline.records.runs import read_runs
    from pipeline.journal.plans import staged_tasks

    from tests.support.drivers import REPO, below_of, kill_below

    write_delta(tmp_path / "docs", make_documents(20))
    config = job_config(tmp_path, tiny_embed_model, batching={"batch_size": 2}, sink={"writer": "deltalake"},
                        source={"repartition": 4}, run={"summary_path": str(tmp_path / "summary.json"), "ds": D1},
                        spark={"master": "local[2]"})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO), "SBI_NO_JARS": "1"}

    def start(log, faults=None):
        run_env = {**env, **({"SBI_FAULTS": json.dumps(faults)} if faults else {})}
        with open(log, "wb") as sink:
            return subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(tmp_path / "job.yaml")],
                                    env=run_env, cwd=str(REPO), stdout=sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def staged():
        root = tmp_path / "scores_staging"
        return sum(len(staged_tasks(str(p))) for p in root.iterdir() if p.is_dir()) if root.is_dir() else 0

    driver = start(tmp_path / "first.log", {"slow_batch_s": 0.4})
    deadline = time.monotonic() + 300
    while staged() < 2:
        assert driver.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.1)
    # what runs below the driver, taken before it exits (its JVM and Python workers then belong to init): a
    # worker left running stages its task after the driver is gone, so the tasks finished are counted once
    # all of them are killed (counting before made the comparison with the rerun's resumed tasks a race)
    below = below_of(driver.pid)
    os.kill(driver.pid, signal.SIGTERM)  # the driver's process alone, as `kill <pid>` or a scheduler does
    try:
        assert driver.wait(timeout=120) == 143, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        kill_below(below)
    log = (tmp_path / "first.log").read_text()
    last = [line for line in log.splitlines() if line.strip()][-1]
    assert last.startswith("error: stopped by SIGTERM before its commit: nothing was committed;"), log[-3000:]
    assert "are staged in" in last and "Resume: rerun the same command" in last
    # the last 2,000 characters before the stop and all after it (from the log's start when the stop is
    # earlier: a negative start would slice the log's tail instead)
    after = log[max(0, log.index("stopped by SIGTERM") - 2000):]
    assert "Traceback" not in log and "\tat org.apache" not in after, log[-3000:]
    assert not (tmp_path / "scores" / "_delta_log").exists(), "nothing committed"
    assert [r["outcome"] for r in read_runs(str(tmp_path / "scores_runs"))] == ["stopped"]
    finished = staged()

    rerun = start(tmp_path / "rerun.log")
    assert rerun.wait(timeout=600) == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["complete"] and saved["resumed_tasks"] == finished > 0
    ids = read_scores(tmp_path)["doc_id"].to_pylist()
    assert len(ids) == 20 == len(set(ids))
    assert [r["outcome"] for r in read_runs(str(tmp_path / "scores_runs"))] == ["stopped", "ok"]
