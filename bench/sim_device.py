"""``bench_sim_embed``: the ``embed`` task on a simulated GPU that takes the time a given device would.

A bench-only task kind (like ``bench/null_forward.py``; registered by
:func:`register`, nothing of it ships in ``pipeline/tasks``). Everything but the
model is real: the tokenizer, the length-sorted batches, collation, the
overlapped worker (``pipeline/tasks/_feed.py``), Arrow, the Delta write. The
forward pass sleeps, which releases the GIL as a CUDA wait does, for the time
the configured device would take:

- ``device_docs_s``: documents per second (a batch of n rows takes n / rate), or
- ``device_tokens_s``: padded tokens per second (rows x padded length / rate),

and returns unit vectors of the model's width (384 for MiniLM), so the output
is as large as real embeddings. Tasks naming the same ``device_lock`` file share
one device: a forward holds an exclusive ``flock`` on it while it "runs", so two
Python workers on one simulated GPU (``spark.task.resource.gpu.amount=0.5``)
queue for it as kernels from two processes do on one GPU.

With ``device_log`` set (a folder), every forward and every task appends one
line to ``<folder>/<pid>.log``: ``fwd <start> <seconds>`` (the device's time) and
``task <start> <end> <rows>``; :func:`busy_fraction` reads them back. The
device's busy fraction is its forward seconds over the span from the first
task's start to the last task's end.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import zlib
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Literal

import numpy as np
from pydantic import Field, model_validator

from pipeline.registry import register_task
from pipeline.tasks.base import LoadedText
from pipeline.tasks.embed import EmbedTask, EmbedTaskConfig

__all__ = ["SimEmbedConfig", "SimEmbedTask", "busy_fraction", "register"]

KIND = "bench_sim_embed"
_VECTORS = 4096  # distinct unit vectors handed out; made once per worker


class SimEmbedConfig(EmbedTaskConfig):
    """``embed``'s settings plus the simulated device's speed; no model forward pass runs."""

    kind: Literal["bench_sim_embed"] = "bench_sim_embed"  # type: ignore[assignment]
    device_docs_s: float | None = Field(None, gt=0, description="documents per second the device runs")
    device_tokens_s: float | None = Field(None, gt=0, description="padded tokens per second the device runs")
    device_lock: str | None = Field(None, description="a file: tasks naming the same one share one device")
    device_log: str | None = Field(None, description="a folder for forward and task lines (busy fraction)")

    @model_validator(mode="after")
    def _one_speed(self) -> "SimEmbedConfig":
        if (self.device_docs_s is None) == (self.device_tokens_s is None):
            raise ValueError("bench_sim_embed: set exactly one of device_docs_s and device_tokens_s "
                             f"(got {self.device_docs_s!r} and {self.device_tokens_s!r})")
        return self


class SimEmbedTask(EmbedTask):
    """Tokenises, batches and collates like ``embed``; each batch sleeps for the simulated device's time."""

    kind: ClassVar[str] = KIND
    model_kind: ClassVar[str] = "embed"
    _unit: ClassVar[dict[int, np.ndarray]] = {}

    def device_seconds(self, input_ids: np.ndarray) -> float:
        """The simulated device's time for one padded batch."""
        if self.config.device_docs_s is not None:
            return input_ids.shape[0] / self.config.device_docs_s
        return input_ids.size / self.config.device_tokens_s

    def _embed(self, loaded: LoadedText, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        seconds = self.device_seconds(input_ids)
        with _device(self.config.device_lock):
            started = time.time()
            time.sleep(seconds)  # releases the GIL, as a CUDA wait does
        _log(self.config.device_log, f"fwd {started:.6f} {seconds:.6f}")
        dim = int(getattr(loaded.model.config, "hidden_size", 384))
        if dim not in self._unit:
            v = np.random.default_rng(0).standard_normal((_VECTORS, dim), dtype=np.float32)
            self._unit[dim] = v / np.linalg.norm(v, axis=1, keepdims=True)
        start = zlib.crc32(np.ascontiguousarray(input_ids[:, :4]).tobytes())  # deterministic per batch
        return self._unit[dim][(start + np.arange(input_ids.shape[0])) % _VECTORS]

    def process_stream(self, loaded: Any, chunks: Iterable[Any], counts: Any, *, cpus: int = 1) -> Iterator[Any]:
        started, rows = time.time(), 0
        for out in super().process_stream(loaded, chunks, counts, cpus=cpus):
            rows += out.num_rows
            yield out
        _log(self.config.device_log, f"task {started:.6f} {time.time():.6f} {rows}")


@contextlib.contextmanager
def _device(lock: str | None) -> Iterator[None]:
    if lock is None:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # blocks without the GIL while another worker holds the device
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _log(folder: str | None, line: str) -> None:
    if folder is not None:
        with open(Path(folder) / f"{os.getpid()}.log", "a") as handle:
            handle.write(line + "\n")


def busy_fraction(folder: str | Path) -> dict[str, float]:
    """``busy`` (device seconds / task span), the span, device seconds, tasks and rows from ``device_log`` lines.

    Forwards outside every task (a label embedding at load) are not counted.
    """
    tasks, forwards = [], []
    for path in Path(folder).glob("*.log"):
        for line in path.read_text().splitlines():
            kind, *values = line.split()
            if kind == "task":
                tasks.append((float(values[0]), float(values[1]), int(values[2])))
            elif kind == "fwd":
                forwards.append((float(values[0]), float(values[1])))
    if not tasks:
        raise ValueError(f"{folder}: no task lines; was device_log set and did the run score rows?")
    start, end = min(t[0] for t in tasks), max(t[1] for t in tasks)
    device = sum(s for t, s in forwards if start <= t <= end)
    span = end - start
    return {"busy": device / span if span > 0 else 0.0, "span_s": span, "device_s": device,
            "tasks": len(tasks), "rows": sum(t[2] for t in tasks)}


def register() -> Any:
    """Register the kind on the driver (idempotent); workers import the classes as ``bench.sim_device`` by name."""
    return register_task(SimEmbedConfig, SimEmbedTask)
