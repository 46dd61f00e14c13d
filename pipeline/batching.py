"""The batching core: length-sorted, fixed-size, padded batches within one Arrow chunk.

Pure numpy; no torch, no pyspark. The worker tokenises a chunk, asks
:func:`plan_batches` how to cut it, builds each batch with :func:`collate`, runs
the model, and writes each batch's results back at ``batch.indices`` so the
chunk's original row order is restored.

Sorting by token count (not characters) is what makes padding cheap: on real
review text, batches of 64 cut from a length-sorted 10,000-row chunk carry
about 98% real tokens; unsorted batches about 20%.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Batch", "collate", "pad_multiple", "padded_length", "padding_efficiency", "plan_batches"]


@dataclass(frozen=True)
class Batch:
    """Rows ``indices`` (positions in the chunk) padded to ``length`` tokens."""

    indices: np.ndarray
    length: int

    @property
    def size(self) -> int:
        return int(self.indices.size)

    @property
    def padded_tokens(self) -> int:
        return self.size * self.length


def pad_multiple(setting: int | str, device_type: str) -> int:
    """The padding multiple to use: ``auto`` is 8 on CUDA (tensor-core friendly shapes) and 1 on CPU.

    On a CPU rounding up buys nothing: it only adds padded tokens, which for
    short texts (tweets, reviews) costs several percent of throughput.
    """
    if setting == "auto":
        return 8 if device_type == "cuda" else 1
    return int(setting)


def padded_length(longest: int, *, multiple: int = 8, cap: int | None = None) -> int:
    """``longest`` rounded up to a multiple of ``multiple``, never above ``cap``.

    >>> padded_length(13), padded_length(16), padded_length(250, cap=256), padded_length(255, cap=254)
    (16, 16, 256, 254)
    """
    if longest <= 0:
        return 0
    length = -(-longest // multiple) * multiple
    return min(length, cap) if cap is not None else length


def plan_batches(
    lengths: Sequence[int] | np.ndarray,
    *,
    batch_size: int,
    pad_to_multiple_of: int = 8,
    max_length: int | None = None,
    sort: bool = True,
) -> list[Batch]:
    """Cut rows with token counts ``lengths`` into batches of at most ``batch_size`` rows.

    With ``sort`` the rows are ordered by length first (stable, so equal lengths
    keep their order), which puts similar lengths together; each batch is padded
    to its own longest row rounded up to ``pad_to_multiple_of`` (capped at
    ``max_length``). Every row appears in exactly one batch; the last batch may
    be ragged (smaller). An empty input gives no batches.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {lens.shape}")
    order = np.argsort(lens, kind="stable") if sort else np.arange(lens.size)
    batches = []
    for start in range(0, lens.size, batch_size):
        idx = order[start : start + batch_size]
        longest = int(lens[idx].max())
        batches.append(Batch(idx, padded_length(longest, multiple=pad_to_multiple_of, cap=max_length)))
    return batches


def padding_efficiency(lengths: Sequence[int] | np.ndarray, batches: Sequence[Batch]) -> float:
    """Real tokens / padded tokens over ``batches`` (1.0 is no padding at all)."""
    padded = sum(b.padded_tokens for b in batches)
    if padded == 0:
        return 1.0
    lens = np.asarray(lengths, dtype=np.int64)
    return float(sum(int(lens[b.indices].sum()) for b in batches)) / padded


def collate(token_ids: Sequence[Sequence[int]], batch: Batch, *, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)`` int64 arrays of shape ``[batch.size, batch.length]``, right-padded."""
    ids = np.full((batch.size, batch.length), pad_id, dtype=np.int64)
    mask = np.zeros((batch.size, batch.length), dtype=np.int64)
    for row, i in enumerate(batch.indices):
        seq = token_ids[i]
        n = len(seq)
        if n > batch.length:
            raise ValueError(f"row {int(i)} has {n} tokens but its batch is padded to {batch.length}")
        ids[row, :n] = seq
        mask[row, :n] = 1
    return ids, mask
