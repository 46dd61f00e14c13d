"""Constrained decoding with xgrammar: a JSON Schema compiled once per worker, one matcher per row.

xgrammar (the library vLLM uses by default for structured outputs) compiles a
JSON Schema against the tokenizer's vocabulary into a grammar whose
allowed-token mask it builds per step in about half a millisecond for
SmolLM2's 49k tokens (``bench/bench_grammar_libs.py``: lm-format-enforcer
took 11 ms a token, and its transformers integration does not import with
transformers 5). The compiled grammar is immutable and shared; each row gets
its own :class:`xgrammar.GrammarMatcher` (its position in the grammar), so
rows can join and leave a continuous batch at any step.

::

    constraint = JsonConstraint.compile(tokenizer, schema, vocab_size=model.config.vocab_size)
    gen = BatchGenerator(model, tokenizer, constraint=constraint)
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["JsonConstraint"]


@dataclass
class JsonConstraint:
    """A compiled JSON Schema grammar: makes per-row matchers and masks a batch of logits with them."""

    grammar: Any
    vocab_size: int
    compile_s: float = 0.0

    @classmethod
    def compile(cls, tokenizer: Any, schema: Mapping[str, Any], *, vocab_size: int | None = None,
                stop_token_ids: Sequence[int] | None = None) -> "JsonConstraint":
        """Compile ``schema`` for ``tokenizer`` (``vocab_size``: the model's logits width, which may exceed the
        tokenizer's; ``stop_token_ids``: the tokens that end a row, EOS by default).

        Whitespace between JSON tokens is not allowed (``any_whitespace=False``, compact separators ``,``
        and ``:``): a small model otherwise spends its token budget on newlines and indentation and gets
        cut off. vLLM's structured outputs with ``disable_any_whitespace`` compile the same grammar, so the
        two backends (and a vLLM server) decode the same tokens.
        """
        import xgrammar as xgr

        started = time.perf_counter()
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) if stop_token_ids else None)
        grammar = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                                  separators=(",", ":"))
        return cls(grammar, info.vocab_size, time.perf_counter() - started)

    def matcher(self) -> Any:
        """A fresh per-row grammar state, at the start of the JSON value."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.grammar)

    def mask(self, logits: Any, matchers: Sequence[Any]) -> None:
        """Set to -inf, in place, each row's logits for tokens its matcher does not allow next.

        ``logits`` is ``[rows, vocab]`` with one matcher per row, in the same order.
        """
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(bitmask, i)
        device = logits.device
        if device.type == "cpu":
            xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)
        else:
            xgr.apply_token_bitmask_inplace(logits, bitmask.to(device), vocab_size=self.vocab_size)

    @staticmethod
    def accept(matcher: Any, token: int) -> None:
        """Advance a row's matcher past ``token`` (a token it refuses means the mask was not applied: a bug)."""
        if not matcher.is_terminated() and not matcher.accept_token(int(token)):
            raise RuntimeError(f"the grammar refused token {token} that its own mask allowed")
