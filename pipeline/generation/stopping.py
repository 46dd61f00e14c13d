"""Stop strings: where a completion's text must be cut.

Stop strings are matched on decoded text, not token ids, because one string
("\\n\\n", "Review:") can be produced by many different token sequences.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["find_stop"]


def find_stop(text: str, stops: Sequence[str]) -> int | None:
    """The index where ``text`` must be cut: the earliest start of any stop string, or None.

    >>> find_stop("Positive.\\nNext review", ["\\n", "."])
    8
    >>> find_stop("no stop here", ["###"]) is None
    True
    """
    best: int | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or at < best):
            best = at
    return best
