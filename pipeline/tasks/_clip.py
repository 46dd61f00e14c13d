"""Clip long texts before tokenising to what ``max_length`` tokens can use, without changing a single id.

A news article of 5 kB is about 1,200 tokens; an encoder with ``max_length`` 256 keeps the first 256, so
tokenising the whole article is most of the tokenizer's work for nothing (on 2 cores the tokenizer is a
tenth of a long-document job). The cut goes at a whitespace boundary a few characters per token past what
``max_length`` tokens need: for the tokenizers of this field (WordPiece, byte-level BPE, SentencePiece'
Metaspace) a text cut where a word ends tokenises into exactly the first tokens of the whole text, so the
first ``max_length`` ids and the truncation flag are those of the whole text. That is checked once per
tokenizer (:func:`clips_exactly`, on a probe text cut at every word end) and on one clipped row of every
call (:func:`pipeline.tasks._tokenize.tokenize`); a tokenizer that fails either is never clipped this way again.
A clipped row whose tokens did not fill ``max_length`` is tokenised again whole.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["CLIP_CHARS_PER_TOKEN", "clip_point", "clips_exactly", "distrust"]

# Characters per token kept before the cut: English WordPiece and BPE average 4-5 (with the space); a text
# of longer tokens (URLs, code) that does not fill max_length within it is tokenised whole again. On 1,000
# texts of 3 kB (MiniLM, max_length 256, one thread) the tokenizer took 0.63x the time without the cut at 8
# and 0.51x at 6 characters per token (bench/bench_tokenize.py).
CLIP_CHARS_PER_TOKEN = 6

_PROBE = (
    "The committee said on Tuesday that it had approved the $4.5-billion plan, despite objections from "
    "residents of São Paulo and Zürich. \"We're not done yet,\" said Dr. O'Neill (the chair), adding that "
    "e-mail & web traffic rose 12.7% in 2026; others called it a \"non-starter\"... Über-rapid growth, "
    "naïve forecasts, co-operation and re-election: all were debated. 東京 and Москва sent notes too. "
    "Numbers like 1,000,000 or 3.14159, URLs such as https://example.com/a?b=c, and emoji 🎬 appear.\n"
    "Tabs\tand  double  spaces, CamelCaseWords, snake_case_names and UPPER-CASE words end it."
)
_verdicts: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def clip_point(text: str, soft: int) -> int | None:
    """Where to cut ``text`` for a budget of ``soft`` characters: at the last whitespace at or before it
    (None when ``text`` is no longer than ``soft``, or has no whitespace in its second half before it).

    >>> clip_point("alpha beta gamma delta", 12), clip_point("short", 12), clip_point("x" * 30, 12)
    (10, None, None)
    """
    if len(text) <= soft:
        return None
    cut = max(text.rfind(" ", 0, soft + 1), text.rfind("\n", 0, soft + 1), text.rfind("\t", 0, soft + 1))
    return cut if cut > soft // 2 else None


def _ids(backend: Any, text: str) -> list[int]:
    return backend.encode(text, add_special_tokens=False).ids


def clips_exactly(tokenizer: Any) -> bool:
    """Whether a text cut at a word end tokenises into the first tokens of the whole text, for ``tokenizer``
    (a fast tokenizer; False for any other), checked once on a probe text cut at every word end."""
    if tokenizer in _verdicts:
        return _verdicts[tokenizer]
    backend = getattr(tokenizer, "_tokenizer", None)
    verdict = False
    if backend is not None:
        try:
            full = _ids(backend, _PROBE)
            cuts = [i for i, c in enumerate(_PROBE) if c.isspace() and i > 0]
            verdict = all(full[:len(part)] == part for part in (_ids(backend, _PROBE[:i]) for i in cuts))
        except Exception:  # noqa: BLE001 - a tokenizer we cannot probe is not clipped
            verdict = False
    try:
        _verdicts[tokenizer] = verdict
    except TypeError:  # not weak-referenceable: checked again next time
        pass
    return verdict


def distrust(tokenizer: Any) -> None:
    """Never clip for ``tokenizer`` again (a clipped row disagreed with its whole text)."""
    try:
        _verdicts[tokenizer] = False
    except TypeError:
        pass
