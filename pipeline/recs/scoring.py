"""Top-K scoring: users against the whole catalog, batch by batch, with deterministic ties.

Pure torch (no pyspark). The shape of the work:

- the item tower runs once per worker (:func:`item_matrix`, cached with the
  model by :class:`pipeline.tasks.recommend.RecommendTask`);
- users are cut into fixed-size batches; the last, ragged batch is padded by
  repeating its last row, so every matrix product has the same shape (BLAS
  picks kernels by shape; a fixed shape keeps results independent of where a
  user falls) and results of pad rows are dropped;
- each batch's scores are one ``[batch, n_items]`` product; seen items are
  set to ``-inf``; :func:`top_k_desc` picks the K best on the device.

Memory is about ``batch_size * n_items * 12`` bytes (scores, masks, a
cumulative count), never ``users * items``.

Ties: on equal score the item with the lower position wins, and positions
follow item id order (see :class:`pipeline.recs.features.IdIndex`), so the
lower item id wins. ``torch.topk`` alone does not promise which of equal
scores it returns; :func:`top_k_desc` re-selects rows where that matters.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from pipeline.recs.model import UserInputs

__all__ = ["item_matrix", "mask_seen_", "recommend_batches", "recommend_users", "seen_coordinates", "top_k_desc"]


def top_k_desc(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, positions)``, each ``[rows, min(k, n_items)]``, best first; ties go to the lower position.

    NaN counts as ``-inf``. Rows with fewer than ``k`` finite scores get
    ``-inf`` values at the end (their positions are meaningless; callers drop
    them).

    Fast path: ``torch.topk`` picks the right *set* unless items tied with the
    k-th value are left out (a tie straddling the cut); only those rows, seen
    from one extra top-k candidate, go through the exact selection.
    """
    rows, n_items = scores.shape
    k = min(k, n_items)
    if rows == 0 or k == 0:
        empty = scores.new_empty((rows, k))
        return empty, torch.empty((rows, k), dtype=torch.int64, device=scores.device)
    # One float reduction finds NaN (a NaN, or +inf next to a seen item's -inf, makes the sum NaN).
    if torch.isnan(scores.sum()):
        scores = scores.masked_fill(torch.isnan(scores), float("-inf"))
    if k == n_items:
        values, positions = torch.topk(scores, k, dim=1)
    else:
        # One extra candidate tells, per row, whether a tie straddles the cut: (k+1)-th == k-th.
        values, positions = torch.topk(scores, k + 1, dim=1)
        straddle = values[:, k] == values[:, k - 1]
        values, positions = values[:, :k].contiguous(), positions[:, :k].contiguous()
        if bool(straddle.any()):
            fix = straddle.nonzero().squeeze(1)
            values[fix], positions[fix] = _exact_top_k(scores[fix], k)
    # Order by (score desc, position asc): sort by position, then a stable sort by score.
    by_position = torch.argsort(positions, dim=1)
    values, positions = values.gather(1, by_position), positions.gather(1, by_position)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), positions.gather(1, order)


def _exact_top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best per row, taking the lowest positions among items tied at the k-th value (unordered)."""
    # The k-th largest value per row is unambiguous even when its index is not.
    kth = torch.topk(scores, k, dim=1, sorted=False).values.amin(dim=1, keepdim=True)
    above = scores > kth
    need = k - above.sum(dim=1, keepdim=True)
    at = scores == kth
    chosen = above | (at & (torch.cumsum(at, dim=1) <= need))  # exactly k per row
    positions = chosen.nonzero()[:, 1].view(scores.shape[0], k)
    return scores.gather(1, positions), positions


def seen_coordinates(seen: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(batch_row, item_position)`` pairs of the items seen by ``rows``; ``seen``/``offsets`` are CSR over users."""
    lo, hi = offsets[rows], offsets[rows + 1]
    row_of = np.repeat(np.arange(rows.size), hi - lo)
    cols = np.concatenate([seen[a:b] for a, b in zip(lo, hi)]) if rows.size else np.empty(0, np.int64)
    return row_of, cols


def mask_seen_(scores: torch.Tensor, seen: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> torch.Tensor:
    """Set ``scores[i, seen items of rows[i]]`` to ``-inf`` in place; ``seen``/``offsets`` are CSR over users."""
    row_of, cols = seen_coordinates(seen, offsets, rows)
    if row_of.size:
        scores[torch.from_numpy(row_of).to(scores.device), torch.from_numpy(cols).to(scores.device)] = float("-inf")
    return scores


def recommend_batches(
    n_users: int,
    score_rows: Callable[[np.ndarray], torch.Tensor],
    *,
    k: int,
    batch_size: int,
    seen: tuple[np.ndarray, np.ndarray] | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-K positions and scores for users ``0..n_users-1``: ``([n, k] int64, [n, k] float32)``.

    ``score_rows(rows)`` returns the ``[len(rows), n_items]`` scores of those
    users (rows are positions; the last batch is padded by repeating its last
    row). ``seen = (flat, offsets)`` excludes items per user. Slots without a
    candidate (a user who has seen almost everything) hold position -1 and
    score NaN. ``on_batch(real_rows, padded_rows)`` is called after each batch
    (metrics).
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    out_pos: np.ndarray | None = None
    out_val: np.ndarray | None = None
    for start in range(0, n_users, batch_size):
        rows = np.arange(start, min(start + batch_size, n_users), dtype=np.int64)
        padded = np.concatenate([rows, np.full(batch_size - rows.size, rows[-1], dtype=np.int64)])
        with torch.inference_mode():
            scores = score_rows(padded).float()
            if seen is not None:
                mask_seen_(scores, seen[0], seen[1], padded)
            values, positions = top_k_desc(scores, k)
            del scores  # free it before the next batch allocates its own: one score matrix at a time
        values_np = values[: rows.size].cpu().numpy()
        positions_np = positions[: rows.size].cpu().numpy()
        if out_pos is None:
            out_pos = np.full((n_users, values_np.shape[1]), -1, dtype=np.int64)
            out_val = np.full((n_users, values_np.shape[1]), np.nan, dtype=np.float32)
        finite = np.isfinite(values_np)
        out_pos[rows] = np.where(finite, positions_np, -1)
        out_val[rows] = np.where(finite, values_np, np.nan)
        if on_batch is not None:
            on_batch(int(rows.size), int(padded.size))
    if out_pos is None:  # no users
        return np.empty((0, k), dtype=np.int64), np.empty((0, k), dtype=np.float32)
    return out_pos, out_val


def item_matrix(model: torch.nn.Module) -> torch.Tensor:
    """The catalog's item vectors ``[n_items, dim]``, computed once (no autograd), on the model's device."""
    with torch.inference_mode():
        return model.item_vectors().detach().contiguous()


def recommend_users(
    model: torch.nn.Module,
    items: torch.Tensor,
    inputs: UserInputs,
    *,
    k: int,
    batch_size: int,
    exclude_seen: bool = True,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-K item positions and cosine scores for every user of ``inputs`` (a :class:`UserInputs`).

    ``items`` comes from :func:`item_matrix`. The user tower runs per batch,
    so user vectors never exist for more than ``batch_size`` users at a time.
    """
    device = items.device

    def score_rows(rows: np.ndarray) -> torch.Tensor:
        users = model.user_vectors(*inputs.tensors(rows, device))
        return users @ items.T

    seen = (inputs.seen, inputs.seen_offsets) if exclude_seen else None
    return recommend_batches(int(inputs.user_idx.size), score_rows, k=k, batch_size=batch_size, seen=seen,
                             on_batch=on_batch)
