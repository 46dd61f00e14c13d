"""A scheduler's stop (SIGTERM) ends a run cleanly: no new work, the running Spark jobs cancelled, the run
recorded as ``stopped``, its staged tasks left for a rerun, and one line saying so.

Without a handler Python dies at once on SIGTERM, and the driver's last words are the JVM's stack trace of
the lost connection. Raising from the handler is no better: it lands inside py4j's read of the answer to
the Spark call in progress and breaks the gateway. So the handler only records the stop and cancels the
session's jobs from a thread of its own (its own py4j connection); the running action then ends as Spark
reports a cancelled job, and the run raises :class:`~pipeline.errors.RunStopped` at the next stage boundary
(:meth:`StopRequest.check`) or where the cancelled job surfaces. A second SIGTERM is not caught: the process
ends at once, as the scheduler meant.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from pipeline.errors import RunStopped

__all__ = ["StopRequest", "stop_on_sigterm"]


def _cancel(spark: Any) -> None:
    """Cancel every running Spark job of ``spark`` (classic or Connect); best effort."""
    from pipeline.core.sessions import is_connect

    try:
        if is_connect(spark):
            spark.interruptAll()
        else:
            spark.sparkContext.cancelAllJobs()
    except Exception:  # noqa: BLE001 - the session may be going down with us
        pass


class StopRequest:
    """Whether a stop was asked for; :meth:`check` raises :class:`RunStopped` once it was."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None

    def check(self) -> None:
        if self.signal is not None:
            raise RunStopped(f"stopped by {self.signal}")


@contextmanager
def stop_on_sigterm(session: Callable[[], Any], *, cancel_jobs: bool = True) -> Iterator[StopRequest]:
    """While the block runs, SIGTERM marks the returned :class:`StopRequest` and cancels the jobs of
    ``session()`` (the run's session, once it has one). ``cancel_jobs`` False: only marks it (a streaming job
    lets its running micro-batch finish its commits, then stops). Outside the main thread (a notebook's worker
    thread, a test's thread) nothing is installed: only the main thread may handle signals."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, previous if callable(previous) else signal.SIG_DFL)  # a second one ends it
        stop.signal = "SIGTERM"
        spark = session() if cancel_jobs else None
        if spark is not None:
            threading.Thread(target=_cancel, args=(spark,), name="sbi-stop", daemon=True).start()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield stop
    finally:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, previous)
