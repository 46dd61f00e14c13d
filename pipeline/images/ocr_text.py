"""From the recogniser's output to text, and text against a reference: greedy CTC, normalising, CER.

:func:`ctc_decode`: greedy CTC over the recogniser's per-column class
probabilities -> text and a confidence per line. :func:`char_error_rate`:
edit distance / reference length on whitespace-normalised text, to compare
with ``pdftotext``. numpy only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["char_error_rate", "ctc_decode", "normalize_text"]


def ctc_decode(probs: np.ndarray, characters: Sequence[str]) -> list[tuple[str, float]]:
    """Greedy CTC decoding of ``(B, T, C)`` class probabilities: ``(text, mean confidence)`` per row.

    Class 0 is the CTC blank; repeats collapse unless a blank separates them.

    >>> p = np.eye(4)[[1, 1, 0, 1, 2, 0, 0]][None] * 0.9
    >>> ctc_decode(p, ["<blank>", "a", "b", " "])
    [('aab', 0.9)]
    """
    best = probs.argmax(axis=2)
    conf = probs.max(axis=2)
    out = []
    for row in range(best.shape[0]):
        ids = best[row]
        keep = ids != 0
        keep[1:] &= ids[1:] != ids[:-1]
        text = "".join(characters[i] for i in ids[keep])
        out.append((text, round(float(conf[row][keep].mean()), 6) if keep.any() else 0.0))
    return out


def normalize_text(text: str) -> str:
    """Whitespace runs collapsed to one space, ends stripped: what a CER compares.

    >>> normalize_text(" a\\n\\n b  c ")
    'a b c'
    """
    return " ".join(text.split())


def char_error_rate(hypothesis: str, reference: str) -> float:
    """Character edit distance (insertions, deletions, substitutions) / reference length, on normalised text.

    >>> char_error_rate("hello wrld", "hello world"), char_error_rate("", "abc"), char_error_rate("x", "")
    (0.09090909090909091, 1.0, 1.0)
    """
    hyp, ref = normalize_text(hypothesis), normalize_text(reference)
    if not ref:
        return 0.0 if not hyp else 1.0
    return _edit_distance(hyp, ref) / len(ref)


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance, one numpy row per character of ``a`` (insertions resolved by a running minimum)."""
    bv = np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32)
    cols = np.arange(bv.size + 1, dtype=np.int64)
    row = cols.copy()
    for i, ch in enumerate(np.frombuffer(a.encode("utf-32-le"), dtype=np.uint32)):
        sub = row[:-1] + (bv != ch)
        dele = row[1:] + 1
        cand = np.empty_like(row)
        cand[0] = i + 1
        cand[1:] = np.minimum(sub, dele)
        row = np.minimum.accumulate(cand - cols) + cols
    return int(row[-1])
