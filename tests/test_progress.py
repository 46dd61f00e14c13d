"""The driver's progress line: pure ETA math (doctests) and the adapters on both session kinds."""

from __future__ import annotations

import doctest
import io

import pyarrow as pa

import pipeline.spark.progress as progress
from pipeline.spark.progress import JobProgress, StageProgress, inference_tasks_done, progress_line, stage_source


def test_doctests():
    result = doctest.testmod(progress)
    assert result.attempted >= 5 and result.failed == 0


def test_line_moves_with_tasks_and_never_reads_zero_of_zero():
    lines = [progress_line(job="j", elapsed_s=10 * (k + 1), tasks_done=k, tasks_total=4, rows_total=1_000)
             for k in range(5)]
    assert [line.split("rows ~")[1].split("/")[0] for line in lines] == ["0", "250", "500", "750", "1,000"]
    assert "ETA 0s" in lines[-1] and "rate and ETA after the first task" in lines[0]
    assert "tasks 0/1 done" in progress_line(job="j", elapsed_s=1, tasks_done=0, tasks_total=0, rows_total=0)
    assert inference_tasks_done([StageProgress(1, 3, 3), StageProgress(2, 6, 4)], 6) == 4


def _identity(batches):
    yield from batches


def test_adapter_sees_the_planned_stage_finish(any_spark):
    """The session kind's own progress source (status tracker / Connect handler) reports every planned task done."""
    out = io.StringIO()
    watch = JobProgress(stage_source(any_spark), job="probe", planned_tasks=6, rows_total=600, interval=3600, out=out)
    with watch:
        n = any_spark.range(0, 600, 1, 1).repartition(6, "id").mapInArrow(_identity, "id long").count()
    assert n == 600
    line = watch.line()
    assert "tasks 6/6 done" in line and "rows ~600/600 (100%)" in line, line
    assert out.getvalue() == ""  # nothing printed before the first interval
