"""``bench_null_embed``: the ``embed`` task with its forward pass replaced by random unit vectors.

A bench-only task kind (registered by :func:`register`, nothing of it ships in
``pipeline/tasks``) that measures everything the pipeline does around the model
on the same rows: read, plan and deal, Arrow to and from the workers, the real
tokenizer, length-sorted batches and collation, pooling's output shape (384
float32 per row, incompressible like real embeddings), the label scores, the
persist, the checks, the Parquet files, the Delta commit. ``bench/bench_limit.py``
runs it next to the real pipeline: the real run's wall time should be about its
forward seconds per worker plus this run's wall time, and ``raw / (raw + this)``
is the best ratio to the limit the pipeline can reach at that size.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar, Literal

import numpy as np

from pipeline.registry import register_task
from pipeline.tasks.base import LoadedText
from pipeline.tasks.embed import EmbedTask, EmbedTaskConfig

__all__ = ["NullEmbedConfig", "NullEmbedTask", "register"]

KIND = "bench_null_embed"


class NullEmbedConfig(EmbedTaskConfig):
    """``embed``'s settings; the model's forward pass is not run (bench/null_forward.py)."""

    kind: Literal["bench_null_embed"] = "bench_null_embed"  # type: ignore[assignment]


class NullEmbedTask(EmbedTask):
    """Tokenises, batches and collates like ``embed``; each batch's vectors are random, not the model's."""

    kind: ClassVar[str] = KIND
    model_kind: ClassVar[str] = "embed"

    def _embed(self, loaded: LoadedText, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        dim = int(getattr(loaded.model.config, "hidden_size", 384))
        seed = zlib.crc32(np.ascontiguousarray(input_ids[:, :4]).tobytes())  # deterministic per batch
        vectors = np.random.default_rng(seed).standard_normal((input_ids.shape[0], dim), dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def register() -> Any:
    """Register the kind on the driver (idempotent); workers import the classes as ``bench.null_forward`` by name."""
    return register_task(NullEmbedConfig, NullEmbedTask)
