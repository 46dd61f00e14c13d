"""The task protocol and the shared text-task machinery.

A task turns one Arrow chunk of input rows into one Arrow chunk of results,
row for row, in the same order. It is pure Python (pandas/Arrow/torch): the
Spark glue in ``pipeline.spark.udf`` only finds the cached model, hands each
chunk to :meth:`Task.process` and yields the result.

Every result carries ``status`` (``ok``, ``truncated``, ``skipped_null``,
``skipped_empty``, ``skipped_no_content``, ``error``; ``extract`` adds
``invalid_output``) and ``error`` (a message, or null), so no input row is ever
dropped.

``skipped_no_content`` marks text that is not blank but gives the model nothing
to read: only control or format characters and U+FFFD (NUL bytes, invalid UTF-8
decoded leniently), or text the tokenizer turns into nothing but special and
unknown tokens (a WordPiece tokenizer maps a "word" over 100 characters, such
as 200,000 ``x`` without a space, to one ``[UNK]``). Scoring such rows would
give every one of them the same meaningless score; they are not scored.
"""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, ClassVar, Hashable, Iterable, Iterator, Protocol, Sequence

import numpy as np
import pyarrow as pa

from pipeline.batching import (Batch, BatchSizeMemory, bucket_length, collate, pad_multiple, plan_batches,
                               small_chunk_budget)
from pipeline.config import BatchingConfig, ModelConfig
from pipeline.metrics import WorkerCounts
from pipeline.rows import MALFORMED, MALFORMED_COLUMN, MALFORMED_ERROR, NO_CONTENT, STATUS_FIELDS, Status

__all__ = [
    "MALFORMED", "NO_CONTENT", "STATUS_FIELDS", "ChunkWork", "LoadedText", "Task", "TextTask", "TokenizedChunk",
    "carries_content",
    "content_free", "malformed_rows", "special_token_ids",
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
class LoadedText:
    """What a text task keeps per worker in the model cache, for the worker's life.

    ``precision`` is the one in use after the accuracy gate (``gate`` says how
    it was chosen); ``labels`` holds anything derived once from the model (the
    embed task's label embeddings); ``memory`` the batch sizes learned from
    out-of-memory splits.
    """

    tokenizer: Any
    model: Any
    precision: str = "fp32"
    labels: Any = None
    gate: Any = None
    memory: BatchSizeMemory = field(default_factory=BatchSizeMemory)

    @property
    def load_counts(self) -> dict[str, Any]:
        """Counts to report once per load (the precision used, any fallback)."""
        return self.gate.counts() if self.gate is not None else {"precision_used": {self.precision: 1}}


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
    """One chunk between its CPU sides: statuses so far, the rows to score, their tokens, batches and results."""

    n: int
    status: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    error: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    n_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tok: TokenizedChunk | None = None
    batches: list[Batch] = field(default_factory=list)
    results: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)


def token_lengths(token_ids: Sequence[Sequence[int]]) -> np.ndarray:
    return np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=len(token_ids))


def carries_content(text: str) -> bool:
    r"""Whether ``text`` has a character a model can read: not whitespace, control, format or U+FFFD.

    Unicode categories C* (control, format, surrogate, private use, unassigned)
    and Z* (separators) carry nothing; neither does U+FFFD, which lenient
    decoding puts in place of invalid bytes. Stops at the first readable
    character, so ordinary text costs one or two lookups.

    >>> carries_content("\x00" * 50), carries_content("\ufffd\ufffd \u200b"), carries_content("\x00 ok")
    (False, False, True)
    """
    for ch in text:
        if ch != "\ufffd" and unicodedata.category(ch)[0] not in "CZ":
            return True
    return False


