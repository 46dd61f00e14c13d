"""The driver's progress line, the same on classic and Spark Connect sessions.

Each session kind tells the driver how many tasks of each stage are done, in
its own way: a classic session through ``sparkContext.statusTracker()``, a
Connect session through the progress handler PySpark 4 calls with every
progress message of a running query (``spark.registerProgressHandler``). Both
are adapted to one tiny interface, :class:`StageSource` (``stages()``: the
``(stage id, tasks, tasks done)`` seen so far), and one printing thread reads
it.

The runner plans the inference tasks itself (``pipeline.spark.planning``), so it
knows their number and the rows each holds: rows done are at least finished
inference tasks x planned rows per task, which never reads "tasks 0/0".

Inside a running task (one 10,000-row task per core sits minutes on a CPU)
the rows move from two sources, whichever is further (``rows_seen()``):

* classic sessions: the inference node's live "number of output rows" in the
  SQL status store, which executor heartbeats (``spark.executor.heartbeatInterval``,
  10 s by default) fill for running tasks. It moves per Arrow chunk a task
  emits: not at all inside a task that is one chunk
  (``spark.arrow_max_records_per_batch`` >= rows per task).
* either kind, driver and workers on one machine (a local master; a Connect
  server on this host): each task's Python worker writes its rows done into a
  folder the driver reads (:class:`TaskRowsFile`), every batch at most once a
  second. Spark Connect reports nothing else inside a task: its progress
  handler counts tasks and input bytes at task end only.

The arithmetic is :func:`progress_line`, pure.
"""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TextIO

__all__ = ["JobProgress", "StageProgress", "StageSource", "TaskRowsFile", "format_duration", "inference_tasks_done",
           "metric_count", "progress_line", "read_task_rows", "rows_done", "rows_folder", "stage_source"]


@dataclass(frozen=True)
class StageProgress:
    stage_id: int
    tasks: int
    done: int


class StageSource(Protocol):
    """What a session kind offers: the stages of the running job(s) seen so far, rows done inside running
    tasks where it can tell (None where it cannot), and a way to let go."""

    def stages(self) -> list[StageProgress]: ...

    def rows_seen(self) -> int | None: ...

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


