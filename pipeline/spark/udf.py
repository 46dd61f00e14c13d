"""The executor side: an Arrow ``mapInArrow`` function that scores each chunk with a cached model.

Everything here is importable (never defined in ``__main__``), so the
per-worker model cache survives from task to task in a reused Python worker.
The steps each chunk goes through (rows without an id, results joined to the
kept columns, the metrics column, staging) are plain functions in
:mod:`pipeline.spark.chunks`; this module wires them to the task and its model.

Run metrics travel with the data, so they work on Spark Connect too (no
accumulators there): with ``InferencePlan.metrics_column`` set, each task
holds back its last chunk until it has scored everything, then writes its
final :class:`~pipeline.core.metrics.WorkerCounts` as JSON into that column of its
last row (null on every other row). The driver aggregates them
(``pipeline.spark.run_metrics``). A failed or retried attempt's rows never
reach the output, so neither do its counts.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts, WorkerProgress
from pipeline.core.sketches import Profile
from pipeline.spark.chunks import (CARRIED_PREFIX, Taken, carry_failed_inputs, digesting, each_hook, finish_profile,
                                   finish_stage, join_results, profile_chunk, replay_staged, split_null_ids,
                                   task_results, with_metrics)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["CARRIED_PREFIX", "InferencePlan", "METRICS_COLUMN", "apply_inference", "internal_columns", "load_model",
           "output_schema", "score_partition"]

# The column that carries each task's counts (JSON, on its last row); dropped before any write.
METRICS_COLUMN = "_sbi_metrics"


@dataclass(frozen=True)
class InferencePlan:
    """Everything an executor needs to score chunks (small and picklable: configs, not models)."""

    task: Any
    model: ModelConfig
    batching: BatchingConfig
    keep_columns: tuple[str, ...] = ()
    input_columns: tuple[str, ...] = ("text",)
    job: str = "job"
    # seconds between a worker's progress lines on stderr; None: silent
    progress_interval_s: float | None = None
    # a folder the driver reads each task's rows done from (pipeline.spark.progress.rows_folder); None: none
    progress_dir: str | None = None
    # fault injection for tests and drills (pipeline.core.faults); empty in production
    faults: tuple[tuple[str, Any], ...] = ()
    # the registered task class; pickled by reference, so a worker imports (and registers) its module
    task_class: Any = None
    # the task's counts as JSON on its last row, in this column (None: no such column)
    metrics_column: str | None = None
    # the source's id column, named in the error of a row without an id (status invalid_id)
    id_column: str = "id"
    # the plan folder of staged task output (pipeline.journal): a finished task's rows are kept there and
    # a rerun's task with the same input reuses them instead of scoring; None: no staging
    staging_dir: str | None = None
    # texts of the job's own rows the accuracy gate calibrates on (pipeline.runner draws them); empty: none
    calibration_rows: tuple[str, ...] = ()
    # a load before those rows are drawn (a warm-up): it replays a remembered gate verdict or loads nothing
    recall_verdict_only: bool = False
    # a task that sends rows to a server (the endpoint backend): this try's id (its token ledger in the staging
    # folder), the run's token budget (run.max_tokens) and this task's share of the run's request rates
    try_id: str = ""
    max_tokens: int | None = None
    rate_share: float = 1.0
    # a task that sends rows to a server journals every answer in the staging folder (run_job: no row is paid
    # for twice); False: no journal, a retried task sends its rows again (score(df): Spark's semantics)
    journal_requests: bool = True
    # sketch the output as it is scored (pipeline.core.sketches): the task's profile rides in its counts
    profile: bool = False
    # the model's revision (a hash of its weights, checked on the driver): part of the worker cache's key, so
    # a folder whose weights were replaced is loaded again by a reused worker, never served from its cache
    model_revision: str = ""
    # input columns a quarantined row carries out as ``_sbi_input_<c>`` (null on the other rows), so the
    # quarantine keeps a failed row's inputs without reading the source again; empty: none (score(df))
    carry_inputs: tuple[str, ...] = ()

    @classmethod
    def for_job(cls, config: Any, *, model_path: str, task_class: Any, **fields: Any) -> "InferencePlan":
        """The plan of ``config``'s task (a :class:`~pipeline.config.JobConfig`) on the checked model at
        ``model_path`` (:attr:`pipeline.registry.ModelInfo.path`), with any other of the plan's ``fields``:
        ``run_job``'s stages and ``score(df)`` build theirs here, so both load the same model the same way."""
        return cls(task=config.task, model=config.model.model_copy(update={"path": model_path}),
                   batching=config.batching, job=config.job, id_column=config.source.id_column,
                   task_class=task_class, **fields)

    def build_task(self) -> Any:
        if self.task_class is None:
            raise TypeError("InferencePlan.task_class is not set: pass the registered kind's task class "
                            "(pipeline.registry.get_task_kind(kind).task)")
        gate = {"calibration_rows": self.calibration_rows} if self.calibration_rows else {}
        if self.recall_verdict_only:
            gate["recall_verdict_only"] = True
        return self.task_class(self.task, model=self.model, batching=self.batching, **gate)


