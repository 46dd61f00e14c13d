"""The progress line's arithmetic, pure: rows done, rate and ETA from tasks done and rows seen.

The driver's printing thread and the session adapters that feed it live in
:mod:`pipeline.spark.progress`, which re-exports these names. Here only plain
numbers and :class:`StageProgress` values go in and out, so every rule (tasks
done never contradict the rows seen; never "tasks 0/0"; a slow job is not
"0 rows/s") is a doctest.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["StageProgress", "format_duration", "inference_tasks_done", "metric_count", "progress_line", "rows_done"]


@dataclass(frozen=True)
class StageProgress:
    """One stage's task count and tasks done, as a session kind reports them."""

    stage_id: int
    tasks: int
    done: int


def format_duration(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``: short enough for a progress line.

    >>> format_duration(42.4), format_duration(185), format_duration(3725)
    ('42s', '3m05s', '1h02m')
    """
    s = int(round(max(seconds, 0)))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def rows_done(*, tasks_done: int, tasks_total: int, rows_total: int, rows_seen: int | None = None) -> int:
    """Rows done: the rows the session kind saw (finished and running tasks), else finished tasks x planned
    rows per task.

    The rows seen win where there are any: they count finished tasks too, and
    "tasks done" is a guess at which stage is the inference (with one planned
    task, any one-task stage such as the source scan looks like it).

    >>> rows_done(tasks_done=1, tasks_total=4, rows_total=1_000)
    250
    >>> rows_done(tasks_done=1, tasks_total=4, rows_total=1_000, rows_seen=420)
    420
    >>> rows_done(tasks_done=1, tasks_total=1, rows_total=1_000, rows_seen=96)
    96
    >>> rows_done(tasks_done=0, tasks_total=1, rows_total=1_000, rows_seen=5_000)  # never past the total
    1000
    """
    if rows_seen is not None:
        return min(max(rows_seen, 0), rows_total)
    tasks_total = max(tasks_total, 1)
    tasks_done = min(max(tasks_done, 0), tasks_total)
    return round(rows_total * tasks_done / tasks_total)


def progress_line(*, job: str, elapsed_s: float, tasks_done: int, tasks_total: int, rows_total: int,
                  rows_seen: int | None = None, reused_tasks: int = 0) -> str:
    """One progress line: rows done (:func:`rows_done`), rows/s and an ETA; a rerun of a killed run
    says how many tasks an earlier try finished (reused from their staged output, never scored again).

    >>> progress_line(job="score", elapsed_s=5, tasks_done=0, tasks_total=8, rows_total=40_000)
    '[score]      5s  rows ~0/40,000 (0%), tasks 0/8 done, rate and ETA after the first rows'
    >>> progress_line(job="score", elapsed_s=60, tasks_done=2, tasks_total=8, rows_total=40_000)
    '[score]     60s  rows ~10,000/40,000 (25%), tasks 2/8 done, 167 rows/s, ETA 3m00s'
    >>> progress_line(job="score", elapsed_s=30, tasks_done=0, tasks_total=8, rows_total=40_000, rows_seen=6_000)
    '[score]     30s  rows ~6,000/40,000 (15%), tasks 0/8 done, 200 rows/s, ETA 2m50s'
    >>> progress_line(job="score", elapsed_s=240, tasks_done=9, tasks_total=8, rows_total=40_000)
    '[score]    240s  rows ~40,000/40,000 (100%), tasks 8/8 done, 167 rows/s, ETA 0s'
    >>> progress_line(job="score", elapsed_s=5, tasks_done=3, tasks_total=8, rows_total=40_000, reused_tasks=3)
    '[score]      5s  rows ~15,000/40,000 (38%), tasks 3/8 done (3 reused from an earlier try), 3,000 rows/s, ETA 8s'

    Tasks done never contradict the rows the tasks report: a finished source scan with as many tasks as
    planned looks like the inference stage, but no row is done yet.

    >>> progress_line(job="score", elapsed_s=64, tasks_done=2, tasks_total=2, rows_total=30, rows_seen=0)
    '[score]     64s  rows ~0/30 (0%), tasks 0/2 done, rate and ETA after the first rows'
    >>> progress_line(job="ocr", elapsed_s=75, tasks_done=1, tasks_total=2, rows_total=30, rows_seen=13)
    '[ocr]     75s  rows ~13/30 (43%), tasks 1/2 done, 0.17 rows/s, ETA 1m38s'
    """
    tasks_total = max(tasks_total, 1)
    tasks_done = min(max(tasks_done, 0), tasks_total)
    if rows_seen is not None and rows_total > 0:
        tasks_done = min(tasks_done, math.ceil(tasks_total * min(max(rows_seen, 0), rows_total) / rows_total))
    done = rows_done(tasks_done=tasks_done, tasks_total=tasks_total, rows_total=rows_total, rows_seen=rows_seen)
    pct = 100 * done / rows_total if rows_total else 100.0
    head = (f"[{job}] {elapsed_s:6.0f}s  rows ~{done:,}/{rows_total:,} ({pct:.0f}%), "
            f"tasks {tasks_done}/{tasks_total} done")
    if reused_tasks:
        head += f" ({reused_tasks} reused from an earlier try)"
    if done == 0 or elapsed_s <= 0:
        return head + ", rate and ETA after the first rows"
    rate = done / elapsed_s
    shown = f"{rate:,.0f}" if rate >= 10 else f"{rate:.2g}"  # a slow job (images, generation) is not 0 rows/s
    return head + f", {shown} rows/s, ETA {format_duration((rows_total - done) / rate)}"


def inference_tasks_done(stages: list[StageProgress], planned_tasks: int) -> int:
    """Finished tasks of the inference stage: the most advanced stage with exactly the planned task count.

    The runner's ``repartition(planned_tasks, "id")`` makes that stage; the
    source scan and the shuffle's map side have other task counts. With
    adaptive execution, later jobs list the same stage again as skipped
    (nothing done), hence the most advanced, not the latest.

    >>> inference_tasks_done([StageProgress(0, 1, 1), StageProgress(3, 8, 0), StageProgress(2, 8, 5)], 8)
    5
    >>> inference_tasks_done([StageProgress(0, 1, 0)], 8)
    0
    """
    return max((s.done for s in stages if s.tasks == planned_tasks), default=0)


def metric_count(text: str | None) -> int:
    """The count in a SQL metric's text as the status store formats it (``7,000``; a total first).

    >>> metric_count("7,000"), metric_count("12,345 (1, 2, 3)"), metric_count(None), metric_count("")
    (7000, 12345, 0, 0)
    """
    match = re.match(r"\s*([\d,]+)", text or "")
    return int(match.group(1).replace(",", "")) if match else 0
