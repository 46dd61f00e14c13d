"""Counters collected on the executors and the end-of-run summary built from them.

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
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["RunSummary", "StageClock", "WorkerCounts", "WorkerProgress", "batch_metrics", "merge_counts",
           "reused_counts"]

Counts = dict[str, Any]

# per-batch metrics: a task's timeline starts at 1-second buckets and doubles them past
# TIMELINE_TASK_POINTS; a run keeps at most TIMELINE_POINTS per worker; slowest batches per task and run
TIMELINE_BUCKET_S = 1
TIMELINE_TASK_POINTS = 240
TIMELINE_POINTS = 120
SLOWEST_PER_TASK = 5
SLOWEST_PER_RUN = 20


def merge_counts(into: Counts, other: Mapping[str, Any]) -> Counts:
    """Add ``other`` into ``into`` key by key (numbers sum, dicts merge recursively); returns ``into``."""
    for key, value in other.items():
        if isinstance(value, Mapping):
            merge_counts(into.setdefault(key, {}), value)
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


# what a task's counts say about the work of scoring (not about its output rows): a task reused from
# staged output did none of it in this run
WORK_KEYS = frozenset({
    "batches", "tokens", "padded_tokens", "batch_sizes", "batch_rows", "by_length", "timeline", "timeline_bucket_s",
    "slow_batches", "rows_per_worker", "model_loads", "load_seconds", "infer_seconds", "torch_threads",
    "task_retries", "tasks_per_worker", "precision_used", "precision_fallbacks", "precision_checks",
    "precision_auto", "generation_backend",
    "progress_rows", "oom_splits", "adaptive_splits", "poison_bisections", "endpoint",
})


def reused_counts(stored: Mapping[str, Any], *, rows: int) -> Counts:
    """The counts of a task whose output for ``rows`` input rows was reused from a finished earlier try.

    What its stored counts say about the rows (statuses, a kind's own output counts) stays, so the
    run's totals and completeness checks add up; the work of scoring (:data:`WORK_KEYS`) is dropped,
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

    def lap(self, name: str) -> float:
        """Attribute the time since the last lap to ``name``; returns that time."""
        self.between()
        now = self.clock()
        spent, self.last = now - self.last, now
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        return spent

    def skip(self) -> None:
        """Start the next stage now: the time since the last lap is nobody's (e.g. already attributed)."""
        self.last = self.clock()


@dataclass
class RunSummary:
    """What a run did, printed at the end and returned to the caller."""

    job: str
    run_id: str
    ds: str
    rows_in: int
    rows_out: int
    status: dict[str, int]
    seconds: float
    tokens: int
    padded_tokens: int
    batches: int
    model_loads: dict[str, int]
    model_name: str
    model_revision: str
    output: str
    delta_version: int | None
    writer: str
    batch_sizes: dict[str, int] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    rows_quarantined: int = 0
    quarantine: str | None = None
    incremental: bool = False
    retries: dict[str, int] = field(default_factory=dict)
    # model loads per precision actually used, and accuracy-gate fallbacks with their reason
    precision_used: dict[str, int] = field(default_factory=dict)
    precision_fallbacks: dict[str, int] = field(default_factory=dict)
    # the accuracy gate's measured figures per check ("int8: mean cosine ..., on 256 run rows (pass)": loads)
    precision_checks: dict[str, int] = field(default_factory=dict)
    # model.precision auto: what each load chose ("auto -> int8": loads)
    precision_auto: dict[str, int] = field(default_factory=dict)
    # generate: model loads per backend and batching mode, e.g. {"vllm (continuous)": 2}
    generation_backend: dict[str, int] = field(default_factory=dict)
    # seconds summed over workers: loading models, and running the task on chunks
    load_seconds: float = 0.0
    infer_seconds: float = 0.0
    # what does not add up (the task kind's completeness check), None when every input row is accounted for
    incomplete: str | None = None
    # set when this run's committed rows are no longer in the latest snapshot, e.g. "replaced by run b (version 3)"
    replaced: str | None = None
    # task-specific summary lines, {label: value} (e.g. the recommend kind's latest table and model quality)
    details: dict[str, str] = field(default_factory=dict)
    # inference tasks the runner planned, and rows scored per Python worker
    tasks: int = 0
    rows_per_worker: dict[str, int] = field(default_factory=dict)
    # per-batch metrics (see batch_metrics): length histogram, worker timelines, slowest batches,
    # and for generation finish reasons and token counts
    batch_metrics: dict[str, Any] = field(default_factory=dict)
    # wall seconds of the driver's stages (session, model check, pre-flight, ..., commit, read-back), in order:
    # what a small job spends outside inference (StageClock)
    stage_seconds: dict[str, float] = field(default_factory=dict)
    # a rerun of a killed run: tasks reused from the staged output of earlier tries, and their rows against
    # the rows scored by this try; resume_note: why staged output was not reused, or why there is none
    resumed_tasks: int = 0
    rows_reused: int = 0
    rows_scored: int = 0
    resume_note: str | None = None
    # what identified the source's content (``delta:<table id>:<version>``, ``files:<hash>``), and why it
    # is a new input although its version looks the same (a table dropped and rebuilt)
    source_snapshot: str | None = None
    source_note: str | None = None
    # generation and embedding: the rows' token usage (for a served model, what its server reported per row,
    # answers replayed from an earlier try included); endpoint: what this try's requests did
    # (requests, replayed, retries by cause, lost_answers, failed_rows, tokens_paid)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    endpoint: dict[str, float] = field(default_factory=dict)

    @property
    def rows_flagged(self) -> int:
        return sum(n for s, n in self.status.items() if s != "ok")

    @property
    def docs_per_s(self) -> float:
        return self.rows_out / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def padding_efficiency(self) -> float:
        return self.tokens / self.padded_tokens if self.padded_tokens else 1.0

    @property
    def complete(self) -> bool:
        """Every input row is in the output or the quarantine table, once (as the task kind checks it)."""
        return self.incomplete is None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            rows_flagged=self.rows_flagged,
            docs_per_s=round(self.docs_per_s, 2),
            tokens_per_s=round(self.tokens_per_s, 2),
            padding_efficiency=round(self.padding_efficiency, 4),
            complete=self.complete,
        )
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def render(self) -> str:
        """A human-readable end-of-run report."""
        loads = self.model_loads
        load_line = (
            f"{sum(loads.values())} load(s) in {len(loads)} worker(s); "
            f"max {max(loads.values())} per worker" if loads else
            "none (every task reused from an earlier try)" if self.resumed_tasks else "none (no rows reached a worker)"
        )
        status = ", ".join(f"{k}={v}" for k, v in sorted(self.status.items())) or "-"
        check = "OK: every input row written once" if self.complete else f"MISMATCH: {self.incomplete}"
        lines = [
            f"== {self.job} run {self.run_id} (ds {self.ds}) ==",
            f"rows in / out / flagged : {self.rows_in:,} / {self.rows_out:,} / {self.rows_flagged:,}"
            + (f" / quarantined {self.rows_quarantined:,}" if self.rows_quarantined else "")
            + f"   [{check}]" + ("  (incremental: new or changed rows only)" if self.incremental else ""),
            f"row status              : {status}",
            f"time                    : {self.seconds:,.1f} s",
            f"throughput              : {_rate(self.docs_per_s)} docs/s"
            + (f", {self.tokens_per_s:,.0f} tokens/s" if self.tokens else ""),
        ]
        if self.padded_tokens:  # tasks without tokens (image classification) pad nothing
            lines.append(f"padding efficiency      : {self.padding_efficiency:.3f} ({self.tokens:,} real / "
                         f"{self.padded_tokens:,} padded tokens in {self.batches:,} batches)")
        lines += [
            f"model                   : {self.model_name} @ {self.model_revision}",
            f"model loads             : {load_line}",
        ]
        if self.rows_per_worker:
            lines.append(f"rows per worker         : {_spread(self.rows_per_worker)} in {self.tasks:,} task(s)")
        if self.load_seconds or self.infer_seconds:
            lines.append(f"worker time             : model load {self.load_seconds:,.1f} s, inference "
                         f"{self.infer_seconds:,.1f} s (summed over workers)")
        if self.precision_used:
            used = ", ".join(f"{p} x{n}" for p, n in sorted(self.precision_used.items()))
            lines.append(f"precision               : {used} (model loads)")
        for choice, n in sorted(self.precision_auto.items()):
            lines.append(f"precision auto          : {choice} in {n} load(s)")
        for check, n in sorted(self.precision_checks.items()):
            lines.append(f"precision gate          : {check} in {n} load(s)")
        for reason, n in sorted(self.precision_fallbacks.items()):
            lines.append(f"precision fallback      : {reason} in {n} load(s)")
        if self.generation_backend:
            used = ", ".join(f"{b} x{n}" for b, n in sorted(self.generation_backend.items()))
            lines.append(f"generation backend      : {used} (model loads)")
        lines += [f"{label:<24}: {value}" for label, value in self.details.items()]
        if self.endpoint:
            lines.append(f"endpoint                : {_endpoint_line(self.endpoint)}")
        if self.prompt_tokens or self.completion_tokens:
            lines.append(f"token usage             : {self.prompt_tokens + self.completion_tokens:,} "
                         f"({self.prompt_tokens:,} prompt + {self.completion_tokens:,} completion) over the rows"
                         + (f"; this try paid {int(self.endpoint.get('tokens_paid', 0)):,}" if self.endpoint else ""))
        lines.append(f"output                  : {self.output} (Delta version {self.delta_version}, {self.writer} writer)")
        if self.replaced:
            lines.append(f"{'since then':<24}: {self.replaced} (this run's commit landed and was checked "
                         f"at version {self.delta_version})")
        if self.quarantine:
            lines.append(f"quarantine              : {self.quarantine} ({self.rows_quarantined:,} rows of this run)")
        if self.stage_seconds:
            lines.append("driver stages           : " + ", ".join(
                f"{name} {seconds:,.1f} s" for name, seconds in self.stage_seconds.items() if seconds >= 0.05))
        if self.resumed_tasks:
            lines.append(f"resumed                 : {self.resumed_tasks:,} of {self.tasks:,} task(s) from an earlier "
                         f"try; rows reused {self.rows_reused:,}, scored {self.rows_scored:,}")
        if self.resume_note:
            lines.append(f"not resumed             : {self.resume_note}")
        if self.source_note:
            lines.append(f"source                  : {self.source_note}")
        if self.retries:
            lines.append("batch retries           : " + ", ".join(f"{k}={v}" for k, v in self.retries.items()))
        for row in self.samples:
            lines.append("sample                  : " + _short(row))
        return "\n".join(lines)


