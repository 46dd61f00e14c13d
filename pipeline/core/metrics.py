"""Counters collected on the executors, merged on the driver, and the per-batch metrics made of them.

Executors count into a plain nested dict of numbers (rows, tokens, padded
tokens, batches, seconds, model loads and rows per worker, batch-size
histogram); each task hands its dict to the driver inside the data it emits,
and the driver merges them with :func:`merge_counts`
(``pipeline.spark.run_metrics``). Pure Python: no pyspark import.

Per-batch metrics stay small at any row count: each batch adds to a histogram
by padded length, to its worker's timeline (1-second buckets, doubled while a
task's timeline grows past ``TIMELINE_TASK_POINTS``), and competes for one of
the task's ``SLOWEST_PER_TASK`` slowest-batch slots. Every leaf is a number, so
the counts stay a plain JSON-able dict that :func:`merge_counts` adds up;
:func:`batch_metrics` turns them into what the runs table and the report keep.
The end-of-run summary built from the merged counts is :mod:`pipeline.core.run_summary`;
their typed reading on the driver is :mod:`pipeline.core.run_counts`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Mapping

from pipeline.core.run_counts import WORK_KEYS

__all__ = ["StageClock", "WorkerCounts", "WorkerProgress", "batch_metrics", "merge_counts", "reused_counts"]

Counts = dict[str, Any]

# per-batch metrics: a task's timeline starts at 1-second buckets and doubles them past
# TIMELINE_TASK_POINTS; a run keeps at most TIMELINE_POINTS per worker; slowest batches per task and run
TIMELINE_BUCKET_S = 1
TIMELINE_TASK_POINTS = 240
TIMELINE_POINTS = 120
SLOWEST_PER_TASK = 5
SLOWEST_PER_RUN = 20


def merge_counts(into: Counts, other: Mapping[str, Any]) -> Counts:
    """Add ``other`` into ``into`` key by key (numbers sum, dicts merge recursively, lists of numbers of one
    length add element by element: a sum of vectors); returns ``into``.

    >>> merge_counts({"rows": 1, "vec": {"sum": [1.0, 2.0]}}, {"rows": 2, "vec": {"sum": [0.5, 0.5]}})
    {'rows': 3, 'vec': {'sum': [1.5, 2.5]}}
    """
    for key, value in other.items():
        if isinstance(value, Mapping):
            merge_counts(into.setdefault(key, {}), value)
        elif isinstance(value, list):
            mine = into.get(key)
            if mine is None:
                into[key] = list(value)
            elif len(mine) != len(value):
                raise ValueError(f"cannot add counts {key!r}: a list of {len(value)} numbers to one of {len(mine)}")
            else:
                into[key] = [a + b for a, b in zip(mine, value)]
        else:
            into[key] = into.get(key, 0) + value
    return into


class WorkerCounts:
    """What one Python worker counts while it scores one Spark task's chunks.

    ``on_batch(counts)`` is called after every batch (the worker's progress line hangs there).
    """

    def __init__(self, on_batch: Callable[["WorkerCounts"], None] | None = None, *, worker: str = "worker",
                 task: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self.counts: Counts = {}
        self.on_batch = on_batch
        self.worker, self._clock = worker, clock
        # key prefix of this task's slowest batches: unique even when a worker reruns a partition
        self._slow_prefix = f"{worker}|{task if task is not None else '-'}|{uuid.uuid4().hex[:6]}"
        self._slowest: list[tuple[float, str, dict[str, float]]] = []
        self._seq = 0
        self._bucket = TIMELINE_BUCKET_S

    def add(self, name: str, value: float = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + value

    def add_batch(self, *, rows: int, tokens: int, padded_tokens: int, padded_length: int | None = None,
                  seconds: float | None = None) -> None:
        self.add("batches")
        self.add("tokens", tokens)
        self.add("padded_tokens", padded_tokens)
        sizes = self.counts.setdefault("batch_sizes", {})
        sizes[str(rows)] = sizes.get(str(rows), 0) + 1
        self.add("batch_rows", rows)
        if seconds is not None:
            self.record_batch(rows=rows, tokens=tokens, padded_tokens=padded_tokens,
                              padded_length=padded_length, seconds=seconds)
        if self.on_batch is not None:
            self.on_batch(self)

    def record_batch(self, *, rows: int, tokens: int, padded_tokens: int, seconds: float,
                     padded_length: int | None = None) -> None:
        """Per-batch metrics (no totals): length histogram, worker timeline, this task's slowest batches.

        The volume is bounded by the number of distinct padded lengths, the run's
        duration and ``SLOWEST_PER_TASK``, never by the number of rows.
        """
        length = int(padded_length if padded_length is not None else (padded_tokens // rows if rows else 0))
        values = {"batches": 1, "rows": rows, "tokens": tokens, "padded_tokens": padded_tokens, "seconds": seconds}
        merge_counts(self.counts.setdefault("by_length", {}), {str(length): values})
        now = self._clock()
        timeline = self.counts.setdefault("timeline", {}).setdefault(self.worker, {})
        bucket = str(int(now // self._bucket) * self._bucket)
        merge_counts(timeline, {bucket: {"rows": rows, "tokens": tokens, "seconds": seconds}})
        if len(timeline) > TIMELINE_TASK_POINTS:  # a long task: coarser buckets, same totals
            self._bucket *= 2
            coarser: Counts = {}
            for start, values in timeline.items():
                merge_counts(coarser, {str(int(start) // self._bucket * self._bucket): values})
            self.counts["timeline"][self.worker] = coarser
        self.counts["timeline_bucket_s"] = {str(self._bucket): 1}  # the driver re-bins to the coarsest
        self._seq += 1
        record = {"seconds": seconds, "rows": rows, "tokens": tokens, "padded_tokens": padded_tokens,
                  "padded_length": length, "at": round(now, 3)}
        self._slowest.append((seconds, f"{self._slow_prefix}|{self._seq}", record))
        if len(self._slowest) > SLOWEST_PER_TASK:
            self._slowest.remove(min(self._slowest, key=lambda item: item[0]))
        # the task's own entries are replaced, never summed: their keys are unique to this task
        self.counts["slow_batches"] = {key: rec for _, key, rec in self._slowest}

    def add_status(self, statuses: Mapping[str, int]) -> None:
        merge_counts(self.counts.setdefault("status", {}), statuses)

    def merge(self, other: Mapping[str, Any]) -> None:
        merge_counts(self.counts, other)


def reused_counts(stored: Mapping[str, Any], *, rows: int) -> Counts:
    """The counts of a task whose output for ``rows`` input rows was reused from a finished earlier try.

    What its stored counts say about the rows (statuses, a kind's own output counts) stays, so the
    run's totals and completeness checks add up; the work of scoring (the counters declared ``work``,
    :data:`pipeline.core.run_counts.WORK_KEYS`) is dropped,
    and ``resumed_tasks`` / ``rows_reused`` count the reuse.

    >>> reused_counts({"status": {"ok": 3}, "tokens": 40, "model_loads": {"w": 1}}, rows=3)
    {'status': {'ok': 3}, 'resumed_tasks': 1, 'rows_reused': 3}
    """
    kept = {k: v for k, v in stored.items() if k not in WORK_KEYS and k not in ("resumed_tasks", "rows_reused")}
    return {**kept, "resumed_tasks": 1, "rows_reused": int(rows)}


class StageClock:
    """Wall seconds of the driver's stages of one run, in the order they ran.

    A lap ends the stage that ran since the previous lap (or since the clock
    started) and names it; a name lapped twice adds up::

        clock = StageClock()
        spark = get_session(...)
        clock.lap("session")

    >>> ticks = iter([0.0, 1.5, 1.75, 2.0])
    >>> clock = StageClock(clock=lambda: next(ticks))
    >>> clock.lap("session"), clock.lap("model check"), clock.lap("session")
    (1.5, 0.25, 0.25)
    >>> clock.seconds
    {'session': 1.75, 'model check': 0.25}
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.last = clock()
        self.seconds: dict[str, float] = {}
        # called at every lap, before the next stage starts (a stop asked for raises there)
        self.between: Callable[[], None] = lambda: None
        # called at every lap with the stage's name, its seconds and what it counted: the run's stage event
        self.on_lap: Callable[..., None] = lambda name, seconds, **facts: None

    def lap(self, name: str, **facts: Any) -> float:
        """Attribute the time since the last lap to ``name``; returns that time. ``facts`` (rows, tasks, the
        version committed) travel with it to :attr:`on_lap`."""
        self.between()
        now = self.clock()
        spent, self.last = now - self.last, now
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        self.on_lap(name, spent, **facts)
        return spent

    def lap_until(self, name: str, until: float, **facts: Any) -> float:
        """:meth:`lap` as of ``until`` (a reading of :attr:`clock`, no later than now): what ran beside it
        after ``until`` goes to the next lap.

        >>> ticks = iter([0.0, 5.0])
        >>> clock = StageClock(clock=lambda: next(ticks))
        >>> clock.lap_until("model check", 1.5), clock.lap("session"), clock.seconds
        (1.5, 3.5, {'model check': 1.5, 'session': 3.5})
        """
        self.between()
        spent = max(0.0, until - self.last)
        self.last = max(self.last, until)
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        self.on_lap(name, spent, **facts)
        return spent

    def skip(self) -> None:
        """Start the next stage now: the time since the last lap is nobody's (e.g. already attributed)."""
        self.last = self.clock()


def batch_metrics(counts: Mapping[str, Any]) -> dict[str, Any]:
    """The run's per-batch metrics from merged worker counts: small, JSON-able, what the report plots.

    ``by_length``: ``[{padded_length, batches, rows, tokens, padded_tokens, seconds}]`` by length;
    ``timeline``: ``{worker: [[epoch_s, rows, tokens, busy seconds], ...]}`` at most ``TIMELINE_POINTS`` each,
    all on buckets of ``timeline_bucket_s`` seconds (zeros where the worker scored nothing);
    ``slowest``: the ``SLOWEST_PER_RUN`` slowest batches with their worker and task;
    ``finish_reasons`` and ``generation`` token counts for generation runs.

    >>> c = WorkerCounts(worker="w1", task=0, clock=lambda: 100.0)
    >>> c.add_batch(rows=2, tokens=10, padded_tokens=16, padded_length=8, seconds=0.5)
    >>> m = batch_metrics(c.counts)
    >>> m["by_length"][0]["padded_length"], m["timeline"]["w1"], m["slowest"][0]["worker"]
    (8, [[100, 2, 10, 0.5]], 'w1')
    """
    by_length = [
        {"padded_length": int(length), **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in values.items()}}
        for length, values in sorted(counts.get("by_length", {}).items(), key=lambda item: int(item[0]))
    ]
    timeline, width = _timeline(counts)
    slowest = []
    for key, rec in counts.get("slow_batches", {}).items():
        worker, task, _, _ = (key.split("|") + ["", "", "", ""])[:4]
        slowest.append({"worker": worker, "task": task, **rec})
    slowest.sort(key=lambda r: -float(r.get("seconds", 0.0)))
    out: dict[str, Any] = {"by_length": by_length, "timeline": timeline, "timeline_bucket_s": width,
                           "slowest": slowest[:SLOWEST_PER_RUN]}
    if counts.get("finish_reasons"):
        out["finish_reasons"] = {k: int(v) for k, v in counts["finish_reasons"].items()}
    if counts.get("completion_tokens") or counts.get("generate_seconds"):
        out["generation"] = {k: counts.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "generate_seconds")}
    return out


