"""Which rows a model is not given: source lines that did not parse, and text with nothing in it to read.

A row whose source line did not parse (JSON lines) carries its raw text in
the ``_malformed`` column and gets ``malformed``. A row with text gets
``skipped_no_content`` when that text is not blank but gives the model
nothing to read: only control or format characters and U+FFFD (NUL bytes,
invalid UTF-8 decoded leniently), or text the tokenizer turns into nothing
but special and unknown tokens (a WordPiece tokenizer maps a "word" over 100
characters, such as 200,000 ``x`` without a space, to one ``[UNK]``). Scoring
such rows would give every one of them the same meaningless score; they are
not scored. The text tasks, ``generate`` and the endpoint backend decide it
with these checks.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from pipeline.core.rows import MALFORMED_COLUMN

__all__ = ["carries_content", "content_free", "malformed_rows", "special_token_ids"]


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
