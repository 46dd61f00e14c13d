"""The output columns of ``generate`` (and ``extract``): each row's completion, its token counts, why it ended.

:data:`RESULT_FIELDS` are the columns after any a subclass puts first
(``extract``'s ``fields``) and before the shared status columns;
:func:`generation_batch` builds a chunk's Arrow batch from its results, in
row order (a row that was not generated has nulls, and its ``finish_reason``
is ``error`` only when the row failed). A row's ``n_tokens`` is its prompt
tokens (0 when none).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from pipeline.generation.engine import GenerationResult
from pipeline.core.metrics import WorkerCounts
from pipeline.core.rows import Status

__all__ = ["RESULT_FIELDS", "count_finish_reasons", "generation_batch"]

RESULT_FIELDS = [
    pa.field("completion", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("completion_tokens", pa.int32()),
    pa.field("finish_reason", pa.string()),
    pa.field("latency_ms", pa.float64()),
]


def count_finish_reasons(counts: WorkerCounts, results: Sequence[GenerationResult | None]) -> None:
    """Add how the chunk's generated rows ended (``stop``, ``length``, ``error``) to ``finish_reasons``."""
    reasons: dict[str, int] = {}
    for result in results:
        if result is not None:
            reasons[result.finish_reason] = reasons.get(result.finish_reason, 0) + 1
    counts.merge({"finish_reasons": reasons})


def generation_batch(results: Sequence[GenerationResult | None], truncated: np.ndarray, status: np.ndarray,
                     error: np.ndarray, *, schema: pa.Schema, leading: Sequence[pa.Array] = ()) -> pa.RecordBatch:
    """The chunk's output: ``leading`` columns, :data:`RESULT_FIELDS`, then the status columns, as ``schema``."""
    def col(get: Any) -> list[Any]:
        return [None if r is None else get(r) for r in results]

    prompt_tokens = col(lambda r: r.prompt_tokens)
    columns = [
        *leading,
        pa.array(col(lambda r: None if r.finish_reason == "error" else r.completion), pa.string()),
        pa.array(prompt_tokens, pa.int32()),
        pa.array(col(lambda r: r.completion_tokens), pa.int32()),
        pa.array([r.finish_reason if r is not None else ("error" if s == Status.ERROR else None)
                  for r, s in zip(results, status)], pa.string()),
        pa.array(col(lambda r: r.latency_ms), pa.float64()),
        pa.array([p or 0 for p in prompt_tokens], pa.int32()),
        pa.array(truncated, pa.bool_()),
        pa.array(status.tolist(), pa.string()),
        pa.array(error.tolist(), pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