class TaskRowsFile:
    """Worker side: this task's rows done, written to ``<folder>/<partition>`` at most every ``interval`` s.

    Called with the task's :class:`~pipeline.metrics.WorkerCounts` after every
    batch (``force=True`` at the task's end). The file is replaced atomically,
    so the driver reads a whole number or none; a retried task overwrites its
    partition's. Failures to write are ignored: progress never fails a task.
    """

    def __init__(self, folder: str, partition: int, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.join(folder, str(partition))
        self.interval, self.clock = interval, clock
        self.last = float("-inf")

    def __call__(self, counts: Any, *, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        c = counts.counts
        rows = int(c.get("progress_rows", c.get("batch_rows", 0)))  # as the worker's own line counts them
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(str(rows))
            os.replace(tmp, self.path)
        except OSError:
            pass


def read_task_rows(folder: str | None) -> int | None:
    """Driver side: the rows done that the tasks' :class:`TaskRowsFile` wrote, summed; None without a folder."""
    if not folder:
        return None
    total = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if name.isdigit():
            try:
                with open(os.path.join(folder, name)) as f:
                    total += int(f.read().strip() or 0)
            except (OSError, ValueError):
                continue
    return total


def rows_folder(spark: Any) -> str | None:
    """A fresh folder for :class:`TaskRowsFile` when ``spark``'s workers share this machine, else None.

    Classic: a ``local`` master. Connect: a server on this host's loopback
    address whose master is ``local``. On a cluster the workers' disks are not
    the driver's, so no folder (classic still has the status store's rows).
    """
    from pipeline.sessions import is_connect

    try:
        if is_connect(spark):
            host = str(spark.client._builder.host).strip("[]")
            if host not in ("127.0.0.1", "localhost", "::1"):
                return None
            master = spark.conf.get("spark.master", "")
        else:
            master = spark.sparkContext.master
    except Exception:  # noqa: BLE001 - without a folder the line still moves as tasks end
        return None
    if not str(master).startswith("local"):
        return None
    return tempfile.mkdtemp(prefix="sbi-progress-")


class _StatusTrackerSource:
    """Classic sessions: the stages of the jobs this thread's job group starts from now on.

    Read through ``sparkContext.statusTracker()``, which keeps finished jobs
    and stages too, so a stage shorter than the print interval still counts.
    Rows inside running tasks: the ``MapInArrow`` nodes' live "number of output
    rows" in the SQL status store, over the SQL executions started from now on.
    """

    def __init__(self, spark: Any, rows_dir: str | None = None) -> None:
        sc = spark.sparkContext
        self.tracker = sc.statusTracker()
        self.group = sc.getLocalProperty("spark.jobGroup.id")  # the caller's thread; None when ungrouped
        self.before = set(self.tracker.getJobIdsForGroup(self.group))
        self.rows_dir = rows_dir
        try:
            self.sql = spark._jsparkSession.sharedState().statusStore()
            self.first_execution = self._last_execution_id() + 1
        except Exception:  # noqa: BLE001 - a JVM that hides its SQL status store: finished tasks still count
            self.sql = None

    def _last_execution_id(self) -> int:
        n = self.sql.executionsCount()
        return self.sql.executionsList(n - 1, 1).apply(0).executionId() if n else -1

    def _output_rows(self) -> int:
        """The most rows a ``MapInArrow`` node of a SQL execution started since has emitted, tasks running or not."""
        best = 0
        n = self.sql.executionsCount()
        executions = self.sql.executionsList(max(n - 20, 0), 20)
        for i in range(executions.size()):
            execution_id = executions.apply(i).executionId()
            if execution_id < self.first_execution:
                continue
            values = self.sql.executionMetrics(execution_id)
            nodes = self.sql.planGraph(execution_id).allNodes()
            for k in range(nodes.size()):
                node = nodes.apply(k)
                if "MapInArrow" not in node.name():
                    continue
                metrics = node.metrics()
                for m in range(metrics.size()):
                    metric = metrics.apply(m)
                    if metric.name() == "number of output rows":
                        value = values.get(metric.accumulatorId())
                        best = max(best, metric_count(value.get() if value.isDefined() else None))
        return best

    def rows_seen(self) -> int | None:
        from_workers = read_task_rows(self.rows_dir)
        if self.sql is None:
            return from_workers
        return max(self._output_rows(), from_workers or 0)

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

    def __init__(self, spark: Any, rows_dir: str | None = None) -> None:
        self.spark, self.rows_dir = spark, rows_dir
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

    def rows_seen(self) -> int | None:
        # the server's reports move at task end only (tasks done; input bytes of finished tasks)
        return read_task_rows(self.rows_dir)

    def close(self) -> None:
        _remove(self.rows_dir)
        try:
            self.spark.removeProgressHandler(self._on_progress)
        except Exception:  # noqa: BLE001 - the session may already be gone
            pass


def _remove(folder: str | None) -> None:
    """Drop a :func:`rows_folder` once the inference stage is over (a late writer's error is ignored there)."""
    if folder:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def stage_source(spark: Any, *, rows_dir: str | None = None) -> StageSource:
    """The adapter for ``spark``'s kind: the progress handler on Connect, the status tracker on classic.

    ``rows_dir``: the :func:`rows_folder` the inference tasks write their rows done to, if any.
    """
    from pipeline.sessions import is_connect

    return (_ConnectHandlerSource(spark, rows_dir) if is_connect(spark)
            else _StatusTrackerSource(spark, rows_dir))


class JobProgress(threading.Thread):
    """Prints :func:`progress_line` every ``interval`` seconds while the inference stage runs.

    Use as a context manager around the write that runs inference::

        with JobProgress(stage_source(spark), job="score", planned_tasks=8, rows_total=40_000):
            write_sink(...)
    """

    def __init__(self, source: StageSource, *, job: str, planned_tasks: int, rows_total: int,
                 interval: float = 10.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter, reused_tasks: int = 0) -> None:
        super().__init__(daemon=True, name=f"progress-{job}")
        self.source, self.job, self.planned_tasks, self.rows_total = source, job, planned_tasks, rows_total
        self.interval, self.out, self.clock = interval, out if out is not None else sys.stdout, clock
        self.reused_tasks = reused_tasks  # tasks an earlier try staged: replayed, not scored
        self.halt = threading.Event()
        self.started_at = clock()
        self.lines: list[str] = []

    def line(self) -> str:
        done = inference_tasks_done(self.source.stages(), self.planned_tasks)
        try:
            seen = self.source.rows_seen()
        except Exception:  # noqa: BLE001 - rows inside tasks are a refinement; tasks done still count
            seen = None
        return progress_line(job=self.job, elapsed_s=self.clock() - self.started_at, tasks_done=done,
                             tasks_total=self.planned_tasks, rows_total=self.rows_total, rows_seen=seen,
                             reused_tasks=self.reused_tasks)

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
