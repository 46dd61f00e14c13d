"""One micro-batch of a streaming job, as a small run: the rows it read, scored by the worker code of every
run, the quarantine and the output committed under the query's Delta transaction, both read back.

A streaming job (``source.stream``) hands each micro-batch to :meth:`MicroBatches.__call__`
(``foreachBatch(batch_df, batch_id)``). The micro-batch runs the stages of a run on its rows: keys and
content hashes (:func:`pipeline.stages.inputs.hashed_inputs`), tasks planned for its row count
(:func:`pipeline.stages.scoring.plan_inference_tasks`), the UDF (:func:`pipeline.stages.scoring.score_inputs`),
the checks and the error budget, the drift gate (:mod:`pipeline.stages.quality`: each micro-batch's
profile against the job's recent runs, so ``run.quality.on_drift: refuse`` stops the stream before a
micro-batch that moved is committed), the quarantine commit (only when rows failed), the output commit and the
read-back by key (:func:`pipeline.stages.commit.score_and_commit`). Its commits carry the Delta transaction
``(sbi-<job>-stream-<query id>, batch id)`` (:meth:`pipeline.config.identity.RunIdentity.micro_batch`): Spark
replays the micro-batch a crash interrupted with the same id and the same rows, and a commit the table
already holds is skipped, so a kill at any point and a restart from the checkpoint write each row once.

The micro-batches run one at a time; :meth:`MicroBatches.stop` waits for the one running (its commits
included) and refuses the next, which a restart then reads again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from pipeline.errors import JobError, RunStopped
from pipeline.config.identity import RunIdentity
from pipeline.core.metrics import StageClock
from pipeline.core.run_counts import RunCounts
from pipeline.spark.checks import observe_input_tally
from pipeline.stages.commit import score_and_commit
from pipeline.stages.inputs import hashed_inputs
from pipeline.stages.outcomes import AlreadyCommitted, Checkpoint, Prepared, RunPlan
from pipeline.stages.planning import check_output_columns
from pipeline.stages.scoring import plan_inference_tasks, score_inputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["BatchResult", "MicroBatches", "StreamMemo", "score_micro_batch"]


@dataclass(frozen=True)
class BatchResult:
    """What one micro-batch did. ``replayed``: an earlier try had committed it (its rows are in the tables once,
    from that try), so this one wrote nothing; ``counts``: the workers' merged counts."""

    batch_id: int
    run_id: str
    ds: str
    rows_in: int = 0
    rows_out: int = 0
    rows_quarantined: int = 0
    tasks: int = 0
    version: int | None = None
    quarantine_version: int | None = None
    output: str = ""
    writer: str = ""
    seconds: float = 0.0
    counts: dict[str, Any] = field(default_factory=dict)
    replayed: str | None = None
    # the drift gate's record of this micro-batch ({"profile": ..., "drift": ...}); empty when run.quality is off
    quality: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The micro-batch's line in the run's output."""
        if self.replayed:
            return f"micro-batch {self.batch_id}: {self.replayed}"
        if not self.rows_in:
            return f"micro-batch {self.batch_id}: no rows"
        rate = self.rows_in / self.seconds if self.seconds > 0 else 0.0
        quarantined = f", {self.rows_quarantined:,} quarantined (version {self.quarantine_version})" \
            if self.rows_quarantined else ""
        infer = float(self.counts.get("infer_seconds", 0.0))  # summed over the micro-batch's tasks
        return (f"micro-batch {self.batch_id}: {self.rows_in:,} rows in, {self.rows_out:,} out{quarantined} -> "
                f"{self.output} version {self.version} in {self.seconds:,.2f} s ({infer:,.2f} s inference in its "
                f"tasks; {rate:,.1f} docs/s)")


class StreamMemo:
    """What a stream reads once and its micro-batches share: whether the output's columns were checked (the
    first micro-batch checks them against the table's schema; a later change is the commit's to refuse) and
    the drift gate's history of the job's runs (:class:`pipeline.stages.quality.RunsHistory`)."""

    def __init__(self) -> None:
        from pipeline.stages.quality import RunsHistory

        self.columns_checked = False
        self.history = RunsHistory()


def score_micro_batch(prep: Prepared, identity: RunIdentity, batch: "DataFrame", batch_id: int,
                      memo: StreamMemo | None = None) -> BatchResult:
    """Score and commit micro-batch ``batch_id`` (``batch``: its rows as read) under ``identity`` (its
    :meth:`~pipeline.config.identity.RunIdentity.micro_batch`); ``prep`` is the stream's, on the micro-batch's session;
    ``memo``: what the stream read once (None: read here)."""
    from pyspark import StorageLevel

    from pipeline.io.sources import select_input

    config, started = prep.config, time.perf_counter()
    prep.stage("planning")  # the micro-batch's own jobs from here on, not the last stage of the one before
    sink = config.sink
    inputs = hashed_inputs(select_input(batch, config.source, tuple(prep.task.input_columns)), config, prep.task)
    inputs = inputs.persist(StorageLevel.MEMORY_AND_DISK)  # counted, scored and checked: the source read once
    try:
        rows_in = inputs.count()
        if not rows_in:
            return BatchResult(batch_id, identity.run_id, identity.ds.isoformat(), output=str(sink.path or sink.table))
        tasks = plan_inference_tasks(prep.spark, config, rows_in, prep.task)
        observed, input_tally = observe_input_tally(inputs)
        scored = score_inputs(observed, config, tasks=tasks, run_id=identity.run_id, ds=identity.ds,
                              scored_at=prep.scored_at, model=prep.model, faults=prep.faults, task=prep.task,
                              fingerprint=identity.task_fingerprint, carry_failed=True)
        memo = memo or StreamMemo()
        if not memo.columns_checked:  # once per stream: the schema read once, not at every micro-batch
            check_output_columns(prep, scored, sink)
            memo.columns_checked = True
        plan = RunPlan(identity=identity, sink=sink, key_columns=(), read_version=None, source_note=None,
                       inputs=inputs, scored=scored, rows_in=rows_in, tasks=tasks, known_bad=0, micro_batch=batch_id,
                       input_tally=input_tally, runs_history=memo.history)
        outcome = score_and_commit(prep, plan, Checkpoint())
    finally:
        inputs.unpersist()
    seconds = time.perf_counter() - started
    if isinstance(outcome, AlreadyCommitted):
        return BatchResult(batch_id, identity.run_id, identity.ds.isoformat(), output=outcome.output, writer=outcome.writer,
                           version=outcome.version, seconds=seconds,
                           replayed=f"committed by an earlier try at version {outcome.version} of {outcome.output} "
                                    f"(its {rows_in:,} rows are there once); nothing written again")
    committed, read = outcome
    counts = RunCounts.from_merged(committed.counts, task=prep.kind.job.counters)
    incomplete = read.incomplete or prep.kind.job.check_complete(
        rows_in=rows_in, rows_out=read.rows_out, rows_quarantined=read.rows_quarantined, counts=counts)
    if incomplete:
        raise JobError(f"micro-batch {batch_id}: {incomplete}; the stream stopped here, and a restart reads this "
                       "micro-batch again")
    return BatchResult(batch_id, identity.run_id, identity.ds.isoformat(), rows_in=rows_in, rows_out=read.rows_out,
                       rows_quarantined=read.rows_quarantined, tasks=tasks, version=committed.result.version,
                       quarantine_version=committed.quarantine_version, output=committed.result.output,
                       writer=committed.result.writer, seconds=seconds, counts=dict(committed.counts),
                       quality=dict(committed.quality or {}))


class MicroBatches:
    """The ``foreachBatch`` function of a streaming job: each micro-batch scored and committed
    (:func:`score_micro_batch`) under the run id in effect (:attr:`run_id`), its result kept and said.

    ``fixed_ds``: every micro-batch's rows carry ``identity.ds`` (``run.ds`` was given); otherwise the UTC day
    the micro-batch starts. :meth:`begin` gives it the query's id once the query started (the micro-batches'
    transaction id names it); :meth:`stop` lets the micro-batch that runs finish and refuses the next.
    """

    def __init__(self, prep: Prepared, identity: RunIdentity, *, fixed_ds: bool,
                 on_batch: Callable[[BatchResult], None] = lambda result: None) -> None:
        self.prep, self.identity, self.fixed_ds, self.on_batch = prep, identity, fixed_ds, on_batch
        self.run_id = identity.run_id
        self.app_id: str | None = None
        self.results: list[BatchResult] = []
        self.failure: BaseException | None = None
        self.lock = threading.Lock()
        self.idle = threading.Event()
        self.idle.set()
        self.stopping = False
        self._ready = threading.Event()
        self.memo = StreamMemo()  # the output's schema and the drift history, read once for the stream

    def begin(self, query_id: str) -> None:
        """The query started with id ``query_id`` (kept in its checkpoint: the same after a restart)."""
        self.app_id = f"sbi-{self.prep.config.job}-stream-{query_id}"
        self._ready.set()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Refuse the next micro-batch and wait for the one running to finish; False when it is still running
        after ``timeout_s``."""
        with self.lock:
            self.stopping = True
        return self.idle.wait(timeout_s)

    def take_results(self) -> list[BatchResult]:
        """The results kept so far, handed over once (a runs-table row covers them)."""
        with self.lock:
            taken, self.results = self.results, []
        return taken

    def __call__(self, batch: "DataFrame", batch_id: int) -> None:
        if not self._ready.wait(300):
            raise JobError("the streaming query never said its id; nothing of this micro-batch was committed")
        with self.lock:
            if self.stopping:  # raised, not returned: a micro-batch returned from counts as done in the checkpoint
                raise RunStopped(f"stopped by SIGTERM before micro-batch {batch_id}: a restart reads it")
            self.idle.clear()
            run_id = self.run_id
        try:
            result = self._score(batch, int(batch_id), run_id)
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            self.idle.set()
        with self.lock:
            self.results.append(result)
        self.on_batch(result)

    def _score(self, batch: "DataFrame", batch_id: int, run_id: str) -> BatchResult:
        now = dt.datetime.now(dt.timezone.utc)
        ds = self.identity.ds if self.fixed_ds else now.date()
        # the micro-batch's own session (a clone of the query's), clock and scored_at: its rows are told from
        # the run's other micro-batches' by scored_at, to the microsecond
        prep = dataclasses.replace(self.prep, spark=batch.sparkSession, scored_at=now, clock=StageClock())
        assert self.app_id is not None
        identity = self.identity.micro_batch(app_id=self.app_id, batch_id=batch_id, run_id=run_id, ds=ds)
        return score_micro_batch(prep, identity, batch, batch_id, self.memo)
