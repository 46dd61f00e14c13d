"""The driver's progress line, the same on classic and Spark Connect sessions.

Each session kind tells the driver how many tasks of each stage are done, in
its own way: a classic session through ``sparkContext.statusTracker()``, a
Connect session through the progress handler PySpark 4 calls with every
progress message of a running query (``spark.registerProgressHandler``). Both
are adapted to one tiny interface, :class:`StageSource` (``stages()``: the
``(stage id, tasks, tasks done)`` seen so far), and one printing thread reads
it.

The runner plans the inference tasks itself (``pipeline.spark.planning``), so it
knows their number and the rows each holds: rows done are estimated as
finished inference tasks x planned rows per task, which moves as tasks finish
and never reads "tasks 0/0". The arithmetic is :func:`progress_line`, pure.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TextIO

__all__ = ["JobProgress", "StageProgress", "StageSource", "format_duration", "inference_tasks_done",
           "progress_line", "stage_source"]


@dataclass(frozen=True)
class StageProgress:
    stage_id: int
    tasks: int
    done: int


class StageSource(Protocol):
    """What a session kind offers: the stages of the running job(s) seen so far, and a way to let go."""

    def stages(self) -> list[StageProgress]: ...

    def close(self) -> None: ...


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


def progress_line(*, job: str, elapsed_s: float, tasks_done: int, tasks_total: int, rows_total: int) -> str:
    """One progress line: rows done (finished tasks x planned rows per task), rows/s and an ETA.

    >>> progress_line(job="score", elapsed_s=5, tasks_done=0, tasks_total=8, rows_total=40_000)
    '[score]      5s  rows ~0/40,000 (0%), tasks 0/8 done, rate and ETA after the first task'
    >>> progress_line(job="score", elapsed_s=60, tasks_done=2, tasks_total=8, rows_total=40_000)
    '[score]     60s  rows ~10,000/40,000 (25%), tasks 2/8 done, 167 rows/s, ETA 3m00s'
    >>> progress_line(job="score", elapsed_s=240, tasks_done=9, tasks_total=8, rows_total=40_000)
    '[score]    240s  rows ~40,000/40,000 (100%), tasks 8/8 done, 167 rows/s, ETA 0s'
    """
    tasks_total = max(tasks_total, 1)
    tasks_done = min(max(tasks_done, 0), tasks_total)
    rows_done = round(rows_total * tasks_done / tasks_total)
    pct = 100 * rows_done / rows_total if rows_total else 100.0
    head = (f"[{job}] {elapsed_s:6.0f}s  rows ~{rows_done:,}/{rows_total:,} ({pct:.0f}%), "
            f"tasks {tasks_done}/{tasks_total} done")
    if rows_done == 0 or elapsed_s <= 0:
        return head + ", rate and ETA after the first task"
    rate = rows_done / elapsed_s
    return head + f", {rate:,.0f} rows/s, ETA {format_duration((rows_total - rows_done) / rate)}"


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


class _StatusTrackerSource:
    """Classic sessions: the stages of the jobs this thread's job group starts from now on.

    Read through ``sparkContext.statusTracker()``, which keeps finished jobs
    and stages too, so a stage shorter than the print interval still counts.
    """

    def __init__(self, spark: Any) -> None:
        sc = spark.sparkContext
        self.tracker = sc.statusTracker()
        self.group = sc.getLocalProperty("spark.jobGroup.id")  # the caller's thread; None when ungrouped
        self.before = set(self.tracker.getJobIdsForGroup(self.group))

    def stages(self) -> list[StageProgress]:
        out = []
        for job in sorted(set(self.tracker.getJobIdsForGroup(self.group)) - self.before):
            info = self.tracker.getJobInfo(job)
            for stage_id in info.stageIds if info is not None else ():
                stage = self.tracker.getStageInfo(stage_id)
                if stage is not None:
                    out.append(StageProgress(stage_id, stage.numTasks, stage.numCompletedTasks))
        return out

    def close(self) -> None:
        pass


class _ConnectHandlerSource:
    """Connect sessions: the stages the server reported last, through ``spark.registerProgressHandler``."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.latest: dict[int, StageProgress] = {}
        self.lock = threading.Lock()
        spark.registerProgressHandler(self._on_progress)

    def _on_progress(self, stages: Any = (), inflight_tasks: int = 0, done: bool = False, **_: Any) -> None:
        with self.lock:
            for s in stages or ():
                self.latest[s.stage_id] = StageProgress(s.stage_id, s.num_tasks, s.num_completed_tasks)
            if done:
                # The server samples progress (spark.connect.progress.reportInterval), so the last report
                # may predate the last tasks; the query has ended, and a failed one raises in the caller.
                self.latest = {k: StageProgress(k, s.tasks, s.tasks) for k, s in self.latest.items()}

    def stages(self) -> list[StageProgress]:
        with self.lock:
            return sorted(self.latest.values(), key=lambda s: s.stage_id)

    def close(self) -> None:
        try:
            self.spark.removeProgressHandler(self._on_progress)
        except Exception:  # noqa: BLE001 - the session may already be gone
            pass


def stage_source(spark: Any) -> StageSource:
    """The adapter for ``spark``'s kind: the progress handler on Connect, the status tracker on classic."""
    from pipeline.spark.session import is_connect

    return _ConnectHandlerSource(spark) if is_connect(spark) else _StatusTrackerSource(spark)


class JobProgress(threading.Thread):
    """Prints :func:`progress_line` every ``interval`` seconds while the inference stage runs.

    Use as a context manager around the write that runs inference::

        with JobProgress(stage_source(spark), job="score", planned_tasks=8, rows_total=40_000):
            write_sink(...)
    """

    def __init__(self, source: StageSource, *, job: str, planned_tasks: int, rows_total: int,
                 interval: float = 10.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(daemon=True, name=f"progress-{job}")
        self.source, self.job, self.planned_tasks, self.rows_total = source, job, planned_tasks, rows_total
        self.interval, self.out, self.clock = interval, out if out is not None else sys.stdout, clock
        self.halt = threading.Event()
        self.started_at = clock()
        self.lines: list[str] = []

    def line(self) -> str:
        done = inference_tasks_done(self.source.stages(), self.planned_tasks)
        return progress_line(job=self.job, elapsed_s=self.clock() - self.started_at, tasks_done=done,
                             tasks_total=self.planned_tasks, rows_total=self.rows_total)

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            try:
                text = self.line()
            except Exception:  # noqa: BLE001 - progress is informative; never fail the job for it
                continue
            self.lines.append(text)
            print(text, file=self.out, flush=True)

    def __enter__(self) -> "JobProgress":
        self.started_at = self.clock()
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.halt.set()
        self.join(timeout=5)
        self.source.close()