def _endpoint_line(stats: Mapping[str, float]) -> str:
    """One line for what a run's requests to a server did.

    >>> _endpoint_line({"requests": 12, "retry_429": 2, "retry_5xx": 1, "replayed": 3, "lost_answers": 0})
    '12 request(s) sent, 3 retried (429 x2, 5xx x1), 3 answer(s) replayed from the journal, 0 lost answer(s)'
    """
    causes = {"429": "retry_429", "5xx": "retry_5xx", "timeout": "retry_timeout", "connection": "retry_connection",
              "bad body": "retry_bad_body", "other": "retry_other"}
    retried = {name: int(stats.get(key, 0)) for name, key in causes.items() if stats.get(key)}
    text = f"{int(stats.get('requests', 0)):,} request(s) sent"
    if retried:
        text += f", {sum(retried.values()):,} retried (" + ", ".join(f"{k} x{v}" for k, v in retried.items()) + ")"
    text += f", {int(stats.get('replayed', 0)):,} answer(s) replayed from the journal"
    text += f", {int(stats.get('lost_answers', 0)):,} lost answer(s)"
    if stats.get("failed_rows"):
        text += f", {int(stats['failed_rows']):,} row(s) failed"
    return text


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


def _spread(per_worker: Mapping[str, int]) -> str:
    """``'20,100 / 19,900 (2 workers, min/max 0.99)'``: how evenly the workers shared the rows.

    >>> _spread({"h:1": 19_900, "h:2": 20_100})
    '20,100 / 19,900 (2 workers, min/max 0.99)'
    """
    counts = sorted(per_worker.values(), reverse=True)
    shown = " / ".join(f"{n:,}" for n in counts[:8]) + (" / ..." if len(counts) > 8 else "")
    ratio = counts[-1] / counts[0] if counts[0] else 1.0
    return f"{shown} ({len(counts)} worker{'s' if len(counts) != 1 else ''}, min/max {ratio:.2f})"


