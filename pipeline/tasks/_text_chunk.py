"""One chunk of a text task, in three steps: prepare (CPU), run its batches (model), finish (CPU).

:func:`prepare_chunk` gives every row its status (``malformed``,
``skipped_null``, ``skipped_empty``, ``skipped_no_content``, a tokenizer
``error``; the rest ``ok`` so far), tokenises the rows to score and plans
their length-sorted batches. :func:`run_chunk` forwards each batch through
the task's model, splitting a batch that fails (:func:`_run_guarded`: out of
memory, or a poison row to isolate). :func:`finish_chunk` marks truncated and
failed rows, builds the task's result columns in input order and appends the
status columns. The three take the task (a :class:`~pipeline.tasks.base.TextTask`)
as a plain argument; with ``batching.chunks_ahead`` the Spark task overlaps
them across chunks (``pipeline.tasks._feed``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.core.batching import Batch, bucket_length, collate, pad_multiple, plan_batches, small_chunk_budget
from pipeline.core.metrics import WorkerCounts
from pipeline.core.rows import MALFORMED_ERROR, Status
from pipeline.tasks._content import carries_content, content_free, malformed_rows, special_token_ids
from pipeline.tasks._failures import describe_error, free_accelerator_memory, is_out_of_memory
from pipeline.tasks._tokenize import pad_token_id, token_lengths, tokenize_rows

__all__ = ["ChunkWork", "TokenizedChunk", "finish_chunk", "prepare_chunk", "run_chunk", "scatter"]


@dataclass
class TokenizedChunk:
    """The valid rows of a chunk, tokenised: positions in the chunk, texts, token ids, truncation flags."""

    rows: np.ndarray
    texts: list[str]
    token_ids: list[list[int]]
    truncated: np.ndarray

    @cached_property
    def lengths(self) -> np.ndarray:
        # read for every batch of the chunk: computed once, not once per batch
        return token_lengths(self.token_ids)


@dataclass
class ChunkWork:
    """One chunk between its CPU sides: statuses so far, the rows to score, their tokens, batches and results.

    ``multiple`` is the padded-length multiple the batches were planned with (it depends on the model's device).
    """

    n: int
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    error: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    n_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tok: TokenizedChunk | None = None
    batches: list[Batch] = field(default_factory=list)
    multiple: int = 1
    results: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def scatter(out: dict[str, np.ndarray], values: dict[str, np.ndarray], indices: np.ndarray, n: int) -> None:
    """Write one batch's per-row ``values`` into ``out`` (n rows each) at ``indices``: input order restored."""
    for name, arr in values.items():
        if name not in out:
            out[name] = np.zeros((n, *arr.shape[1:]), dtype=arr.dtype)
        out[name][indices] = arr


def _chunk_texts(chunk: pa.RecordBatch) -> list[str | None]:
    """The chunk's ``text`` column as Python strings; raw bytes (logs) decoded with invalid UTF-8 as U+FFFD."""
    texts_col = chunk.column(chunk.schema.get_field_index("text"))
    texts: list[str | None] = texts_col.to_pylist()
    if pa.types.is_binary(texts_col.type) or pa.types.is_large_binary(texts_col.type):
        # raw bytes (logs): invalid UTF-8 becomes U+FFFD rather than failing the row
        texts = [None if b is None else b.decode("utf-8", errors="replace") for b in texts]
    return texts


def prepare_chunk(task: Any, loaded: Any, chunk: pa.RecordBatch, *, cpus: int = 1) -> ChunkWork:
    """Statuses, tokens and the batch plan of one chunk: its CPU side before the model."""
    n = chunk.num_rows
    texts = _chunk_texts(chunk)
    work = ChunkWork(
        n=n, status=np.full(n, Status.OK, dtype=object), error=np.full(n, None, dtype=object),
        n_tokens=np.zeros(n, dtype=np.int32), truncated=np.zeros(n, dtype=bool),
    )
    status, error = work.status, work.error

    malformed = malformed_rows(chunk)
    valid = []
    for i, text in enumerate(texts):
        if malformed[i]:
            status[i], error[i] = Status.MALFORMED, MALFORMED_ERROR
        elif text is None:
            status[i] = Status.SKIPPED_NULL
        elif not text.strip():
            status[i] = Status.SKIPPED_EMPTY
        elif not carries_content(text):
            status[i] = Status.NO_CONTENT
        else:
            valid.append(i)
    rows = np.asarray(valid, dtype=np.int64)
    work.rows = rows
    if not rows.size:
        return work
    tokenizer = loaded.tokenizer
    valid_texts = [texts[i] for i in rows]
    token_ids, trunc, tok_errors = tokenize_rows(tokenizer, valid_texts, max_length=task.batching.max_length,
                                                 threads=cpus)
    for i, message in tok_errors.items():
        status[rows[i]], error[rows[i]] = Status.ERROR, message
    # only special and unknown tokens: nothing for the model to score (flagged, not run)
    special = special_token_ids(tokenizer)
    for i, ids in enumerate(token_ids):
        if ids is not None and content_free(ids, special):
            status[rows[i]] = Status.NO_CONTENT
    keep = np.array([i not in tok_errors and status[rows[i]] != Status.NO_CONTENT for i in range(rows.size)],
                    dtype=bool)
    work.rows = rows[keep]
    work.tok = TokenizedChunk(
        work.rows, [t for t, k in zip(valid_texts, keep) if k],
        [t for t, k in zip(token_ids, keep) if k], trunc[keep],
    )
    work.multiple = pad_multiple(task.batching.pad_to_multiple_of, loaded.model.device.type)
    work.batches = _plan(task.batching, work.tok, work.multiple)
    return work


def run_chunk(task: Any, loaded: Any, work: ChunkWork, counts: WorkerCounts) -> None:
    """Forward every planned batch of ``work`` (results scattered to its token order; poison rows in ``errors``)."""
    if work.tok is None:
        return
    pad_id = pad_token_id(loaded.tokenizer)
    for batch in work.batches:
        _run_guarded(task, loaded, work.tok, batch.indices, pad_id, work.multiple, work.results, work.errors, counts)


def finish_chunk(task: Any, loaded: Any, work: ChunkWork, counts: WorkerCounts) -> pa.RecordBatch:
    """Statuses and result columns of a chunk whose batches have run: its CPU side after the model."""
    status, error, rows, results = work.status, work.error, work.rows, work.results
    if work.tok is not None:
        tok = work.tok
        work.n_tokens[rows] = tok.lengths
        work.truncated[rows] = tok.truncated
        status[rows[tok.truncated]] = Status.TRUNCATED
        if work.errors:
            failed = np.fromiter(work.errors, dtype=np.int64)
            for i, message in work.errors.items():
                status[rows[i]], error[rows[i]] = Status.ERROR, message
            ok = np.ones(rows.size, dtype=bool)
            ok[failed] = False
            results = {name: arr[ok] for name, arr in results.items()}
            rows = rows[ok]

    valid_mask = np.zeros(work.n, dtype=bool)
    valid_mask[rows] = True
    columns = task.build_columns(loaded, results, valid_mask)
    counts.add("rows", work.n)
    counts.add("chunks")
    counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
    columns += [
        pa.array(work.n_tokens, pa.int32()),
        pa.array(work.truncated, pa.bool_()),
        pa.array(status.tolist(), pa.string()),
        pa.array(error.tolist(), pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=task.output_schema())


def _plan(batching: Any, tok: TokenizedChunk, multiple: int) -> list[Batch]:
    budget = batching.token_budget
    if budget is None and not batching.bucket_shapes and batching.sort_by_length:
        # a chunk smaller than a batch: its long rows in batches of their own (fixed shapes stay as set)
        budget = small_chunk_budget(tok.lengths, batch_size=batching.batch_size, multiple=multiple,
                                    cap=batching.max_length)
    return plan_batches(
        tok.lengths,
        batch_size=batching.batch_size,
        pad_to_multiple_of=multiple,
        max_length=batching.max_length,
        sort=batching.sort_by_length,
        token_budget=budget,
        bucket_shapes=batching.bucket_shapes,
    )


def _run_guarded(
    task: Any, loaded: Any, tok: TokenizedChunk, indices: np.ndarray, pad_id: int, multiple: int,
    out: dict[str, np.ndarray], errors: dict[int, str], counts: WorkerCounts,
) -> None:
    """Run one batch; on failure split it in half and retry each half, down to single rows.

    Out-of-memory errors mean "too big": the halves usually succeed, and
    with ``batching.adaptive_batch_size`` the worker remembers the size
    that fits for this length bucket (``loaded.memory``), so later batches
    of similar length are cut to it before they run instead of failing
    again. Any other error is a poison row: bisection isolates it (about
    log2(batch) extra forwards) and only that row is marked ``error``; its
    neighbours are scored normally. Nothing is lost and nothing is scored twice.
    """
    from pipeline.core import faults

    batching = task.batching
    lengths = tok.lengths
    longest = int(lengths[indices].max())
    length = bucket_length(longest, batching.bucket_shapes, multiple=multiple, cap=batching.max_length)
    limit = loaded.memory.limit(length) if batching.adaptive_batch_size else None
    if limit is not None and indices.size > limit:
        counts.add("adaptive_splits")
        for start in range(0, indices.size, limit):
            _run_guarded(task, loaded, tok, indices[start : start + limit], pad_id, multiple, out, errors, counts)
        return
    batch = Batch(indices, length)
    started = time.perf_counter()
    try:
        if faults.enabled:  # drills only: nothing to build or check per batch in production
            faults.check_batch([tok.texts[i] for i in indices], padded_tokens=batch.padded_tokens)
        ids, mask = collate(tok.token_ids, batch, pad_id=pad_id)
        values = task.forward(loaded, ids, mask)
    except Exception as exc:  # noqa: BLE001 - classified below
        oom = is_out_of_memory(exc)
        if oom:
            free_accelerator_memory()
            if batching.adaptive_batch_size and indices.size > 1:
                loaded.memory.record_out_of_memory(length=length, rows=indices.size)
        if indices.size == 1:
            counts.add("row_errors")
            errors[int(indices[0])] = ("out of memory even alone: " if oom else "") + describe_error(exc)
            return
        counts.add("oom_splits" if oom else "poison_bisections")
        half = indices.size // 2
        _run_guarded(task, loaded, tok, indices[:half], pad_id, multiple, out, errors, counts)
        _run_guarded(task, loaded, tok, indices[half:], pad_id, multiple, out, errors, counts)
        return
    scatter(out, values, indices, lengths.size)
    counts.add_batch(rows=batch.size, tokens=int(lengths[indices].sum()), padded_tokens=batch.padded_tokens,
                     padded_length=length, seconds=time.perf_counter() - started)
