"""Offline evaluation: a time-based hold-out, HitRate@K / Recall@K, and the popularity baseline.

The hold-out is per user: each user's ``n`` latest interactions (by
timestamp, ties broken by item id so the split is deterministic) are held
out; everything before trains the model and counts as "seen". Ranking is
over the full catalog with seen items excluded, the same as the nightly job.

- HitRate@K: share of users with at least one held-out item in their top K.
- Recall@K: per user, held-out items found in the top K / held-out items
  (capped at K), averaged over users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from pipeline.recs.features import IdIndex, pack_lists
from pipeline.recs.scoring import recommend_batches

__all__ = ["Holdout", "popularity_top_k", "ranking_metrics", "seen_lists", "split_holdout", "summarize"]


@dataclass(frozen=True)
class Holdout:
    """Train interactions, held-out interactions, and the users with something held out."""

    train: pd.DataFrame
    test: pd.DataFrame

    @property
    def users(self) -> np.ndarray:
        return np.sort(self.test["user_id"].unique())


def split_holdout(interactions: pd.DataFrame, n: int) -> Holdout:
    """Hold out each user's ``n`` latest interactions (users keep at least one for training).

    ``n = 0`` trains on everything (the production refresh) and holds out nothing.
    """
    if n < 0:
        raise ValueError(f"holdout per user must be >= 0, got {n}")
    ordered = interactions.sort_values(["user_id", "timestamp", "item_id"], kind="stable", ignore_index=True)
    if n == 0:
        return Holdout(train=ordered, test=ordered.iloc[:0])
    from_end = ordered.groupby("user_id").cumcount(ascending=False)
    size = ordered.groupby("user_id")["item_id"].transform("size")
    test = (from_end < n) & (size > n)
    return Holdout(train=ordered[~test].reset_index(drop=True), test=ordered[test].reset_index(drop=True))


def seen_lists(interactions: pd.DataFrame, user_ids: np.ndarray) -> list[np.ndarray]:
    """Each user's item ids, oldest first (ties by item id), in the order of ``user_ids``; empty if none."""
    ordered = interactions.sort_values(["user_id", "timestamp", "item_id"], kind="stable")
    groups = {u: g.to_numpy(dtype=np.int64) for u, g in ordered.groupby("user_id", sort=False)["item_id"]}
    empty = np.empty(0, dtype=np.int64)
    return [groups.get(int(u), empty) for u in user_ids]


def ranking_metrics(recommended: np.ndarray, relevant: list[np.ndarray], *, k: int) -> dict[str, float]:
    """HitRate@k and Recall@k of ``recommended`` (``[n_users, >=k]`` item ids, -1 = empty slot).

    Users with nothing relevant are skipped; an empty evaluation is an error,
    not a silent zero.
    """
    if recommended.shape[0] != len(relevant):
        raise ValueError(f"{recommended.shape[0]} recommendation rows but {len(relevant)} relevant lists")
    hits, recalls = [], []
    for recs, rel in zip(recommended[:, :k], relevant):
        if rel.size == 0:
            continue
        found = np.isin(rel, recs[recs >= 0]).sum()
        hits.append(found > 0)
        recalls.append(found / min(rel.size, k))
    if not hits:
        raise ValueError("no user has held-out interactions to evaluate; is holdout_per_user 0?")
    return {f"hit_rate@{k}": float(np.mean(hits)), f"recall@{k}": float(np.mean(recalls)), "users": len(hits)}


def popularity_top_k(
    train: pd.DataFrame, items: IdIndex, user_ids: np.ndarray, *, k: int, batch_size: int = 1024
) -> np.ndarray:
    """The baseline: each user's ``k`` most popular unseen items (train counts; lower id wins ties).

    Runs through the same batched top-K as the model, so exclusion and
    tie-breaking are identical and the comparison is fair.
    """
    counts = np.bincount(np.maximum(items.positions(train["item_id"].to_numpy()), 0), minlength=len(items))
    popularity = torch.from_numpy(counts.astype(np.float32))
    positions_seen = (items.positions(s) for s in seen_lists(train, user_ids))
    seen = pack_lists([p[p >= 0] for p in positions_seen])
    positions, _ = recommend_batches(len(user_ids), lambda rows: popularity.expand(rows.size, -1).clone(),
                                     k=k, batch_size=batch_size, seen=seen)
    return np.where(positions >= 0, items.ids[np.maximum(positions, 0)], -1)


def summarize(model_metrics: dict[str, Any], baseline_metrics: dict[str, Any], *, k: int) -> dict[str, Any]:
    """Model vs popularity side by side, with the relative lift in HitRate@k."""
    hr, base = model_metrics[f"hit_rate@{k}"], baseline_metrics[f"hit_rate@{k}"]
    return {"model": model_metrics, "popularity": baseline_metrics,
            f"hit_rate@{k}_lift": (hr / base - 1.0) if base > 0 else None}
