"""Token ids for a text task's rows: truncated to the model's length, flagged, fast, and per-row on failure.

:func:`tokenize` is what every encoder task calls: ids cut to ``max_length``
(special tokens included) and a per-row truncation flag. It clips very long
texts before the tokenizer sees them (``pipeline.tasks._clip``: a 1 MB
document would otherwise cost seconds for nothing) and calls the Rust
tokenizer directly, on several threads when the task has several cores
(:func:`_encode`). :func:`tokenize_rows` turns a text the tokenizer rejects
into that row's error instead of failing the chunk.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import numpy as np

from pipeline.tasks._failures import describe_error

__all__ = ["pad_token_id", "token_lengths", "tokenize", "tokenize_rows"]


# Text longer than this many characters per allowed token is cut before
# tokenising (a 1 MB document would otherwise cost seconds for nothing); the
# row is flagged truncated either way.
_CHARS_PER_TOKEN_CAP = 16


def token_lengths(token_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """The number of ids of each row, as an int64 array."""
    return np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=len(token_ids))


def pad_token_id(tokenizer: Any) -> int:
    """The id batches are padded with: the tokenizer's pad token, else 0."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


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
                errors[i] = "tokenizer: " + describe_error(exc)
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
    Same ids and overflow (``tests/tasks/test_tokenize.py``).

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