def _short(row: Mapping[str, Any], width: int = 160) -> str:
    parts = []
    for key, value in row.items():
        if isinstance(value, float):
            value = round(value, 4)
        elif isinstance(value, (list, tuple)) and len(value) > 4:
            value = f"[{len(value)} values]"
        elif isinstance(value, dict):
            value = {k: round(v, 3) if isinstance(v, float) else v for k, v in value.items()}
        text = str(value)
        parts.append(f"{key}={text[:60] + '…' if len(text) > 60 else text}")
    line = " ".join(parts)
    return line if len(line) <= width else line[: width - 1] + "…"


class WorkerProgress:
    """Prints a worker's progress to stderr at most every ``interval`` seconds.

    A task's counts only reach the driver when the task ends, so a long task
    would look stuck; the worker's own line shows it moving (in the console
    under ``local[*]``, in the executor's stderr log on a cluster).
    """

    def __init__(self, label: str, interval: float, *, stream: Any = None) -> None:
        import sys
        import time

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


def _rate(per_s: float) -> str:
    """A rate with its digits: ``1,234.5``, ``3.2``, and ``0.032`` for a slow task (not ``0.0``).

    >>> _rate(1234.5), _rate(3.21), _rate(0.0318), _rate(0.0)
    ('1,234.5', '3.2', '0.032', '0.0')
    """
    return f"{per_s:,.1f}" if per_s >= 1 or per_s == 0 else f"{per_s:.2g}"