def output_schema(plan: InferencePlan, input_schema: pa.Schema) -> pa.Schema:
    """``id``, the kept source columns, then the task's result and status columns."""
    task_schema = plan.build_task().output_schema()
    kept = [input_schema.field(c) for c in ("id", *plan.keep_columns)]
    carried = [input_schema.field(c).with_name(CARRIED_PREFIX + c) for c in plan.carry_inputs
               if c not in ("id", *plan.keep_columns)]
    metrics = [pa.field(plan.metrics_column, pa.string())] if plan.metrics_column else []
    return pa.schema(kept + list(task_schema) + carried + metrics)


def internal_columns(df: "DataFrame") -> list[str]:
    """The columns of a scored DataFrame that only the run reads (the tasks' counts, a failed row's carried
    inputs): dropped before any write."""
    return [c for c in df.columns if c == METRICS_COLUMN or c.startswith(CARRIED_PREFIX)]


def _load(task: Any, model: ModelConfig, device: str) -> Any:
    from pipeline.models.loading import resolve_model_path

    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    resolve = getattr(task, "resolve_model_dir", None)
    path = resolve(model.path) if resolve else resolve_model_path(model.path, registry_uri=model.registry_uri)
    return task.load(path, device)


def score_partition(plan: InferencePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Score one Spark task's Arrow chunks: model from the per-worker cache, results in input order.

    The model loads on the first chunk, so an empty task loads nothing. With ``plan.staging_dir`` a
    task a finished earlier try staged for the same input rows replays those rows (no model load), and
    a task that scores stages its rows as it ends.
    """
    from pyspark import TaskContext

    from pipeline.core import faults
    from pipeline.endpoint.attempt import journals_requests

    ctx = TaskContext.get()
    faults.activate(dict(plan.faults))
    counts, progress, rows_file = _task_counts(plan, ctx)
    batches = iter(batches)
    stage, digest, reused, batches = _staged_or_inputs(plan, ctx, batches)
    if reused is not None:
        yield from replay_staged(*reused, metrics_column=plan.metrics_column, input_rows=digest.rows,
                                 rows_file=rows_file)
        return
    task = plan.build_task()
    keep = ("id", *plan.keep_columns)
    carried = tuple(c for c in plan.carry_inputs if c not in keep)  # a failed row's inputs, for the quarantine
    first = next(batches, None)
    if first is None:
        return  # an empty task loads nothing
    if journals_requests(task):
        _bind_attempt(task, plan, ctx)
    loaded = _load_for_task(task, plan, ctx, counts.worker, counts)
    if progress is not None:
        progress.restart()  # rates from the first batch on, not from the model load
    task_schema = task.output_schema()
    profile = Profile() if plan.profile else None
    taken: deque[Taken] = deque()  # (rows with an id, rows without one flagged or None, which) per chunk, in order

    def task_inputs() -> Iterator[pa.RecordBatch]:
        for batch in itertools.chain([first], batches):
            valid, invalid, missing = split_null_ids(batch, task_schema, keep=(*keep, *carried),
                                                     id_column=plan.id_column, counts=counts)
            taken.append((valid, invalid, missing))  # its id and kept columns join its results, in order
            if valid.num_rows or invalid is None:  # a chunk of rows without ids only never reaches the model
                inputs = pa.RecordBatch.from_arrays([valid.column(c) for c in plan.input_columns],
                                                    names=list(plan.input_columns))
                if profile is not None:
                    profile.inputs(inputs.column(0))
                yield inputs

    results = task_results(task, loaded, task_inputs(), counts, ctx.cpus() if ctx else 1)
    held: pa.RecordBatch | None = None
    try:
        for n, out in enumerate(join_results(results, taken, (*keep, *carried), counts)):
            out = carry_failed_inputs(out, keep, carried)
            counts.merge({"rows_per_worker": {counts.worker: out.num_rows}})
            if plan.faults and ctx is not None:
                out = faults.on_output(out, ctx.partitionId(), n)
            profile_chunk(task, out, profile)
            if stage is not None:
                stage.add(out)
            if plan.metrics_column is None:
                yield out
            elif out.num_rows == 0:
                yield with_metrics(out, plan.metrics_column, None)
            else:
                # hold the last chunk back: its last row carries this task's final counts
                if held is not None:
                    yield with_metrics(held, plan.metrics_column, None)
                held = out
            if n == 0 and plan.faults and ctx is not None:
                faults.on_task_start(ctx.partitionId(), ctx.attemptNumber())
        finish_profile(profile, counts)
        finish_stage(stage, digest, counts)
    except BaseException:
        if stage is not None:
            stage.abandon()
        raise
    if rows_file is not None:
        rows_file(counts, force=True)
    if held is not None:
        yield with_metrics(held, plan.metrics_column, json.dumps(counts.counts))


def _bind_attempt(task: Any, plan: InferencePlan, ctx: Any) -> None:
    """Give a task that sends rows to a server its request journal in the plan's staging folder, the run's
    token budget and its share of the rates (:class:`pipeline.journal.request_log.RequestLog`)."""
    import os

    from pipeline.errors import EngineError
    from pipeline.journal.request_log import RequestLog

    if not plan.journal_requests:
        task.bind_attempt(None, max_tokens=None, rate_share=plan.rate_share)
        return
    if not plan.staging_dir or ctx is None or not os.path.isdir(plan.staging_dir):
        raise EngineError(
            f"the run's staging folder {plan.staging_dir!r} is not reachable from this executor; the endpoint backend "
            "journals every answer there so that no row is paid for twice: set run.staging_path to a folder every "
            "executor reaches")
    journal = RequestLog(plan.staging_dir, task=ctx.partitionId(), try_id=plan.try_id or "try")
    task.bind_attempt(journal, max_tokens=plan.max_tokens, rate_share=plan.rate_share)


def _task_counts(plan: InferencePlan, ctx: Any) -> tuple[WorkerCounts, Any, Any]:
    """This task's counts, its worker's progress line (None: silent) and its rows-done file (None: none)."""
    from pipeline.models import cache

    worker = cache.worker_id()
    progress = None
    if plan.progress_interval_s:
        part = f" task {ctx.partitionId()}" if ctx else ""
        progress = WorkerProgress(f"{plan.job} worker {worker}{part}", plan.progress_interval_s)
    rows_file = None
    if plan.progress_dir and ctx is not None:
        from pipeline.spark.progress import TaskRowsFile

        rows_file = TaskRowsFile(plan.progress_dir, ctx.partitionId())
    counts = WorkerCounts(on_batch=each_hook(progress, rows_file), worker=worker,
                          task=ctx.partitionId() if ctx else None)
    counts.merge({"tasks_per_worker": {worker: 1}})
    if ctx is not None and ctx.attemptNumber() > 0:
        counts.add("task_retries")  # this attempt succeeds only if its rows reach the output
    return counts, progress, rows_file


def _staged_or_inputs(plan: InferencePlan, ctx: Any, batches: Iterator[pa.RecordBatch]) -> tuple[
        Any, Any, "tuple[pa.Table, dict[str, Any]] | None", Iterator[pa.RecordBatch]]:
    """``(stage, input digest, reused, inputs)``: with staging, the task's stage and the digest its
    inputs fill as they are read; ``reused``: the rows and counts of a finished try with the same input
    (the inputs then read whole), else None and the inputs to score."""
    if not plan.staging_dir or ctx is None:
        return None, None, None, batches
    from pipeline.journal.tasks import InputDigest, TaskStage

    stage, digest = TaskStage(plan.staging_dir, ctx.partitionId()), InputDigest()
    if not stage.has_marker():
        return stage, digest, None, digesting(batches, digest)
    read = list(batches)  # a finished try's marker: its input must digest the same to be reused
    for batch in read:
        digest.update(batch)
    reused = stage.reusable(digest.value())
    return stage, digest, reused, iter(read)


def _load_for_task(task: Any, plan: InferencePlan, ctx: Any, worker: str, counts: WorkerCounts) -> Any:
    """The task's model from the per-worker cache (loading it on this task's device if new), counted."""
    import torch

    loaded, cost = load_model(task, plan, ctx)
    counts.merge({"torch_threads": {str(torch.get_num_threads()): 1}})  # per task: what it really ran with
    if cost is not None:  # loaded by this task, or by a warm-up before it (pipeline.spark.warmup)
        counts.merge({"model_loads": {worker: 1}, **cost})
    return loaded


def load_model(task: Any, plan: InferencePlan, ctx: Any, *, defer: bool = False) -> tuple[Any, dict[str, Any] | None]:
    """``(model, cost)``: the model from the per-worker cache, on the task's device and thread count, and what
    loading it cost (``load_seconds``, the model's ``load_counts``) when no task has counted that load yet.

    ``defer``: a load outside any task (a warm-up) keeps its cost for the first task that uses the model.
    """
    from pipeline.models import cache
    from pipeline.models.device import pick_device, task_threads

    import torch

    device = pick_device(ctx.resources() if ctx else None, prefer=plan.model.device)
    # checked on every task: a reused worker keeps whatever the previous task set. Only called on a
    # change: vLLM's CPU worker replaces torch.set_num_threads with a warning once its engine is up.
    threads = task_threads(ctx.cpus() if ctx else None, override=plan.model.torch_threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    key = (task.cache_key(), device, plan.model_revision)
    # a folder whose weights were replaced: the worker keeps the new revision only
    cache.discard_keys(lambda k: isinstance(k, tuple) and len(k) == 3 and k[:2] == key[:2] and k != key)
    started = time.perf_counter()
    loaded, fresh = cache.get_or_load(key, lambda: _load(task, plan.model, device))
    if not fresh:
        return loaded, cache.take_unreported(key)
    cost = {"load_seconds": time.perf_counter() - started, **getattr(loaded, "load_counts", {})}
    if defer:
        cache.note_unreported(key, cost)
        return loaded, None
    return loaded, cost


def apply_inference(df: "DataFrame", plan: InferencePlan) -> "DataFrame":
    """``df`` (``id``, task inputs, kept columns) -> ``id``, kept columns, results, status.

    Plus ``plan.metrics_column`` when set (the runner's way: works on classic and Connect sessions).
    """
    from pipeline.arrow_types import from_arrow_schema, to_arrow_schema

    schema = output_schema(plan, to_arrow_schema(df.schema))
    return df.mapInArrow(partial(score_partition, plan), from_arrow_schema(schema))
