"""Which device a Spark task's model runs on, and how many threads it may use."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["pick_device", "task_gpu_addresses", "task_threads"]


def pick_device(resources: Mapping[str, Any] | None = None, *, prefer: str = "auto") -> str:
    """The torch device string for this task.

    Order: the GPU address Spark assigned this task (``TaskContext.resources()["gpu"]``),
    else the first CUDA device, else the CPU. ``prefer="cpu"`` forces the CPU;
    ``prefer="cuda"`` fails loudly when no CUDA device is visible.
    """
    if prefer == "cpu":
        return "cpu"
    addresses = task_gpu_addresses(resources or {})
    if addresses:
        return f"cuda:{addresses[0]}"
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        cuda = False
    if cuda:
        return "cuda:0"
    if prefer == "cuda":
        raise RuntimeError(
            "model.device is 'cuda' but no CUDA device is visible to this worker; "
            "set model.device: auto to fall back to the CPU, or give executors GPUs "
            "(spark.executor.resource.gpu.amount, spark.task.resource.gpu.amount)"
        )
    return "cpu"


def task_gpu_addresses(resources: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The GPU addresses Spark assigned the running task (all of them: vLLM shards a model over them).

    ``resources`` defaults to the current ``TaskContext``'s; outside a Spark task it is empty.
    """
    if resources is None:
        try:
            from pyspark import TaskContext

            ctx = TaskContext.get()
        except ImportError:  # pragma: no cover - pyspark is a dependency
            ctx = None
        resources = ctx.resources() if ctx is not None else {}
    gpu = resources.get("gpu")
    return tuple(str(a) for a in (getattr(gpu, "addresses", None) or [])) if gpu is not None else ()


def task_threads(task_cpus: int | None, default: int = 1, *, override: int | None = None) -> int:
    """Torch intra-op threads for one task: the cores Spark gave it (``spark.task.cpus``).

    Spark runs one Python worker per concurrent task, so more threads than the
    task's cores oversubscribe the machine (measured in docs/benchmarks_precision.md:
    2 threads per worker on local[2] against 1). ``override``
    (``model.torch_threads``) wins when set; the bench uses it to measure that.
    """
    if override:
        return int(override)
    return max(1, int(task_cpus)) if task_cpus else default
