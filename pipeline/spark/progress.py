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

The arithmetic is :func:`progress_line`, pure, in :mod:`pipeline.spark.progress_math`
(its names are importable from here too).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Protocol, TextIO

from pipeline.spark.progress_math import (StageProgress, format_duration, inference_tasks_done, metric_count,
                                          progress_line, rows_done)

__all__ = ["JobProgress", "StageProgress", "StageSource", "TaskRowsFile", "format_duration", "inference_tasks_done",
           "metric_count", "progress_line", "read_task_rows", "rows_done", "rows_folder", "stage_source"]


class StageSource(Protocol):
    """What a session kind offers: the stages of the running job(s) seen so far, rows done inside running
    tasks where it can tell (None where it cannot), and a way to let go."""

    def stages(self) -> list[StageProgress]: ...

    def rows_seen(self) -> int | None: ...

    def close(self) -> None: ...


class TaskRowsFile:
    """Worker side: this task's rows done, written to ``<folder>/<partition>`` at most every ``interval`` s.

    Called with the task's :class:`~pipeline.core.metrics.WorkerCounts` after every
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
    from pipeline.core.sessions import is_connect

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
        from pipeline.core.sessions import JobsSince

        self.jobs = JobsSince(spark.sparkContext)
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
        return [StageProgress(stage.stageId, stage.numTasks, stage.numCompletedTasks) for stage in self.jobs.stages()]

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
    from pipeline.core.sessions import is_connect

    return (_ConnectHandlerSource(spark, rows_dir) if is_connect(spark)
            else _StatusTrackerSource(spark, rows_dir))


class JobProgress(threading.Thread):
    """Prints :func:`progress_line` every ``interval`` seconds while the inference stage runs.

    Use as a context manager around the write that runs inference::

        with JobProgress(stage_source(spark), job="score", planned_tasks=8, rows_total=40_000):
            write_sink(...)

    ``emit(line, fields)`` replaces the print (a run's log: :meth:`pipeline.core.logs.RunLog.progress`); ``fields``
    are the numbers behind the line (``tasks_done``, ``tasks``, ``rows``, ``seconds``).
    """

    def __init__(self, source: StageSource, *, job: str, planned_tasks: int, rows_total: int,
                 interval: float = 10.0, out: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter, reused_tasks: int = 0,
                 emit: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        super().__init__(daemon=True, name=f"progress-{job}")
        self.source, self.job, self.planned_tasks, self.rows_total = source, job, planned_tasks, rows_total
        self.interval, self.out, self.clock = interval, out if out is not None else sys.stdout, clock
        self.emit = emit
        self.reused_tasks = reused_tasks  # tasks an earlier try staged: replayed, not scored
        self.halt = threading.Event()
        self.started_at = clock()
        self.lines: list[str] = []
        self.fields: dict[str, Any] = {}

    def line(self) -> str:
        done = inference_tasks_done(self.source.stages(), self.planned_tasks)
        try:
            seen = self.source.rows_seen()
        except Exception:  # noqa: BLE001 - rows inside tasks are a refinement; tasks done still count
            seen = None
        elapsed = self.clock() - self.started_at
        self.fields = {"tasks_done": done, "tasks": self.planned_tasks, "rows": self.rows_total,
                       "rows_seen": seen, "seconds": round(elapsed, 1)}
        return progress_line(job=self.job, elapsed_s=elapsed, tasks_done=done,
                             tasks_total=self.planned_tasks, rows_total=self.rows_total, rows_seen=seen,
                             reused_tasks=self.reused_tasks)

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            try:
                text = self.line()
            except Exception:  # noqa: BLE001 - progress is informative; never fail the job for it
                continue
            self.lines.append(text)
            if self.emit is not None:
                self.emit(text, dict(self.fields))
            else:
                print(text, file=self.out, flush=True)

    def __enter__(self) -> "JobProgress":
        self.started_at = self.clock()
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.halt.set()
        self.join(timeout=5)
        self.source.close()
