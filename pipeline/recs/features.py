"""Turning raw user and item columns into the integer indices the two-tower model embeds.

Everything here is numpy and fixed at training time, then saved in the model
folder's ``config.json`` so scoring encodes a user exactly as training did:

- a :class:`FeatureSpec` per user feature: a category vocabulary
  (``gender``, ``occupation``) or numeric bucket boundaries (``age``);
  index 0 is reserved for null / unseen values;
- an :class:`IdIndex` from sorted raw ids (``user_id``, ``item_id``) to
  dense positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import numpy as np
import pandas as pd

__all__ = ["FeatureSpec", "IdIndex", "infer_feature_spec", "pack_lists"]

_MAX_VOCAB = 10_000


@dataclass(frozen=True)
class FeatureSpec:
    """How one raw column becomes an embedding index (0 means null or unknown)."""

    name: str
    kind: Literal["category", "bucket"]
    vocab: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()

    @property
    def size(self) -> int:
        """Rows of this feature's embedding table (index 0 included)."""
        return len(self.vocab) + 1 if self.kind == "category" else len(self.boundaries) + 2

    def encode(self, values: Sequence[Any] | np.ndarray | pd.Series) -> np.ndarray:
        """int64 indices for ``values``: category position + 1, or bucket + 1; 0 for null/unknown."""
        series = pd.Series(values, dtype=object if self.kind == "category" else None)
        if self.kind == "category":
            lookup = {v: i + 1 for i, v in enumerate(self.vocab)}
            return np.fromiter((lookup.get(str(v), 0) if v is not None and v == v else 0 for v in series),
                               dtype=np.int64, count=len(series))
        numbers = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)
        out = np.searchsorted(np.asarray(self.boundaries, dtype=np.float64), numbers, side="right") + 1
        out[np.isnan(numbers)] = 0
        return out.astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "vocab": list(self.vocab), "boundaries": list(self.boundaries)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FeatureSpec":
        return cls(name=data["name"], kind=data["kind"], vocab=tuple(data.get("vocab", ())),
                   boundaries=tuple(float(b) for b in data.get("boundaries", ())))


def infer_feature_spec(name: str, values: pd.Series, *, buckets: int = 8) -> FeatureSpec:
    """A spec fitted on training data: quantile buckets for numbers, a vocabulary for anything else.

    The vocabulary keeps the ``10,000`` most frequent values (sorted, so the
    spec does not depend on row order); rarer values encode as unknown.
    """
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        numbers = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=np.float64)
        if numbers.size == 0:
            raise ValueError(f"feature {name!r} has no non-null values to fit buckets on")
        qs = np.quantile(numbers, np.linspace(0, 1, buckets + 1)[1:-1])
        return FeatureSpec(name, "bucket", boundaries=tuple(float(q) for q in np.unique(qs)))
    counts = values.dropna().astype(str).value_counts()
    vocab = sorted(counts.index[:_MAX_VOCAB].tolist())
    return FeatureSpec(name, "category", vocab=tuple(vocab))


@dataclass(frozen=True)
class IdIndex:
    """Sorted raw ids and their dense positions; positions follow id order, so lower id = lower position."""

    ids: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        ids = np.asarray(self.ids, dtype=np.int64)
        if ids.ndim != 1 or (ids.size > 1 and not np.all(ids[1:] > ids[:-1])):
            raise ValueError("IdIndex needs unique ids sorted ascending")
        object.__setattr__(self, "ids", ids)

    @classmethod
    def from_values(cls, values: Sequence[int] | np.ndarray) -> "IdIndex":
        return cls(np.unique(np.asarray(values, dtype=np.int64)))

    def __len__(self) -> int:
        return int(self.ids.size)

    def positions(self, values: Sequence[int] | np.ndarray) -> np.ndarray:
        """Position of each value, ``-1`` for ids not in the index."""
        vals = np.asarray(values, dtype=np.int64)
        if self.ids.size == 0:
            return np.full(vals.shape, -1, dtype=np.int64)
        pos = np.searchsorted(self.ids, vals)
        pos_clipped = np.minimum(pos, self.ids.size - 1)
        return np.where(self.ids[pos_clipped] == vals, pos_clipped, -1).astype(np.int64)


def pack_lists(lists: Sequence[Sequence[int] | np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged int lists as ``(flat, offsets)`` with ``offsets`` of length ``n + 1`` (None counts as empty)."""
    lengths = np.fromiter((0 if x is None else len(x) for x in lists), dtype=np.int64, count=len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    parts = [np.asarray(x, dtype=np.int64) for x in lists if x is not None and len(x)]
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return flat, offsets
