"""After a failed ``sbi_delta`` write: wait until its tasks can write no more, then take back what they left.

Spark fails a job as soon as one of its tasks fails, and the writer's abort
(:meth:`~pipeline.io.delta.writer.DeltaLakeArrowWriter.abort`) deletes the job's files right then; the
job's other tasks were only asked to stop. A task looks at the write's marker after closing its files and
takes them back itself, but a Python worker killed between its last upload and that look leaves its file
behind (Spark kills a worker that outlives its killed task by ``spark.python.task.killTimeout``). On a local
disk the next commit's sweep takes such a file; on an object store nothing would. So the driver waits until
the failed job's tasks have ended, then deletes this write's files once more (:func:`take_back_after_failure`).

How it knows the tasks ended: a classic session's status tracker counts each stage's active tasks. A Spark
Connect client has no status tracker; it waits as long as Spark takes to kill a worker (the task's monitor
looks every 2 s, then gives it ``spark.python.task.killTimeout``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from pipeline.core.sessions import JobsSince, is_connect

__all__ = ["WriteJobs", "spark_seconds", "take_back_after_failure"]

_MONITOR_POLL_S = 2.0  # how often Spark's Python task monitor looks whether its task was killed
_SETTLE_S = 0.5  # an upload whose last bytes were sent when its worker died lands within this
_MAX_WAIT_S = 60.0  # beyond the kill timeout: a task the tracker still counts after this is left to the sweeps
_TIME_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


class WriteJobs:
    """The Spark jobs one write starts: made right before the write, asked after it failed."""

    def __init__(self, spark: Any) -> None:
        self.kill_timeout_s = _kill_timeout_s(spark)
        self.jobs: JobsSince | None = None
        if is_connect(spark):
            return
        try:
            self.jobs = JobsSince(spark.sparkContext)
        except Exception:  # noqa: BLE001 - no tracker to ask: the wait is the time Spark takes to kill a task
            self.jobs = None

    def active_tasks(self) -> int:
        """Tasks still running in the stages of the jobs started since this value was made."""
        return sum(stage.numActiveTasks for stage in self.jobs.stages()) if self.jobs is not None else 0

    def wait_until_ended(self) -> bool:
        """Wait until the write's tasks have ended (the tracker), or until Spark has killed them (Connect);
        False when some task was still counted as running at the deadline."""
        if self.jobs is None:
            time.sleep(_MONITOR_POLL_S + self.kill_timeout_s + _SETTLE_S)
            return True
        deadline = time.monotonic() + _MONITOR_POLL_S + self.kill_timeout_s + _MAX_WAIT_S
        while self.active_tasks():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        time.sleep(_SETTLE_S)
        return True


def take_back_after_failure(jobs: WriteJobs, store: Any, write_id: str) -> bool | None:
    """After write ``write_id`` failed: when its job was aborted (its marker says so: no commit was tried, so
    none of its files is in any version), wait for its tasks (:meth:`WriteJobs.wait_until_ended`) and delete
    every file of it left in the table at ``store``. None when the job was not aborted (a failed commit
    cleaned up after itself: :class:`~pipeline.io.delta.commit.DeltaCommit`); False when a task outlived the
    wait (what it writes later, a sweep on a local disk takes)."""
    from pipeline.io.delta import markers
    from pipeline.io.delta.files import sweep_orphans

    if not markers.finished_facts(store, write_id).get("aborted"):
        return None
    ended = jobs.wait_until_ended()
    sweep_orphans(store, write_id, keep=set())
    return ended


def _kill_timeout_s(spark: Any) -> float:
    """``spark.python.task.killTimeout`` in seconds (Spark's default, 2 s, when the session will not say)."""
    try:
        return spark_seconds(str(spark.conf.get("spark.python.task.killTimeout", "2s")))
    except Exception:  # noqa: BLE001 - a server that will not say, a value Spark would refuse too
        return 2.0


def spark_seconds(text: str) -> float:
    """A Spark time setting in seconds (a bare number is seconds, as Spark reads this one).

    >>> spark_seconds("2s"), spark_seconds("500ms"), spark_seconds(" 3 "), spark_seconds("1min")
    (2.0, 0.5, 3.0, 60.0)
    """
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min|m|h)?", text.strip().lower())
    if match is None:
        raise ValueError(f"not a Spark time setting: {text!r}")
    return float(match.group(1)) * _TIME_UNITS[match.group(2) or "s"]
