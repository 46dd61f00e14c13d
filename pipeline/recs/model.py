"""The two-tower recommender: a torch module, how users are encoded for it, and its model folder.

Item tower: item id + genres (multi-hot) + release-year bucket, summed and
passed through a small residual MLP, L2-normalised. The item features are
buffers of the module, so the whole catalog's vectors come from one call
(:meth:`TwoTower.item_vectors`) with no input: scoring computes them once per
worker.

User tower: user id (index 0 = unknown user, so new users still get a vector)
+ one embedding per user feature + the mean embedding of the user's history
items, through the same kind of MLP, L2-normalised. During training the
target item is subtracted from the history mean, so the model cannot learn to
"find the target in the history" and training matches scoring, where the
history holds all seen items and the target is unseen.

Score = cosine(user, item) / temperature.

Saving and loading the versioned model folder lives in
:mod:`pipeline.recs.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from pipeline.recs.features import FeatureSpec, IdIndex, pack_lists

__all__ = ["FORMAT", "TwoTower", "TwoTowerSpec", "UserInputs", "encode_users"]

FORMAT = "two_tower/1"


@dataclass(frozen=True)
class TwoTowerSpec:
    """Everything needed to rebuild the module and encode inputs (saved as config.json + id_maps.json)."""

    user_ids: IdIndex
    item_ids: IdIndex
    user_features: tuple[FeatureSpec, ...]
    genres: tuple[str, ...]
    year: FeatureSpec
    dim: int = 64
    temperature: float = 0.05
    extra: dict[str, Any] = field(default_factory=dict)

    def config_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "dim": self.dim, "temperature": self.temperature,
            "n_users": len(self.user_ids), "n_items": len(self.item_ids),
            "user_features": [f.to_dict() for f in self.user_features],
            "genres": list(self.genres), "year": self.year.to_dict(), **self.extra,
        }


class _Tower(nn.Module):
    """Sum of input embeddings -> residual MLP -> L2 normalisation."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(x + self.mlp(x), dim=-1)


