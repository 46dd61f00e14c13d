"""Next-token choice: greedy, or sampling with a per-row ``torch.Generator``.

Reproducibility is per row, not per batch: each row's generator is seeded
from ``(config seed, row key)`` by :func:`row_seed`, and a row's token is drawn
with its own generator from its own logits. So a rerun gives a row the same
completion whichever rows it shares a batch or a slot loop with, and in
whatever order the rows are scheduled. (Batched float maths can differ from
unbatched maths in the last bits; a draw that lands within that distance of
a probability boundary could still differ, which is vanishingly rare.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["SamplingParams", "choose_tokens", "make_generator", "row_seed"]


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen and when a completion stops.

    ``temperature == 0`` is greedy (argmax), the same choice as
    ``model.generate(do_sample=False)``. ``top_p < 1`` keeps the smallest set of
    tokens whose probability reaches ``top_p`` (nucleus sampling). ``stop`` are
    strings that end a completion (the stop string itself is not returned).
    """

    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty, got {list(self.stop)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def row_seed(seed: int, key: Any) -> int:
    """A 63-bit seed for one row from the config ``seed`` and the row's ``key`` (its id, or its prompt).

    sha256 rather than ``hash()``: Python salts string hashes per process, and
    Spark workers are separate processes.

    >>> row_seed(0, "row-1") == row_seed(0, "row-1") != row_seed(1, "row-1")
    True
    """
    digest = hashlib.sha256(f"{seed}\x1f{type(key).__name__}\x1f{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def make_generator(seed: int) -> Any:
    """A CPU ``torch.Generator`` seeded with ``seed`` (sampling happens on CPU logits)."""
    import torch

    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    return gen


def choose_tokens(logits: Any, generators: Sequence[Any | None], params: SamplingParams) -> list[int]:
    """The next token of each row of ``logits`` (``[rows, vocab]``), one generator per row.

    Greedy ignores the generators. Sampling moves the logits to the CPU in
    fp32 so a row's draw does not depend on the device or the batch.
    """
    import torch

    if params.greedy:
        return logits.argmax(dim=-1).tolist()
    rows = logits.detach().to("cpu", torch.float32) / params.temperature
    out = []
    for i in range(rows.shape[0]):
        row = rows[i]
        if params.top_p < 1.0:
            sorted_logits, sorted_idx = torch.sort(row, descending=True)
            cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            # Drop a token when the tokens ranked above it already reach top_p;
            # the top token always stays.
            drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
            row = row.clone()
            row[sorted_idx[drop]] = float("-inf")
        probs = torch.softmax(row, dim=-1)
        out.append(int(torch.multinomial(probs, 1, generator=generators[i]).item()))
    return out
