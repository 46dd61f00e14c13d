"""Batched generation over one model: a static mode and a continuous (slot-refill) mode.

Both modes run the same decode loop over a :class:`~pipeline.generation.kv.SlotBatch`;
they differ only in when prompts are admitted:

- ``static``: prompts sorted by length are cut into batches of ``slots`` rows;
  a batch is prefilled (left-padded) and decoded until its last row is done.
  Finished rows leave the batch at once, so they cost nothing more, but their
  slots stay empty until the whole batch is done.
- ``continuous``: whenever rows finish, queued prompts are prefilled and join
  the running batch before the next decoding step, so all ``slots`` stay busy.
  Longest jobs (prompt + max new tokens) are admitted first, which keeps the
  tail, where only a few long rows are left, short.

Greedy results of both modes equal ``model.generate`` on each prompt alone
(same positions, same masking; see ``kv.py``); results come back in input order.

With a ``constraint`` (``pipeline.generation.grammar.JsonConstraint``) each row
carries its own grammar state, created when the row is admitted and advanced
by each of its tokens, so rows that join or leave the batch at any step are
masked by their own position in the grammar.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

from pipeline.generation.kv import SlotBatch
from pipeline.generation.sampling import SamplingParams, choose_tokens, make_generator
from pipeline.generation.stopping import find_stop

__all__ = [
    "BatchGenerator", "GenerationMode", "GenerationRequest", "GenerationResult", "Generator", "check_requests",
    "eos_ids", "prefill_groups",
]

GenerationMode = Literal["static", "continuous"]
FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (token ids), how many tokens it may generate, and its sampling seed.

    A vision-language row also carries its image: ``inputs`` (the processor's tensors beside the token ids,
    e.g. ``pixel_values``, leading dimension one per image: the transformers backend, whose prompt ids hold
    the image's tokens expanded) or ``images`` (the images themselves: vLLM, which expands them).
    """

    prompt_ids: Sequence[int]
    max_new_tokens: int
    seed: int = 0
    inputs: Any = None
    images: tuple[Any, ...] = ()


@dataclass
class GenerationResult:
    """What one prompt produced. ``token_ids`` are all generated tokens (a final EOS included)."""

    completion: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: FinishReason
    latency_ms: float
    error: str | None = None
    # a served model's count (the endpoint backend gets text and usage, not token ids); None: len(token_ids)
    usage_completion_tokens: int | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids) if self.usage_completion_tokens is None else self.usage_completion_tokens


@dataclass
class _Row:
    index: int
    request: GenerationRequest
    generator: Any
    started: float
    tokens: list[int] = field(default_factory=list)
    matcher: Any = None  # this row's grammar state (constrained decoding only)


class Generator:
    """What every generation backend holds (:class:`BatchGenerator`, and vLLM's
    :class:`~pipeline.generation.vllm_backend.VllmGenerator`): the tokenizer that decodes completions, the ids
    that end one, how rows are sampled, the longest prompt + completion it takes, and ``stats``, the figures of
    its last ``generate`` call (the generate task reads them). A completion's text is made here, for every
    backend alike, so the task's output is the same whichever backend ran.
    """

    def __init__(self, tokenizer: Any, *, eos_ids: frozenset[int], sampling: SamplingParams, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.sampling = sampling
        self.max_seq_len = max_seq_len
        self.stats: dict[str, float] = {}

    def _completion(self, tokens: list[int]) -> tuple[str, bool]:
        """The text of ``tokens`` (a final end-of-sequence id left out), cut before the first stop string; whether
        one cut it."""
        body = tokens[:-1] if tokens and tokens[-1] in self.eos_ids else tokens
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        cut = find_stop(text, self.sampling.stop) if self.sampling.stop else None
        return (text, False) if cut is None else (text[:cut], True)

    def _count(self, name: str, value: float = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + value


class BatchGenerator(Generator):
    """Generates completions for many prompts with one causal LM, ``slots`` rows at a time.

    Memory is bounded by configuration: the KV cache never holds more than
    ``slots`` rows of at most ``max_seq_len`` tokens (prompt + new tokens);
    a request that could exceed ``max_seq_len`` is refused up front.

    Example::

        gen = BatchGenerator(model, tokenizer, mode="continuous", slots=8, max_seq_len=640)
        results = gen.generate([GenerationRequest(ids, max_new_tokens=32) for ids in prompts])
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        mode: GenerationMode = "continuous",
        slots: int = 8,
        max_seq_len: int = 2048,
        sampling: SamplingParams = SamplingParams(),
        constraint: Any = None,
        batch_class: Any = SlotBatch,
    ) -> None:
        if mode not in ("static", "continuous"):
            raise ValueError(f"mode must be 'static' or 'continuous', got {mode!r}")
        if slots <= 0:
            raise ValueError(f"slots must be positive, got {slots}")
        super().__init__(tokenizer, eos_ids=eos_ids(model, tokenizer), sampling=sampling, max_seq_len=max_seq_len)
        self.model = model
        self.mode = mode
        self.slots = slots
        self.constraint = constraint
        # the rows' model state: SlotBatch (transformers, one KV cache) or llama_cpp_backend.LlamaSlotBatch
        self.batch_class = batch_class
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0))
        self._on_finish: Callable[[int, GenerationResult], None] | None = None

    def one_at_a_time(self) -> "BatchGenerator":
        """A one-slot static generator over the same model: for retrying rows alone after a batch failed."""
        return BatchGenerator(self.model, self.tokenizer, mode="static", slots=1, max_seq_len=self.max_seq_len,
                              sampling=self.sampling, constraint=self.constraint, batch_class=self.batch_class)

    def generate(self, requests: Sequence[GenerationRequest], *,
                 on_finish: Callable[[int, GenerationResult], None] | None = None) -> list[GenerationResult]:
        """Results for ``requests``, in the same order; ``on_finish(index, result)`` as each row ends (progress)."""
        check_requests(requests, self.max_seq_len)
        reset = getattr(self.model, "reset_sequences", None)
        if reset is not None:  # llama.cpp: every sequence free again, whatever a failed call before left behind
            reset()
        self.stats = {}
        self._on_finish = on_finish
        results: list[GenerationResult | None] = [None] * len(requests)
        queue = deque(self._admission_order(requests))
        active: SlotBatch | None = None
        while queue or active is not None:
            free = self.slots - (active.size if active is not None else 0)
            admit = free == self.slots if self.mode == "static" else free > 0
            if queue and admit:
                take = [queue.popleft() for _ in range(min(free, len(queue)))]
                active = self._admit(active, [requests[i] for i in take], take, results)
            if active is None:
                continue
            rows: list[_Row] = active.rows
            started = time.perf_counter()
            logits = active.decode(self.model, [r.tokens[-1] for r in rows])
            self._count("decode_s", time.perf_counter() - started)
            self._count("decode_steps")
            self._count("decode_row_steps", active.size)
            active = self._advance(active, logits, results)
        return [r for r in results if r is not None]

    # ------------------------------------------------------------------ internals
    def _admission_order(self, requests: Sequence[GenerationRequest]) -> list[int]:
        if self.mode == "static":  # similar prompt lengths together: little padding in each prefill
            return sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        return sorted(range(len(requests)), key=lambda i: -(len(requests[i].prompt_ids) + requests[i].max_new_tokens))

    def _admit(self, active: SlotBatch | None, reqs: list[GenerationRequest], indices: list[int],
               results: list[GenerationResult | None]) -> SlotBatch | None:
        """Prefill newcomers (in length-similar groups, images of one shape together), choose their first tokens,
        merge the unfinished ones."""
        for group in (part for lengths in prefill_groups([len(r.prompt_ids) for r in reqs])
                      for part in _same_inputs(lengths, reqs)):
            now = time.perf_counter()
            rows = [_Row(indices[g], reqs[g], None if self.sampling.greedy else make_generator(reqs[g].seed), now,
                         matcher=self.constraint.matcher() if self.constraint is not None else None)
                    for g in group]
            inputs = [reqs[g].inputs for g in group if reqs[g].inputs is not None]
            newcomers, logits = self.batch_class.prefill(
                self.model, rows, [reqs[g].prompt_ids for g in group], pad_id=self.pad_id,
                **({"inputs": inputs} if inputs else {}),
            )
            self._count("prefill_s", time.perf_counter() - now)
            self._count("prefills")
            self._count("prefill_tokens", newcomers.real_tokens)
            self._count("prefill_padded_tokens", newcomers.padded_tokens)
            remaining = self._advance(newcomers, logits, results)
            if remaining is None:
                continue
            if active is None:
                active = remaining
            else:
                active.merge(remaining)
        return active

    def _advance(self, batch: SlotBatch, logits: Any, results: list[GenerationResult | None]) -> SlotBatch | None:
        """Append each row's next token; rows that finish get their result and leave the batch."""
        rows: list[_Row] = batch.rows
        if self.constraint is not None:
            started = time.perf_counter()
            logits = logits.float().contiguous()
            self.constraint.mask(logits, [r.matcher for r in rows])
            self._count("grammar_s", time.perf_counter() - started)
        tokens = choose_tokens(logits, [r.generator for r in rows], self.sampling)
        keep = []
        for b, (row, token) in enumerate(zip(rows, tokens)):
            row.tokens.append(int(token))
            if row.matcher is not None:
                self.constraint.accept(row.matcher, token)
            done = self._finish(row)
            if done is None:
                keep.append(b)
            else:
                results[row.index] = done
                if self._on_finish is not None:
                    self._on_finish(row.index, done)
        batch.keep(keep)
        return batch if batch.size else None

    def _finish(self, row: _Row) -> GenerationResult | None:
        """The row's result if it is done (EOS, a stop string, or its token budget), else None."""
        # with stop strings every step's text is read; without, only a finished row's
        text, stopped = self._completion(row.tokens) if self.sampling.stop else (None, False)
        reason: FinishReason | None = None
        if row.tokens[-1] in self.eos_ids or stopped:
            reason = "stop"
        elif len(row.tokens) >= row.request.max_new_tokens:
            reason = "length"
        if reason is None:
            return None
        if text is None:
            text, _ = self._completion(row.tokens)
        return GenerationResult(
            completion=text, token_ids=list(row.tokens), prompt_tokens=len(row.request.prompt_ids),
            finish_reason=reason, latency_ms=(time.perf_counter() - row.started) * 1000.0,
        )


def check_requests(requests: Sequence[GenerationRequest], max_seq_len: int) -> None:
    """Refuse, before any work, a request no generator can run: empty, no budget, or longer than ``max_seq_len``."""
    for i, req in enumerate(requests):
        if not req.prompt_ids:
            raise ValueError(f"request {i} has an empty prompt; every prompt needs at least one token")
        if req.max_new_tokens <= 0:
            raise ValueError(f"request {i}: max_new_tokens must be positive, got {req.max_new_tokens}")
        if len(req.prompt_ids) + req.max_new_tokens > max_seq_len:
            raise ValueError(
                f"request {i}: {len(req.prompt_ids)} prompt + {req.max_new_tokens} new tokens exceed "
                f"max_seq_len {max_seq_len}; lower max_input_tokens / max_new_tokens or raise max_seq_len"
            )


def prefill_groups(lengths: Sequence[int], *, slack: float = 1.25, extra: int = 8) -> list[list[int]]:
    """Positions of ``lengths`` grouped for prefill so left padding stays small.

    Prefill on CPU costs about the same per padded token as per real token,
    so one 280-token prompt admitted with fifteen 60-token ones would nearly
    triple the prefill work. Rows are sorted by length and a group is closed
    when the next row exceeds ``slack`` x the group's shortest + ``extra``.

    >>> prefill_groups([60, 280, 58, 64, 250])
    [[2, 0, 3], [4, 1]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] <= lengths[groups[-1][0]] * slack + extra:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _same_inputs(group: list[int], reqs: Sequence[GenerationRequest]) -> list[list[int]]:
    """``group`` split so that rows prefilled together carry model inputs of one shape (images a processor
    resized alike stack into one tensor; text-only rows go alone). Text rows: the group as it is."""
    if all(reqs[g].inputs is None for g in group):
        return [group]
    parts: dict[Any, list[int]] = {}
    for g in group:
        inputs = reqs[g].inputs or {}
        parts.setdefault(tuple((k, tuple(v.shape[1:])) for k, v in sorted(inputs.items())), []).append(g)
    return list(parts.values())


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """End-of-sequence ids from the model's generation config and the tokenizer."""
    ids: set[int] = set()
    gen_config = getattr(model, "generation_config", None)
    for value in (getattr(gen_config, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return frozenset(ids)
