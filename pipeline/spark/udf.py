"""The executor side: an Arrow ``mapInArrow`` function that scores each chunk with a cached model.

Everything here is importable (never defined in ``__main__``), so the
per-worker model cache survives from task to task in a reused Python worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.metrics import WorkerCounts, WorkerProgress, merge_counts

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame

__all__ = ["CountsParam", "InferencePlan", "apply_inference", "output_schema", "score_partition"]


class CountsParam(AccumulatorParam):
    """Merges the executors' nested count dicts on the driver."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        return merge_counts(value1, value2)


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
    # fault injection for tests and drills (pipeline.faults); empty in production
    faults: tuple[tuple[str, Any], ...] = ()
    # the registered task class; pickled by reference, so a worker imports (and registers) its module
    task_class: Any = None

    def build_task(self) -> Any:
        if self.task_class is not None:
            return self.task_class(self.task, model=self.model, batching=self.batching)
        from pipeline.tasks import build_task

        return build_task(self.task, model=self.model, batching=self.batching)


def output_schema(plan: InferencePlan, input_schema: pa.Schema) -> pa.Schema:
    """``id``, the kept source columns, then the task's result and status columns."""
    task_schema = plan.build_task().output_schema()
    kept = [input_schema.field(c) for c in ("id", *plan.keep_columns)]
    return pa.schema(kept + list(task_schema))


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


def score_partition(
    plan: InferencePlan, counts_acc: "Accumulator[dict] | None", batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Score one Spark task's Arrow chunks: model from the per-worker cache, results in input order."""
    from pyspark import TaskContext

    from pipeline import faults
    from pipeline.models import cache
    from pipeline.models.device import pick_device, task_threads

    ctx = TaskContext.get()
    faults.activate(dict(plan.faults))
    worker = cache.worker_id()
    progress = None
    if plan.progress_interval_s:
        part = f" task {ctx.partitionId()}" if ctx else ""
        progress = WorkerProgress(f"{plan.job} worker {worker}{part}", plan.progress_interval_s)
    counts = WorkerCounts(on_batch=progress, worker=worker, task=ctx.partitionId() if ctx else None)
    counts.merge({"tasks_per_worker": {worker: 1}})
    task = plan.build_task()
    device = pick_device(ctx.resources() if ctx else None, prefer=plan.model.device)

    import torch

    # checked on every task: a reused worker keeps whatever the previous task set. Only called on a
    # change: vLLM's CPU worker replaces torch.set_num_threads with a warning once its engine is up.
    threads = task_threads(ctx.cpus() if ctx else None, override=plan.model.torch_threads)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    key = (task.cache_key(), device)
    started = time.perf_counter()
    loaded, fresh = cache.get_or_load(key, lambda: _load(task, plan.model, device))
    if fresh:
        counts.merge({"model_loads": {worker: 1}, "load_seconds": time.perf_counter() - started})
        counts.merge(getattr(loaded, "load_counts", {}))  # e.g. the precision the accuracy gate chose
    if progress is not None:
        progress.restart()  # rates from the first batch on, not from the model load
    keep = ("id", *plan.keep_columns)
    for n, batch in enumerate(batches):
        t0 = time.perf_counter()
        inputs = pa.RecordBatch.from_arrays([batch.column(c) for c in plan.input_columns], names=list(plan.input_columns))
        result = task.process(loaded, inputs, counts)
        arrays = [batch.column(c) for c in keep] + list(result.columns)
        names = list(keep) + result.schema.names
        counts.add("infer_seconds", time.perf_counter() - t0)
        yield pa.RecordBatch.from_arrays(arrays, names=names)
        if n == 0 and plan.faults and ctx is not None:
            faults.on_task_start(ctx.partitionId(), ctx.attemptNumber())
    if counts_acc is not None:
        counts_acc.add(counts.counts)


def apply_inference(df: "DataFrame", plan: InferencePlan, counts_acc: "Accumulator[dict] | None") -> "DataFrame":
    """``df`` (``id``, task inputs, kept columns) -> ``id``, kept columns, results, status."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    schema = output_schema(plan, to_arrow_schema(df.schema, timezone="UTC"))
    return df.mapInArrow(partial(score_partition, plan, counts_acc), from_arrow_schema(schema))