def malformed_rows(chunk: pa.RecordBatch) -> np.ndarray:
    """Which rows of ``chunk`` are source lines that did not parse (a non-null ``_malformed`` column).

    All False when the chunk has no such column (any source but JSON lines).
    """
    if MALFORMED_COLUMN not in chunk.schema.names:
        return np.zeros(chunk.num_rows, dtype=bool)
    return np.asarray(chunk.column(chunk.schema.get_field_index(MALFORMED_COLUMN)).is_valid(), dtype=bool)


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of the tokenizer's special tokens (added ones such as chat markers too), its unknown token included."""
    ids = set(getattr(tokenizer, "all_special_ids", None) or ())
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    if getattr(tokenizer, "unk_token_id", None) is not None:
        ids.add(tokenizer.unk_token_id)
    return frozenset(ids)


def content_free(token_ids: Sequence[int], special: frozenset[int]) -> bool:
    """Whether ``token_ids`` hold nothing but special and unknown tokens (or nothing at all).

    >>> content_free([101, 100, 102], frozenset({100, 101, 102})), content_free([101, 7592, 102], frozenset({100, 101, 102}))
    (True, False)
    """
    return all(t in special for t in token_ids)


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def scatter(out: dict[str, np.ndarray], values: dict[str, np.ndarray], indices: np.ndarray, n: int) -> None:
    """Write one batch's per-row ``values`` into ``out`` (n rows each) at ``indices``: input order restored."""
    for name, arr in values.items():
        if name not in out:
            out[name] = np.zeros((n, *arr.shape[1:]), dtype=arr.dtype)
        out[name][indices] = arr


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or simulated) out-of-memory error: worth retrying with a smaller batch."""
    from pipeline.faults import SimulatedOutOfMemoryError

    if isinstance(exc, SimulatedOutOfMemoryError):
        return True
    name = type(exc).__name__
    return name == "OutOfMemoryError" or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _describe(exc: BaseException, limit: int = 500) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tokenize_rows(tokenizer: Any, texts: Sequence[str], *, max_length: int,
                  threads: int = 1) -> tuple[list[list[int] | None], np.ndarray, dict[int, str]]:
    """Like :func:`tokenize`, but a text the tokenizer rejects becomes an error instead of failing all.

    Returns ``(ids, truncated, errors)``; ``ids[i]`` is None for rows in ``errors``.
    """
    try:
        ids, truncated = tokenize(tokenizer, texts, max_length=max_length, threads=threads)
        return list(ids), truncated, {}
    except Exception:  # noqa: BLE001 - find the offending rows one by one
        ids_out: list[list[int] | None] = []
        trunc = np.zeros(len(texts), dtype=bool)
        errors: dict[int, str] = {}
        for i, text in enumerate(texts):
            try:
                one, flag = tokenize(tokenizer, [text], max_length=max_length)
                ids_out.append(one[0])
                trunc[i] = flag[0]
            except Exception as exc:  # noqa: BLE001
                ids_out.append(None)
                errors[i] = "tokenizer: " + _describe(exc)
        return ids_out, trunc, errors


def tokenize(tokenizer: Any, texts: Sequence[str], *, max_length: int,
             threads: int = 1) -> tuple[list[list[int]], np.ndarray]:
    """Token ids truncated to ``max_length`` (special tokens included) and a per-row truncation flag.

    ``threads`` > 1 (the task's cores) encodes slices of ``texts`` in parallel threads; each text's
    ids do not depend on its neighbours, so the result is the same.
    """
    if not texts:  # transformers' own call fails on an empty list
        return [], np.zeros(0, dtype=bool)
    from pipeline.tasks._clip import CLIP_CHARS_PER_TOKEN, clip_point, clips_exactly, distrust

    cap = max_length * _CHARS_PER_TOKEN_CAP
    soft = max_length * CLIP_CHARS_PER_TOKEN
    exact = any(len(t) > soft for t in texts) and clips_exactly(tokenizer)
    clipped, cut, at_word_end = list(texts), np.zeros(len(texts), dtype=bool), np.zeros(len(texts), dtype=bool)
    for i, text in enumerate(texts):
        point = clip_point(text, soft) if exact else None
        if point is not None:
            clipped[i], cut[i], at_word_end[i] = text[:point], True, True
        elif len(text) > cap:
            clipped[i], cut[i] = text[:cap], True
    encodings = _encode(tokenizer, clipped, max_length=max_length, threads=threads)
    ids = [e.ids for e in encodings]
    truncated = np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(ids))
    checked = np.flatnonzero(at_word_end & truncated)[:1]
    for i in checked:  # one clipped row of every call against its whole text (pipeline.tasks._clip)
        whole = _encode(tokenizer, [texts[i]], max_length=max_length)[0]
        if whole.ids != ids[i]:
            distrust(tokenizer)
            return tokenize(tokenizer, texts, max_length=max_length, threads=threads)
    # A clipped text that did not fill max_length (long tokens, or clipped in whitespace or markup only):
    # tokenised again whole, so nothing past the clip point is lost.
    for i in np.flatnonzero(cut & ~truncated):
        e = _encode(tokenizer, [texts[i]], max_length=max_length)[0]
        ids[i], truncated[i] = e.ids, bool(e.overflowing)
    return ids, truncated


def _encode(tokenizer: Any, texts: list[str], *, max_length: int, threads: int = 1) -> list[Any]:
    """The fast tokenizer's encodings of ``texts``, as ``tokenizer(texts, truncation=True, ...)`` makes them.

    The transformers call sets the Rust tokenizer up (truncation, no padding, special
    tokens) and then spends about a fifth of its time turning every encoding into
    Python dicts that are not used here. So it is called on the first text only,
    which leaves the Rust tokenizer set up exactly as for the whole list, and the
    rest goes straight to it; ``encode_batch_fast`` also skips character offsets.
    On 20,000 documents with MiniLM's tokenizer: 1.80 s -> 1.31 s (one thread).
    Same ids and overflow (``tests/test_tokenize.py``).

    With ``threads`` > 1 the rest is cut into that many slices encoded by a thread
    each: the Rust call releases the GIL, so a task given several cores
    (``spark.task.cpus``) tokenises on all of them; each slice stays in order.
    """
    backend = getattr(tokenizer, "_tokenizer", None)
    if len(texts) <= 1 or backend is None or not _plain_fast_call(type(tokenizer)):
        return tokenizer(texts, truncation=True, max_length=max_length, add_special_tokens=True).encodings
    head = tokenizer(texts[:1], truncation=True, max_length=max_length, add_special_tokens=True).encodings
    encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
    rest = texts[1:]
    if threads <= 1 or len(rest) < 2 * threads:
        return [*head, *encode(rest, add_special_tokens=True)]
    from concurrent.futures import ThreadPoolExecutor

    step = -(-len(rest) // threads)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sbi-tokenize") as pool:
        parts = pool.map(lambda start: encode(rest[start : start + step], add_special_tokens=True),
                         range(0, len(rest), step))
        return [*head, *(e for part in parts for e in part)]


_CALL_PATH = ("__call__", "_call_one", "_encode_plus", "_batch_encode_plus")


@lru_cache(maxsize=None)
def _plain_fast_call(cls: type) -> bool:
    """Whether ``cls`` encodes text exactly as transformers' fast tokenizer base class does.

    A few tokenizers (LUKE, LayoutLM, MarkupLM, ...) override the call to add entities or
    boxes; those always go through their own call.
    """
    from transformers import PreTrainedTokenizerFast

    return all(getattr(cls, name, None) is getattr(PreTrainedTokenizerFast, name, None) for name in _CALL_PATH)


class TextTask:
    """Shared machinery of encoder tasks: classify rows, tokenise, length-sort, batch, forward, restore.

    Subclasses set ``kind``, ``model_kind`` and implement :meth:`result_fields`,
    :meth:`forward` (one padded batch -> a dict of numpy arrays, one row per
    batch row) and :meth:`build_columns` (all rows' results -> Arrow arrays).
    """

    kind: ClassVar[str]
    model_kind: ClassVar[str]
    input_columns: ClassVar[tuple[str, ...]] = ("text",)
    # the runner draws a sample of the job's rows for the accuracy gate (``calibration_rows``)
    calibrates_on_rows: ClassVar[bool] = True

    def __init__(self, config: Any, *, model: ModelConfig, batching: BatchingConfig,
                 calibration_rows: Sequence[str] = ()) -> None:
        self.config = config
        self.model = model
        self.batching = batching
        # texts of the job's own rows the accuracy gate calibrates on (drawn on the driver; empty: none)
        self.calibration_rows = tuple(calibration_rows)

    # -- protocol ---------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        return pa.schema(self.result_fields() + STATUS_FIELDS)

    def cache_key(self) -> Hashable:
        # the whole model config: precision, int8 options and the gate all change what is loaded; so may the rows
        # the gate calibrates on (one job's sample is the same on every worker and in every task)
        return (self.kind, repr(self.model), repr(self.config), hash(self.calibration_rows))

    def result_fields(self) -> list[pa.Field]:
        raise NotImplementedError

    def positions_needed(self) -> tuple[int, str]:
        """The most tokens a row can reach the model with, and the setting that decides it (checked on the driver)."""
        return self.batching.max_length, "batching.max_length"

    def load(self, model_dir: Path, device: str) -> LoadedText:
        """Load in fp32, derive :meth:`load_extras`, then move to the configured precision through the accuracy gate."""
        from pipeline.models.loading import load_model
        from pipeline.models.precision import select_precision

        tokenizer, model = load_model(model_dir, kind=self.model_kind, device=device, precision="fp32",
                                      allow_pickle=self.model.allow_pickle)
        reference = LoadedText(tokenizer, model)
        reference.labels = self.load_extras(reference)

        def run(candidate: Any, precision: str, texts: Sequence[str]) -> dict[str, np.ndarray]:
            return self.score_texts(LoadedText(tokenizer, candidate, precision, reference.labels), texts)

        model, gate = select_precision(
            model, self.model.precision, run=run, top_labels=lambda out: self.top_labels(reference, out),
            gate=self.model.accuracy_gate, int8=self.model.int8, texts=self.calibration_rows,
            model_dir=model_dir, kind=self.model_kind,
        )
        return LoadedText(tokenizer, model, gate.precision, reference.labels, gate)

    def load_extras(self, loaded: LoadedText) -> Any:
        """Anything computed once per load from the fp32 model (stored as ``loaded.labels``); None by default."""
        return None

    def top_labels(self, loaded: LoadedText, outputs: dict[str, np.ndarray]) -> np.ndarray | None:
        """The top label index per row of ``outputs`` (for the accuracy gate), or None when the task has none."""
        return None

    def score_texts(self, loaded: LoadedText, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """:meth:`forward` outputs for ``texts``, in order (no statuses, no fault handling: calibration)."""
        ids, _ = tokenize(loaded.tokenizer, texts, max_length=self.batching.max_length)
        pad_id = pad_token_id(loaded.tokenizer)
        out: dict[str, np.ndarray] = {}
        for batch in plan_batches(token_lengths(ids), batch_size=self.batching.batch_size, pad_to_multiple_of=1):
            scatter(out, self.forward(loaded, *collate(ids, batch, pad_id=pad_id)), batch.indices, len(ids))
        return out

    def forward(self, loaded: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def build_columns(self, loaded: Any, results: dict[str, np.ndarray | None], valid: np.ndarray) -> list[pa.Array]:
        raise NotImplementedError

    # -- the chunk loop -----------------------------------------------------------------------
    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts, *, cpus: int = 1) -> pa.RecordBatch:
        """Results for every row of ``chunk``, in order: prepare (CPU), run the batches (model), finish (CPU)."""
        work = self._prepare(loaded, chunk, cpus=cpus)
        self._run_work(loaded, work, counts)
        return self._finish(loaded, work, counts)

    def process_stream(
        self, loaded: Any, chunks: Iterable[pa.RecordBatch], counts: WorkerCounts, *, cpus: int = 1
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`process` for each chunk of a Spark task, in order, with the model kept busy.

        With ``batching.chunks_ahead`` > 0 the model's batches run on one device
        thread (``pipeline.tasks._feed``) while this thread reads and tokenises
        the next chunk and builds the previous one's columns; the same batches
        run in the same order, so every result is the inline worker's. 0 is the
        inline worker: one chunk at a time.
        """
        ahead = getattr(self.batching, "chunks_ahead", 0)
        if ahead <= 0:
            for chunk in chunks:
                yield self.process(loaded, chunk, counts, cpus=cpus)
            return
        from pipeline.tasks._feed import LockedCounts, overlapped

        shared = LockedCounts(counts)
        yield from overlapped(
            chunks,
            prepare=lambda chunk: self._prepare(loaded, chunk, cpus=cpus),
            run=lambda work: self._run_work(loaded, work, shared),
            finish=lambda work: self._finish(loaded, work, shared),
            ahead=ahead,
        )

    def _prepare(self, loaded: Any, chunk: pa.RecordBatch, *, cpus: int = 1) -> "ChunkWork":
        """Statuses, tokens and the batch plan of one chunk: its CPU side before the model."""
        n = chunk.num_rows
        texts_col = chunk.column(chunk.schema.get_field_index("text"))
        texts: list[str | None] = texts_col.to_pylist()
        if pa.types.is_binary(texts_col.type) or pa.types.is_large_binary(texts_col.type):
            # raw bytes (logs): invalid UTF-8 becomes U+FFFD rather than failing the row
            texts = [None if b is None else b.decode("utf-8", errors="replace") for b in texts]
        work = ChunkWork(
            n=n, status=np.full(n, Status.OK, dtype=object), error=np.full(n, None, dtype=object),
            n_tokens=np.zeros(n, dtype=np.int32), truncated=np.zeros(n, dtype=bool),
        )
        status, error = work.status, work.error

        malformed = malformed_rows(chunk)
        valid = []
        for i, text in enumerate(texts):
            if malformed[i]:
                status[i], error[i] = MALFORMED, MALFORMED_ERROR
            elif text is None:
                status[i] = Status.SKIPPED_NULL
            elif not text.strip():
                status[i] = Status.SKIPPED_EMPTY
            elif not carries_content(text):
                status[i] = NO_CONTENT
            else:
                valid.append(i)
        rows = np.asarray(valid, dtype=np.int64)
        work.rows = rows
        if not rows.size:
            return work
        tokenizer = loaded.tokenizer
        valid_texts = [texts[i] for i in rows]
        token_ids, trunc, tok_errors = tokenize_rows(tokenizer, valid_texts, max_length=self.batching.max_length,
                                                     threads=cpus)
        for i, message in tok_errors.items():
            status[rows[i]], error[rows[i]] = "error", message
        # only special and unknown tokens: nothing for the model to score (flagged, not run)
        special = special_token_ids(tokenizer)
        for i, ids in enumerate(token_ids):
            if ids is not None and content_free(ids, special):
                status[rows[i]] = NO_CONTENT
        keep = np.array([i not in tok_errors and status[rows[i]] != NO_CONTENT for i in range(rows.size)],
                        dtype=bool)
        work.rows = rows[keep]
        work.tok = TokenizedChunk(
            work.rows, [t for t, k in zip(valid_texts, keep) if k],
            [t for t, k in zip(token_ids, keep) if k], trunc[keep],
        )
        work.batches = self._plan(loaded, work.tok)
        return work

    def _run_work(self, loaded: Any, work: "ChunkWork", counts: WorkerCounts) -> None:
        """Forward every planned batch of ``work`` (results scattered to its token order; poison rows in ``errors``)."""
        if work.tok is None:
            return
        pad_id = pad_token_id(loaded.tokenizer)
        for batch in work.batches:
            self._run_guarded(loaded, work.tok, batch.indices, pad_id, work.results, work.errors, counts)

    def _finish(self, loaded: Any, work: "ChunkWork", counts: WorkerCounts) -> pa.RecordBatch:
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
                    status[rows[i]], error[rows[i]] = "error", message
                ok = np.ones(rows.size, dtype=bool)
                ok[failed] = False
                results = {name: arr[ok] for name, arr in results.items()}
                rows = rows[ok]

        valid_mask = np.zeros(work.n, dtype=bool)
        valid_mask[rows] = True
        columns = self.build_columns(loaded, results, valid_mask)
        counts.add("rows", work.n)
        counts.add("chunks")
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        columns += [
            pa.array(work.n_tokens, pa.int32()),
            pa.array(work.truncated, pa.bool_()),
            pa.array(status.tolist(), pa.string()),
            pa.array(error.tolist(), pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())

    def _plan(self, loaded: Any, tok: TokenizedChunk) -> list[Batch]:
        device_type = loaded.model.device.type
        self._multiple = pad_multiple(self.batching.pad_to_multiple_of, device_type)
        budget = self.batching.token_budget
        if budget is None and not self.batching.bucket_shapes and self.batching.sort_by_length:
            # a chunk smaller than a batch: its long rows in batches of their own (fixed shapes stay as set)
            budget = small_chunk_budget(tok.lengths, batch_size=self.batching.batch_size, multiple=self._multiple,
                                        cap=self.batching.max_length)
        return plan_batches(
            tok.lengths,
            batch_size=self.batching.batch_size,
            pad_to_multiple_of=self._multiple,
            max_length=self.batching.max_length,
            sort=self.batching.sort_by_length,
            token_budget=budget,
            bucket_shapes=self.batching.bucket_shapes,
        )

    def _run_guarded(
        self, loaded: LoadedText, tok: TokenizedChunk, indices: np.ndarray, pad_id: int,
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
        from pipeline import faults

        lengths = tok.lengths
        longest = int(lengths[indices].max())
        length = bucket_length(longest, self.batching.bucket_shapes, multiple=self._multiple,
                               cap=self.batching.max_length)
        limit = loaded.memory.limit(length) if self.batching.adaptive_batch_size else None
        if limit is not None and indices.size > limit:
            counts.add("adaptive_splits")
            for start in range(0, indices.size, limit):
                self._run_guarded(loaded, tok, indices[start : start + limit], pad_id, out, errors, counts)
            return
        batch = Batch(indices, length)
        started = time.perf_counter()
        try:
            if faults.enabled:  # drills only: nothing to build or check per batch in production
                faults.check_batch([tok.texts[i] for i in indices], padded_tokens=batch.padded_tokens)
            ids, mask = collate(tok.token_ids, batch, pad_id=pad_id)
            values = self.forward(loaded, ids, mask)
        except Exception as exc:  # noqa: BLE001 - classified below
            oom = is_out_of_memory(exc)
            if oom:
                _free_accelerator_memory()
                if self.batching.adaptive_batch_size and indices.size > 1:
                    loaded.memory.record_out_of_memory(length=length, rows=indices.size)
            if indices.size == 1:
                counts.add("row_errors")
                errors[int(indices[0])] = ("out of memory even alone: " if oom else "") + _describe(exc)
                return
            counts.add("oom_splits" if oom else "poison_bisections")
            half = indices.size // 2
            self._run_guarded(loaded, tok, indices[:half], pad_id, out, errors, counts)
            self._run_guarded(loaded, tok, indices[half:], pad_id, out, errors, counts)
            return
        scatter(out, values, indices, lengths.size)
        counts.add_batch(rows=batch.size, tokens=int(lengths[indices].sum()), padded_tokens=batch.padded_tokens,
                         padded_length=length, seconds=time.perf_counter() - started)


def _free_accelerator_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass
