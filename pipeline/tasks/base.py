"""The task protocol and the shared text-task machinery.

A task turns one Arrow chunk of input rows into one Arrow chunk of results,
row for row, in the same order. It is pure Python (pandas/Arrow/torch): the
Spark glue in ``pipeline.spark.udf`` only finds the cached model, hands each
chunk to :meth:`Task.process` and yields the result.

Every result carries ``status`` (``ok``, ``truncated``, ``skipped_null``,
``skipped_empty``, ``error``) and ``error`` (a message, or null), so no input row
is ever dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Hashable, Protocol, Sequence

import numpy as np
import pyarrow as pa

from pipeline.batching import Batch, collate, pad_multiple, plan_batches
from pipeline.config import BatchingConfig, ModelConfig
from pipeline.metrics import WorkerCounts

__all__ = ["STATUS_FIELDS", "Task", "TextTask", "TokenizedChunk"]

STATUS_FIELDS = [
    pa.field("n_tokens", pa.int32()),
    pa.field("truncated", pa.bool_()),
    pa.field("status", pa.string()),
    pa.field("error", pa.string()),
]

# Text longer than this many characters per allowed token is cut before
# tokenising (a 1 MB document would otherwise cost seconds for nothing); the
# row is flagged truncated either way.
_CHARS_PER_TOKEN_CAP = 16


class Task(Protocol):
    """One inference task. ``load`` is heavy and runs once per worker; ``process`` runs per chunk."""

    kind: ClassVar[str]
    input_columns: ClassVar[tuple[str, ...]]

    def output_schema(self) -> pa.Schema:
        """The columns ``process`` returns (result columns, then :data:`STATUS_FIELDS`)."""
        ...

    def cache_key(self) -> Hashable:
        """What identifies the loaded model in the per-worker cache."""
        ...

    def load(self, model_dir: Path, device: str) -> Any:
        """Load the model (and anything derived once from it, such as label embeddings)."""
        ...

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        """Results for every row of ``chunk``, in the same order."""
        ...


@dataclass
class TokenizedChunk:
    """The valid rows of a chunk, tokenised: positions in the chunk, token ids, truncation flags."""

    rows: np.ndarray
    token_ids: list[list[int]]
    truncated: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(t) for t in self.token_ids), dtype=np.int64, count=len(self.token_ids))


def tokenize(tokenizer: Any, texts: Sequence[str], *, max_length: int) -> tuple[list[list[int]], np.ndarray]:
    """Token ids truncated to ``max_length`` (special tokens included) and a per-row truncation flag."""
    cap = max_length * _CHARS_PER_TOKEN_CAP
    cut = np.fromiter((len(t) > cap for t in texts), dtype=bool, count=len(texts))
    clipped = [t[:cap] if c else t for t, c in zip(texts, cut)]
    enc = tokenizer(clipped, truncation=True, max_length=max_length, add_special_tokens=True)
    ids = [e.ids for e in enc.encodings]
    truncated = np.fromiter((bool(e.overflowing) for e in enc.encodings), dtype=bool, count=len(ids))
    # A clipped text that still fits was clipped in whitespace or markup only;
    # re-tokenise it whole so nothing past the clip point is lost.
    for i in np.flatnonzero(cut & ~truncated):
        e = tokenizer([texts[i]], truncation=True, max_length=max_length).encodings[0]
        ids[i], truncated[i] = e.ids, bool(e.overflowing)
    return ids, truncated


class TextTask:
    """Shared machinery of encoder tasks: classify rows, tokenise, length-sort, batch, forward, restore.

    Subclasses set ``kind``, ``model_kind`` and implement :meth:`result_fields`,
    :meth:`forward` (one padded batch -> a dict of numpy arrays, one row per
    batch row) and :meth:`build_columns` (all rows' results -> Arrow arrays).
    """

    kind: ClassVar[str]
    model_kind: ClassVar[str]
    input_columns: ClassVar[tuple[str, ...]] = ("text",)

    def __init__(self, config: Any, *, model: ModelConfig, batching: BatchingConfig) -> None:
        self.config = config
        self.model = model
        self.batching = batching

    # -- protocol ---------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        return pa.schema(self.result_fields() + STATUS_FIELDS)

    def cache_key(self) -> Hashable:
        return (self.kind, self.model.path, self.model.precision, self.model.device, repr(self.config))

    def result_fields(self) -> list[pa.Field]:
        raise NotImplementedError

    def load(self, model_dir: Path, device: str) -> Any:
        from pipeline.models.loading import load_model

        return load_model(model_dir, kind=self.model_kind, device=device, precision=self.model.precision)

    def forward(self, loaded: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def build_columns(self, loaded: Any, results: dict[str, np.ndarray | None], valid: np.ndarray) -> list[pa.Array]:
        raise NotImplementedError

    # -- the chunk loop -----------------------------------------------------------------------
    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        n = chunk.num_rows
        texts_col = chunk.column(chunk.schema.get_field_index("text"))
        texts: list[str | None] = texts_col.to_pylist()
        if pa.types.is_binary(texts_col.type) or pa.types.is_large_binary(texts_col.type):
            # raw bytes (logs): invalid UTF-8 becomes U+FFFD rather than failing the row
            texts = [None if b is None else b.decode("utf-8", errors="replace") for b in texts]
        status = np.full(n, "ok", dtype=object)
        error = np.full(n, None, dtype=object)
        n_tokens = np.zeros(n, dtype=np.int32)
        truncated = np.zeros(n, dtype=bool)

        valid = []
        for i, text in enumerate(texts):
            if text is None:
                status[i] = "skipped_null"
            elif not text.strip():
                status[i] = "skipped_empty"
            else:
                valid.append(i)
        rows = np.asarray(valid, dtype=np.int64)

        results: dict[str, np.ndarray | None] = {}
        if rows.size:
            tokenizer = loaded[0]
            token_ids, trunc = tokenize(tokenizer, [texts[i] for i in rows], max_length=self.batching.max_length)
            tok = TokenizedChunk(rows, token_ids, trunc)
            results = self._run_batches(loaded, tok, counts)
            n_tokens[rows] = tok.lengths
            truncated[rows] = tok.truncated
            status[rows[tok.truncated]] = "truncated"

        valid_mask = np.zeros(n, dtype=bool)
        valid_mask[rows] = True
        columns = self.build_columns(loaded, results, valid_mask)
        counts.add("rows", n)
        counts.add("chunks")
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        columns += [
            pa.array(n_tokens, pa.int32()),
            pa.array(truncated, pa.bool_()),
            pa.array(status.tolist(), pa.string()),
            pa.array(error.tolist(), pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())

    def _run_batches(self, loaded: Any, tok: TokenizedChunk, counts: WorkerCounts) -> dict[str, np.ndarray]:
        """Forward every batch and scatter results back to chunk order (indexed by position in ``tok``)."""
        tokenizer = loaded[0]
        lengths = tok.lengths
        device_type = next(loaded[1].parameters()).device.type
        batches: list[Batch] = plan_batches(
            lengths,
            batch_size=self.batching.batch_size,
            pad_to_multiple_of=pad_multiple(self.batching.pad_to_multiple_of, device_type),
            max_length=self.batching.max_length,
            sort=self.batching.sort_by_length,
        )
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        out: dict[str, np.ndarray] = {}
        for batch in batches:
            ids, mask = collate(tok.token_ids, batch, pad_id=pad_id)
            values = self.forward(loaded, ids, mask)
            for name, arr in values.items():
                if name not in out:
                    out[name] = np.zeros((lengths.size, *arr.shape[1:]), dtype=arr.dtype)
                out[name][batch.indices] = arr
            counts.add_batch(rows=batch.size, tokens=int(lengths[batch.indices].sum()), padded_tokens=batch.padded_tokens)
        return out
