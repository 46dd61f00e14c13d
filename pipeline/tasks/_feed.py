"""Keep the model busy: a text task's batches on one device thread while this thread does the CPU side.

A Spark task hands its Python worker Arrow chunks one at a time. Inline, the
worker reads and tokenises a chunk, runs its batches, builds its columns and
only then reads the next one, so the model waits through all of the CPU side.
:func:`overlapped` splits each chunk's work in three: ``prepare`` (Arrow to
Python, statuses, tokenising, the batch plan) and ``finish`` (statuses, result
columns, Arrow) stay on the calling thread, and ``run`` (collate, forward,
scatter, with its out-of-memory splits and poison bisection) goes to one
device thread. While the device runs chunk k, this thread prepares chunk k+1
and finishes chunk k-1. A forward pass releases the GIL (torch kernels, a CUDA
wait, the bench's simulated device), so the two really run at once.

Memory is bounded: at most ``ahead`` chunks are prepared beyond the one the
device runs, and one finished chunk is held while Spark takes it, so a task
holds ``ahead + 2`` chunks at most whatever its length. The batches are the
inline worker's, run in the same order on one thread, so every result and
every count is the inline worker's too (``tests/run/test_feed.py``).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, TypeVar

__all__ = ["LockedCounts", "overlapped"]

C = TypeVar("C")
W = TypeVar("W")
R = TypeVar("R")


def overlapped(
    chunks: Iterable[C], *, prepare: Callable[[C], W], run: Callable[[W], None], finish: Callable[[W], R],
    ahead: int = 1,
) -> Iterator[R]:
    """``finish(work)`` after ``run(work)`` for ``work = prepare(chunk)`` of each chunk, in input order.

    ``run`` executes on one device thread, in chunk order; ``prepare`` and
    ``finish`` on the caller's. An exception from any of them stops the stream
    and is raised here; chunks not yet started on the device are dropped.

    >>> list(overlapped(range(4), prepare=lambda c: [c], run=lambda w: w.append(w[0] * 10), finish=tuple))
    [(0, 0), (1, 10), (2, 20), (3, 30)]
    """
    if ahead < 1:
        raise ValueError(f"ahead={ahead}: at least 1 chunk must be prepared ahead to overlap; 0 is the inline worker")
    pending: deque[tuple[W, Future[None]]] = deque()
    device = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sbi-device")
    try:
        for chunk in chunks:
            work = prepare(chunk)
            pending.append((work, device.submit(run, work)))
            while len(pending) > ahead:
                done, future = pending.popleft()
                future.result()
                yield finish(done)
        while pending:
            done, future = pending.popleft()
            future.result()
            yield finish(done)
    finally:
        # on an error or an early close: the running batch completes, queued chunks never start
        device.shutdown(wait=True, cancel_futures=True)


class LockedCounts:
    """A :class:`~pipeline.core.metrics.WorkerCounts` shared by the device thread and the caller's, one update at a
    time."""

    def __init__(self, counts: Any) -> None:
        self._counts = counts
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._counts, name)
        if name in ("add", "add_batch", "record_batch", "add_status", "merge") and callable(value):
            def locked(*args: Any, **kwargs: Any) -> Any:
                with self._lock:
                    return value(*args, **kwargs)
            return locked
        return value