class TwoTower(nn.Module):
    """User and item towers sharing one embedding size; see the module docstring."""

    def __init__(self, spec: TwoTowerSpec, *, item_genres: np.ndarray, item_years: np.ndarray) -> None:
        super().__init__()
        self.spec = spec
        n_items, dim = len(spec.item_ids), spec.dim
        if item_genres.shape != (n_items, len(spec.genres)) or item_years.shape != (n_items,):
            raise ValueError(f"item features must have {n_items} rows: genres {item_genres.shape}, years {item_years.shape}")
        genres = torch.as_tensor(item_genres, dtype=torch.float32)
        self.register_buffer("item_genres", genres / genres.sum(1, keepdim=True).clamp(min=1.0))
        self.register_buffer("item_years", torch.as_tensor(item_years, dtype=torch.int64))
        self.item_id = nn.Embedding(n_items, dim)
        self.genre = nn.Linear(len(spec.genres), dim, bias=False)
        self.year = nn.Embedding(spec.year.size, dim)
        self.item_tower = _Tower(dim)
        self.user_id = nn.Embedding(len(spec.user_ids) + 1, dim)
        self.user_features = nn.ModuleList(nn.Embedding(f.size, dim) for f in spec.user_features)
        self.history = nn.Embedding(n_items, dim)
        self.user_tower = _Tower(dim)
        for emb in [self.item_id, self.year, self.user_id, self.history, *self.user_features]:
            nn.init.normal_(emb.weight, std=0.05)

    def item_vectors(self) -> torch.Tensor:
        """``[n_items, dim]`` unit vectors for the whole catalog, in item-id order."""
        x = self.item_id.weight + self.genre(self.item_genres) + self.year(self.item_years)
        return self.item_tower(x)

    def user_vectors(
        self,
        user_idx: torch.Tensor,
        features: torch.Tensor,
        history: torch.Tensor,
        history_offsets: torch.Tensor,
        exclude: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[n, dim]`` unit vectors; ``history`` is flat item positions cut by ``history_offsets`` (n + 1).

        ``exclude`` (training only) holds per row an item position to leave
        out of that row's history mean (the target), or -1.
        """
        n = user_idx.shape[0]
        x = self.user_id(user_idx)
        for i, emb in enumerate(self.user_features):
            x = x + emb(features[:, i])
        lengths = (history_offsets[1:] - history_offsets[:-1]).to(x.dtype)
        hist_sum = nn.functional.embedding_bag(history, self.history.weight, history_offsets[:-1], mode="sum")
        if hist_sum.shape[0] < n:  # embedding_bag drops trailing empty bags
            hist_sum = torch.cat([hist_sum, hist_sum.new_zeros(n - hist_sum.shape[0], hist_sum.shape[1])])
        if exclude is not None:
            present = exclude >= 0
            hist_sum = hist_sum - self.history(exclude.clamp(min=0)) * present.unsqueeze(1).to(x.dtype)
            lengths = lengths - present.to(x.dtype)
        x = x + hist_sum / lengths.clamp(min=1.0).unsqueeze(1)
        return self.user_tower(x)


@dataclass(frozen=True)
class UserInputs:
    """One chunk of users encoded for the user tower, plus what scoring must exclude."""

    user_idx: np.ndarray          # [n] int64; 0 = user unknown to the model
    features: np.ndarray          # [n, n_features] int64
    history: np.ndarray           # flat item positions (latest max_history per user)
    history_offsets: np.ndarray   # [n + 1]
    seen: np.ndarray              # flat item positions of everything seen (known items only)
    seen_offsets: np.ndarray      # [n + 1]
    truncated: np.ndarray         # [n] bool: history longer than max_history

    def tensors(self, rows: np.ndarray, device: str | torch.device) -> tuple[torch.Tensor, ...]:
        """The user-tower inputs for ``rows`` (positions in this chunk) as tensors on ``device``."""
        lo, hi = self.history_offsets[rows], self.history_offsets[rows + 1]
        hist = np.concatenate([self.history[a:b] for a, b in zip(lo, hi)]) if rows.size else np.empty(0, np.int64)
        offsets = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(hi - lo, out=offsets[1:])
        return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device)
                     for a in (self.user_idx[rows], self.features[rows], hist, offsets))


def encode_users(
    spec: TwoTowerSpec,
    user_ids: Sequence[int] | np.ndarray,
    features: dict[str, Sequence[Any] | np.ndarray],
    seen_item_ids: Sequence[Sequence[int] | np.ndarray | None],
    *,
    max_history: int,
) -> UserInputs:
    """Encode raw user rows; ``seen_item_ids`` lists each user's items oldest first (None = none).

    Items the model does not know are dropped from history and exclusion
    alike (they cannot be recommended anyway).
    """
    missing = [f.name for f in spec.user_features if f.name not in features]
    if missing:
        raise KeyError(f"user feature column(s) {missing} missing; the model was trained with "
                       f"{[f.name for f in spec.user_features]}")
    uid = np.asarray(user_ids, dtype=np.int64)
    user_idx = spec.user_ids.positions(uid) + 1  # unknown (-1) -> 0
    feats = np.stack([f.encode(features[f.name]) for f in spec.user_features], axis=1) if spec.user_features \
        else np.zeros((uid.size, 0), dtype=np.int64)
    seen_lists = [None if s is None else spec.item_ids.positions(np.asarray(s, dtype=np.int64)) for s in seen_item_ids]
    seen_lists = [None if s is None else s[s >= 0] for s in seen_lists]
    seen, seen_offsets = pack_lists(seen_lists)
    truncated = np.array([s is not None and len(s) > max_history for s in seen_lists], dtype=bool)
    history, history_offsets = pack_lists([None if s is None else s[-max_history:] for s in seen_lists])
    return UserInputs(user_idx, feats, history, history_offsets, seen, seen_offsets, truncated)