def _timeline(counts: Mapping[str, Any]) -> tuple[dict[str, list[list[Any]]], int]:
    """Every worker's timeline on one bucket width (empty buckets as zeros), at most ``TIMELINE_POINTS`` long."""
    buckets = counts.get("timeline", {})
    if not buckets:
        return {}, TIMELINE_BUCKET_S
    starts = [int(t) for per_worker in buckets.values() for t in per_worker]
    width = max([TIMELINE_BUCKET_S, *(int(w) for w in counts.get("timeline_bucket_s", {}))])
    while (max(starts) - min(starts)) // width + 1 > TIMELINE_POINTS:
        width *= 2
    out = {}
    for worker, per_worker in buckets.items():
        binned: dict[int, list[float]] = {}
        for start, v in per_worker.items():
            point = binned.setdefault(int(start) // width * width, [0, 0, 0.0])
            point[0] += int(v.get("rows", 0))
            point[1] += int(v.get("tokens", 0))
            point[2] += float(v.get("seconds", 0.0))
        first, last = min(binned), max(binned)
        out[worker] = [[t, *(int(x) for x in binned.get(t, [0, 0])[:2]), round(binned.get(t, [0, 0, 0.0])[2], 4)]
                       for t in range(first, last + width, width)]
    return out, width


class WorkerProgress:
    """Prints a worker's progress to stderr at most every ``interval`` seconds.

    A task's counts only reach the driver when the task ends, so a long task
    would look stuck; the worker's own line shows it moving (in the console
    under ``local[*]``, in the executor's stderr log on a cluster).
    """

    def __init__(self, label: str, interval: float, *, stream: Any = None) -> None:
        import sys

        self.label, self.interval = label, interval
        self.stream = stream if stream is not None else sys.stderr
        self._clock = time.monotonic
        self.started = self.last = self._clock()

    def restart(self) -> None:
        self.started = self.last = self._clock()

    def __call__(self, counts: WorkerCounts) -> None:
        now = self._clock()
        if now - self.last < self.interval:
            return
        self.last = now
        c = counts.counts
        # generation reports rows as they finish (progress_*); batched tasks as their batches end
        rows = int(c.get("progress_rows", c.get("batch_rows", 0)))
        tokens = c.get("progress_tokens", c.get("tokens", 0))
        elapsed = now - self.started
        batches = f" in {int(c.get('batches', 0)):,} batches" if "progress_rows" not in c else ""
        print(
            f"[{self.label}] {rows:,} rows{batches}, {rows / elapsed if elapsed else 0:,.1f} rows/s, "
            f"{tokens / elapsed if elapsed else 0:,.0f} tokens/s",
            file=self.stream, flush=True,
        )
