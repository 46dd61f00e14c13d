"""``recommend``: top-K items per user from a two-tower model, as a :class:`pipeline.tasks.base.Task`.

One input row is one user: ``user_id``, the user's seen item ids (a list
column, oldest first, e.g. built in Spark with ``collect_list`` over the
interactions) and the user feature columns the model was trained with. One
output row per input row, in order: ``item_ids`` (list<int64>, best first)
and ``scores`` (list<float32>, cosine similarity), plus the usual status
columns. The Spark side explodes the lists into ``(user_id, item_id, score,
rank)`` rows; keeping lists here keeps the task protocol's one-row-per-row
contract.

Status columns, reused from the text tasks with these meanings:

- ``n_tokens``: history items that fed the user tower (at most ``max_history``);
- ``truncated`` / status ``truncated``: the history was longer than ``max_history``
  (only the latest items were used; all were still excluded);
- ``skipped_null``: ``user_id`` is null; the lists are null.

Unknown users (not in the model's id map) are still scored from their
features and history; they are counted as ``unknown_users``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Hashable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.metrics import WorkerCounts
from pipeline.recs.config import RecommendTaskConfig
from pipeline.tasks.base import STATUS_FIELDS

__all__ = ["LoadedRecommender", "RecommendTask"]


@dataclass(frozen=True)
class LoadedRecommender:
    """What a worker keeps per model: the module, the catalog's item vectors (computed once), the revision."""

    model: Any
    items: Any
    revision: str
    device: str


class RecommendTask:
    """Scores Arrow chunks of users against the whole catalog; see the module docstring."""

    kind: ClassVar[str] = "recommend"

    def __init__(self, config: RecommendTaskConfig, *, model: ModelConfig,
                 batching: BatchingConfig | None = None) -> None:
        # batching is accepted for the common build_task signature; users per
        # batch come from config.batch_size (rows are not token sequences).
        self.config = config
        self.model = model

    @property
    def input_columns(self) -> tuple[str, ...]:
        """Columns every chunk must carry: the user id, the seen list and the feature columns."""
        return ("user_id", self.config.seen_column, *self.config.feature_columns)

    def output_schema(self) -> pa.Schema:
        return pa.schema([
            pa.field("item_ids", pa.list_(pa.int64())),
            pa.field("scores", pa.list_(pa.float32())),
            *STATUS_FIELDS,
        ])

    def cache_key(self) -> Hashable:
        # The item matrix depends only on the model, not on k or batch size.
        return (self.kind, self.model.path, self.model.device)

    def load(self, model_dir: Path, device: str) -> LoadedRecommender:
        """Load the model folder (or model root with LATEST) and compute the item tower once."""
        from pipeline.recs.registry import load_two_tower
        from pipeline.recs.scoring import item_matrix

        model, revision = load_two_tower(model_dir, device=device)
        trained = [f.name for f in model.spec.user_features]
        if sorted(trained) != sorted(self.config.feature_columns):
            raise ValueError(
                f"model {model_dir} was trained with user features {trained} but task.feature_columns is "
                f"{list(self.config.feature_columns)}; set task.feature_columns to {trained}"
            )
        return LoadedRecommender(model, item_matrix(model), revision, device)

    def process(self, loaded: LoadedRecommender, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        from pipeline.recs.model import encode_users
        from pipeline.recs.scoring import recommend_users

        missing = [c for c in self.input_columns if c not in chunk.schema.names]
        if missing:
            raise KeyError(f"recommend task: input column(s) {missing} missing from the chunk (it has "
                           f"{chunk.schema.names}); the user rows need {list(self.input_columns)}")
        n = chunk.num_rows
        user_col = chunk.column(chunk.schema.get_field_index("user_id"))
        valid = ~np.asarray(user_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        rows = np.flatnonzero(valid)
        seen = _seen_lists(chunk.column(chunk.schema.get_field_index(self.config.seen_column)), rows)
        spec = loaded.model.spec
        user_ids = pc.cast(user_col, pa.int64()).to_numpy(zero_copy_only=False)[rows].astype(np.int64)
        features = {c: chunk.column(chunk.schema.get_field_index(c)).to_numpy(zero_copy_only=False)[rows]
                    for c in self.config.feature_columns}
        inputs = encode_users(spec, user_ids, features, seen, max_history=self.config.max_history)

        def on_batch(real: int, padded: int) -> None:
            # Rows play the part of tokens: padding efficiency = real users / padded users.
            counts.add_batch(rows=real, tokens=real, padded_tokens=padded)

        positions, scores = recommend_users(loaded.model, loaded.items, inputs, k=self.config.k,
                                            batch_size=self.config.batch_size,
                                            exclude_seen=self.config.exclude_seen, on_batch=on_batch)
        item_ids = np.where(positions >= 0, spec.item_ids.ids[np.maximum(positions, 0)], -1)

        n_history = np.zeros(n, dtype=np.int32)
        n_history[rows] = np.diff(inputs.history_offsets)
        truncated = np.zeros(n, dtype=bool)
        truncated[rows] = inputs.truncated
        status = np.where(valid, np.where(truncated, "truncated", "ok"), "skipped_null").astype(object)

        counts.add("rows", n)
        counts.add("chunks")
        counts.add("unknown_users", int((inputs.user_idx == 0).sum()))
        counts.add("items_scored", int(rows.size) * len(spec.item_ids))
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        keep = positions >= 0
        counts.add("recommendations", int(keep.sum()))
        columns = [
            _ragged(item_ids, keep, rows, n, pa.int64()),
            _ragged(scores, keep, rows, n, pa.float32()),
            pa.array(n_history, pa.int32()),
            pa.array(truncated, pa.bool_()),
            pa.array(status.tolist(), pa.string()),
            pa.array([None] * n, pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())


def _seen_lists(column: pa.Array, rows: np.ndarray) -> list[np.ndarray]:
    """The list column's values for ``rows`` as int64 arrays (a null list is empty), without Python lists."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise TypeError(f"seen column must be a list of item ids, got {column.type}")
    column = column.cast(pa.list_(pa.int64()))
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(column).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    # Null item ids become -1, which no catalog knows, so encode_users drops them.
    return [flat[starts[i]:starts[i + 1]] for i in rows]


def _ragged(values: np.ndarray, keep: np.ndarray, rows: np.ndarray, n: int, value_type: pa.DataType) -> pa.Array:
    """A list array of length ``n``: row ``rows[j]`` gets ``values[j][keep[j]]``, other rows are null."""
    lengths = np.zeros(n, dtype=np.int32)
    lengths[rows] = keep.sum(axis=1)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    flat = pa.array(values[keep], value_type)  # row-major: each row's kept slots, best first
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=pa.array(mask))
