"""The driver's progress line: pure ETA math (doctests) and the adapters on both session kinds."""

from __future__ import annotations

import doctest
import io
import re
import threading
import time

import pyarrow as pa
import pytest

import pipeline.spark.progress_math as progress_math
from pipeline.spark.progress import (JobProgress, StageProgress, TaskRowsFile, inference_tasks_done, progress_line,
                                     read_task_rows, stage_source)

from tests.support.data import make_documents, write_delta


def test_doctests():
    result = doctest.testmod(progress_math)
    assert result.attempted >= 5 and result.failed == 0


def test_line_moves_with_tasks_and_never_reads_zero_of_zero():
    lines = [progress_line(job="j", elapsed_s=10 * (k + 1), tasks_done=k, tasks_total=4, rows_total=1_000)
             for k in range(5)]
    assert [line.split("rows ~")[1].split("/")[0] for line in lines] == ["0", "250", "500", "750", "1,000"]
    assert "ETA 0s" in lines[-1] and "rate and ETA after the first rows" in lines[0]
    assert "tasks 0/1 done" in progress_line(job="j", elapsed_s=1, tasks_done=0, tasks_total=0, rows_total=0)
    assert inference_tasks_done([StageProgress(1, 3, 3), StageProgress(2, 6, 4)], 6) == 4


def _slow_identity(batches):
    import time

    for batch in batches:
        time.sleep(0.5)  # each task outlasts a few of the Connect server's progress reports
        yield batch


def test_adapter_sees_the_planned_stage_finish(any_spark):
    """The session kind's own progress source (status tracker / Connect handler) reports every planned task done."""
    out = io.StringIO()
    watch = JobProgress(stage_source(any_spark), job="probe", planned_tasks=6, rows_total=600, interval=3600, out=out)
    with watch:
        n = any_spark.range(0, 600, 1, 1).repartition(6, "id").mapInArrow(_slow_identity, "id long").count()
    assert n == 600
    line = watch.line()
    assert "tasks 6/6 done" in line and "rows ~600/600 (100%)" in line, line
    assert out.getvalue() == ""  # nothing printed before the first interval


class _Counts:
    def __init__(self, rows: int) -> None:
        self.counts = {"batch_rows": rows}


def test_task_rows_files_sum_per_partition_and_a_retry_replaces_its_own(tmp_path):
    clock = [0.0]
    first = TaskRowsFile(str(tmp_path), 0, interval=1.0, clock=lambda: clock[0])
    first(_Counts(64))
    first(_Counts(128))  # within the interval: not written
    TaskRowsFile(str(tmp_path), 1)(_Counts(10))
    assert read_task_rows(str(tmp_path)) == 74
    first(_Counts(128), force=True)
    TaskRowsFile(str(tmp_path), 1)(_Counts(3))  # partition 1's retry starts over
    assert read_task_rows(str(tmp_path)) == 131
    assert read_task_rows(None) is None and read_task_rows(str(tmp_path / "gone")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]  # no temporary file left behind


def _slow_chunks(batches):
    import time

    for batch in batches:
        time.sleep(1.2)  # a chunk outlasts a heartbeat (1 s in the test session)
        yield batch


def _status_store_probe() -> None:
    """Run in a process of its own (see the test below): a fresh classic session with 1 s heartbeats, one
    single-task job of 4 slow chunks, and what the status store said while it ran, printed as JSON."""
    import json

    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    # PySpark's own worker daemon: the library's (pipeline.spark.daemon) imports torch and transformers before it
    # forks, 6 of this test's seconds, and these chunks need neither
    spark = get_session(SparkConfig(master="local[2]", app_name="status-store-probe",
                                    conf={"spark.executor.heartbeatInterval": "1s",
                                          "spark.python.daemon.module": "pyspark.daemon"}))
    source = stage_source(spark)
    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch():
        while not stop.wait(0.2):
            seen.append((source.rows_seen() or 0, sum(s.done for s in source.stages() if s.tasks == 1)))

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        # 200-byte rows: a chunk's output (200 kB) outgrows the worker's 64 kB socket buffer, so it is flushed
        # to the JVM as it is yielded (a narrow output sits in that buffer until the task ends)
        wide = spark.range(0, 4000, 1, 2).selectExpr("id", "repeat('x', 200) AS pad").repartition(1, "id")
        n = wide.mapInArrow(_slow_chunks, "id long, pad string").count()
    finally:
        stop.set()
        thread.join()
        source.close()
        spark.stop()
    print(json.dumps({"rows": n, "seen": seen}))


@pytest.mark.beside  # a Spark of its own in a subprocess
def test_classic_status_store_counts_the_chunks_a_running_task_emitted():
    """Classic: the inference node's output rows reach the driver with heartbeats, before the task ends.

    In a process of its own: the suite's shared session may have been started by another test without the
    1 s heartbeat this needs (in the whole suite it saw nothing until the task ended)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "PYSPARK_PYTHON": sys.executable, "SBI_NO_JARS": "1"}
    proc = subprocess.run([sys.executable, "-c", "import tests.spark.test_progress as t; t._status_store_probe()"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["rows"] == 4000
    inside = {rows for rows, done in result["seen"] if done == 0 and 0 < rows < 4000}
    assert inside, result["seen"]  # the single task had emitted some chunks, not all, and was still running


def test_runner_line_moves_inside_a_single_long_task(any_spark, tmp_path, tiny_embed_model):
    """One task, slow batches: a line reads rows strictly between 0 and all (both kinds).

    With one planned task the tasks-done count can only read 0 or all of the rows."""
    from pipeline.config import build_config
    from pipeline.runner import run_job

    write_delta(tmp_path / "docs", make_documents(160, with_bad_rows=False))
    config = build_config({
        "job": "slow", "model": {"path": str(tiny_embed_model), "name": "tiny-bert"},
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id",
                   "text_column": "text", "repartition": 1},
        "task": {"kind": "embed"}, "batching": {"batch_size": 8, "max_length": 256},
        "sink": {"path": str(tmp_path / "out"), "writer": "deltalake"},
        "run": {"progress": True, "progress_interval_s": 0.3, "faults": {"slow_batch_s": 0.15}},
    })
    out = io.StringIO()
    summary = run_job(config, spark=any_spark, out=out)
    assert summary.rows_out == 160
    lines = [line for line in out.getvalue().splitlines() if line.startswith("[slow]") and " rows ~" in line]
    inside = [line for line in lines if 0 < int(re.search(r"rows ~([\d,]+)/", line).group(1).replace(",", "")) < 160]
    assert inside, "\n".join(lines)
    assert "rows/s, ETA" in inside[-1]  # a rate and an ETA from the rows inside the task
