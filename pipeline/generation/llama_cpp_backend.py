"""The ``llama_cpp`` generation backend: a GGUF's own 4-bit weights on llama.cpp, through the same decode loop.

``model.precision: int4`` (or ``task.backend: llama_cpp``) runs the GGUF that
a model folder was converted from (``jobs/prepare_llm.py``) natively, through
``llama-cpp-python``'s bindings, instead of its fp32 dequantisation. Only the
model calls change: :class:`LlamaSlotBatch` does what
:class:`~pipeline.generation.kv.SlotBatch` does (prefill newcomers, decode one
token per row, let rows leave and join between steps) on one llama.cpp
context whose KV cache holds one sequence per slot. The
:class:`~pipeline.generation.engine.BatchGenerator` loop around it is the
transformers backend's: the same continuous batching (rows admitted into
free slots at every step), the same prompts (token ids from the folder's
tokenizer, which is the GGUF's vocabulary), per-row sampling, stop strings,
and the JSON-schema constraint (xgrammar masks each row's logits before the
token is chosen).

A row's sequence is its slot in the context: its tokens sit at positions
0..n-1 of that sequence only, so no row ever attends to another's, and a row
that leaves frees its sequence (``llama_memory_seq_rm``) for the next one.
The context holds ``slots + 1`` sequences of ``max_seq_len`` tokens, so
memory is bounded by configuration.

The extra sequence holds the prompts' common prefix (the chat template's
system prompt, the extract task's schema: the same tokens at the start of
every row's prompt). A newcomer's prompt that starts with it gets the
prefix's KV cells shared into its own sequence (``llama_memory_seq_cp``:
the same cells, no copy) and only the rest of its prompt is computed; its
keys and values are those a full prefill would compute (same tokens, same
positions), so results do not depend on it. This is prefix caching, as
vLLM and llama.cpp's server do it; the transformers backend has none.

Greedy results are llama.cpp's arithmetic (Q4_1 weights, Q8 activations in
its dot products), not the fp32 backend's: close, not bit-identical
(``bench/bench_precision.py`` measures validity and accuracy against fp32).
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any, Sequence

__all__ = ["LlamaCppModel", "LlamaSlotBatch", "find_gguf", "llama_cpp_available", "load_llama_cpp"]


def llama_cpp_available() -> bool:
    """Whether this Python can import ``llama_cpp`` (llama-cpp-python, built from its sdist by ``make venv``)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def find_gguf(model_dir: Path, gguf: str | None = None) -> Path:
    """The GGUF file for ``model_dir``: ``gguf`` when given (a path, or ``package:<module>/<file>``), else a
    ``*.gguf`` in the folder, else the file the folder was converted from (its ``gguf_source.json``)."""
    from pipeline.generation.gguf import packaged_gguf
    from pipeline.models.loading import ModelError

    if gguf:
        if gguf.startswith("package:"):
            module, _, name = gguf[len("package:"):].partition("/")
            return packaged_gguf(module, name)
        path = Path(gguf).expanduser()
        if not path.is_file():
            raise ModelError(f"task.gguf {gguf!r} is not a file; point it at a .gguf (or package:<module>/<file>)")
        return path
    inside = sorted(Path(model_dir).glob("*.gguf"))
    if inside:
        return inside[0]
    marker = Path(model_dir) / "gguf_source.json"
    if marker.is_file():
        source = json.loads(marker.read_text())
        recorded = Path(source.get("path", ""))
        if source.get("path") and recorded.is_file() and recorded.stat().st_size == source.get("bytes"):
            return recorded
        from pipeline.generation.gguf import DEMO_GGUF

        if source.get("gguf") == DEMO_GGUF[1]:
            return packaged_gguf(*DEMO_GGUF)
    raise ModelError(
        f"model folder {model_dir} has no GGUF to run at int4 (no *.gguf in it, and no gguf_source.json naming one "
        "that is here); set task.gguf to the .gguf file, or use model.precision fp32"
    )


class LlamaCppModel:
    """One llama.cpp model and context (``slots`` sequences of ``max_seq_len`` tokens), and the HF config beside it.

    ``config`` and ``generation_config`` are the converted folder's (vocabulary size,
    end-of-sequence ids), so the grammar and the stop rules are the fp32 backend's.
    """

    def __init__(self, gguf: Path, *, config: Any, generation_config: Any, slots: int, max_seq_len: int,
                 threads: int, batch_tokens: int = 512) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaContext, LlamaModel

        _quiet_llama_log()
        self.gguf = gguf
        self.config = config
        self.generation_config = generation_config
        self.device = "cpu"
        self.slots = slots
        self.max_seq_len = max_seq_len
        self.batch_tokens = max(batch_tokens, slots)
        params = llama_cpp.llama_model_default_params()
        self._model = LlamaModel(path_model=str(gguf), params=params, verbose=False)
        ctx = llama_cpp.llama_context_default_params()
        ctx.n_ctx = (slots + 1) * max_seq_len
        ctx.n_batch = ctx.n_ubatch = self.batch_tokens
        ctx.n_seq_max = slots + 1
        ctx.kv_unified = True  # one pool of cells: the prefix sequence's cells are shared by the rows' sequences
        ctx.n_threads = ctx.n_threads_batch = max(1, int(threads))
        self._ctx = LlamaContext(model=self._model, params=ctx, verbose=False)
        self.vocab_size = int(llama_cpp.llama_vocab_n_tokens(self._model.vocab))
        self._batch = llama_cpp.llama_batch_init(self.batch_tokens, 0, 1)
        self.free_seqs = list(range(slots))[::-1]
        self.prefix_seq = slots
        self.prefix: list[int] = []  # the tokens in the prefix sequence
        self.min_prefix = 16  # fewer common tokens than this are not worth a sequence

    def share_prefix(self, prompts: Sequence[Sequence[int]], seqs: Sequence[int]) -> list[int]:
        """Share the cached common prefix into ``seqs`` (caching the prompts' own first); tokens shared per prompt.

        A prefix is cached when none is and ``prompts`` (two or more) start with at least ``min_prefix``
        common tokens. Each prompt keeps at least its last token to compute (its logits).
        """
        import llama_cpp

        if not self.prefix and len(prompts) > 1:
            common = _common_prefix(prompts)
            if len(common) >= self.min_prefix:
                for start in range(0, len(common), self.batch_tokens):
                    part = common[start : start + self.batch_tokens]
                    self.run([(int(t), start + i, self.prefix_seq, False) for i, t in enumerate(part)])
                self.prefix = [int(t) for t in common]
        shared = []
        for prompt, seq in zip(prompts, seqs):
            n = min(len(_common_prefix([self.prefix, prompt])), len(prompt) - 1) if self.prefix else 0
            if n > 0:
                llama_cpp.llama_memory_seq_cp(self._ctx.memory, self.prefix_seq, seq, 0, n)
            shared.append(n)
        return shared

    def run(self, entries: Sequence[tuple[int, int, int, bool]]) -> list[Any]:
        """Decode ``entries`` (token, position, sequence, wants logits) in one llama.cpp batch; the logits of each
        entry that wants them, in order, as numpy views (valid until the next call)."""
        import llama_cpp
        import numpy as np

        from pipeline.errors import EngineError

        batch = self._batch
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i] = token, pos
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq
            batch.logits[i] = logits
        batch.n_tokens = len(entries)
        code = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            raise EngineError(f"llama.cpp decode failed with status {code} on {len(entries)} tokens")
        out = []
        for i, entry in enumerate(entries):
            if entry[3]:
                pointer = llama_cpp.llama_get_logits_ith(self._ctx.ctx, i)
                out.append(np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                                 shape=(self.vocab_size,)))
        return out

    def reset_sequences(self) -> None:
        """Forget every sequence's tokens: all ``slots`` sequences free (at the start of each generate call)."""
        import llama_cpp

        llama_cpp.llama_memory_clear(self._ctx.memory, True)
        self.free_seqs = list(range(self.slots))[::-1]
        self.prefix = []

    def release(self, seq: int) -> None:
        """Forget sequence ``seq``'s tokens and give it back to the pool."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)
        self.free_seqs.append(seq)

    def close(self) -> None:
        import llama_cpp

        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()
        self._model.close()


class LlamaSlotBatch:
    """The rows being decoded together on a :class:`LlamaCppModel`: each row's sequence and next position.

    The interface of :class:`~pipeline.generation.kv.SlotBatch` (``prefill``, ``decode``,
    ``keep``, ``merge``, ``size``, ``rows``, and its token counts), so the generator's loop runs unchanged.
    Prompts are not padded: a row's prompt goes into its own sequence.
    """

    def __init__(self, model: LlamaCppModel, rows: list[Any], seqs: list[int], next_pos: list[int]) -> None:
        self.model = model
        self.rows = rows
        self.seqs = seqs
        self.next_pos = next_pos
        self.real_tokens = self.padded_tokens = sum(next_pos)

    @property
    def size(self) -> int:
        return len(self.rows)

    @classmethod
    def prefill(cls, model: LlamaCppModel, rows: Sequence[Any], prompts: Sequence[Sequence[int]], *,
                pad_id: int) -> tuple["LlamaSlotBatch", Any]:
        """Feed each prompt into a free sequence (as many prompts per llama.cpp batch as fit); last-token logits."""
        import torch

        if len(prompts) > len(model.free_seqs):
            raise ValueError(f"{len(prompts)} prompts for {len(model.free_seqs)} free llama.cpp sequences")
        seqs = [model.free_seqs.pop() for _ in prompts]
        shared = model.share_prefix(prompts, seqs)
        logits: list[Any] = []
        pending: list[tuple[int, int, int, bool]] = []
        for seq, prompt, skip in zip(seqs, prompts, shared):
            for pos in range(skip, len(prompt)):
                if len(pending) == model.batch_tokens:
                    logits += [torch.from_numpy(x.copy()) for x in model.run(pending)]
                    pending = []
                pending.append((int(prompt[pos]), pos, seq, pos == len(prompt) - 1))
        logits += [torch.from_numpy(x.copy()) for x in model.run(pending)]
        batch = cls(model, list(rows), seqs, [len(p) for p in prompts])
        batch.real_tokens = batch.padded_tokens = sum(len(p) for p in prompts) - sum(shared)  # tokens computed
        return batch, torch.stack(logits)

    def decode(self, model: LlamaCppModel, tokens: Sequence[int]) -> Any:
        """Feed one token per row; the next-token logits ``[rows, vocab]``."""
        import numpy as np
        import torch

        if len(tokens) != self.size:
            raise ValueError(f"decode got {len(tokens)} tokens for {self.size} rows")
        out = model.run([(int(t), p, s, True) for t, p, s in zip(tokens, self.next_pos, self.seqs)])
        self.next_pos = [p + 1 for p in self.next_pos]
        return torch.from_numpy(np.stack(out))

    def keep(self, keep: Sequence[int]) -> None:
        """Keep rows ``keep`` (in that order); the others' sequences are freed for newcomers."""
        kept = set(keep)
        for i, seq in enumerate(self.seqs):
            if i not in kept:
                self.model.release(seq)
        self.rows = [self.rows[i] for i in keep]
        self.seqs = [self.seqs[i] for i in keep]
        self.next_pos = [self.next_pos[i] for i in keep]

    def merge(self, other: "LlamaSlotBatch") -> None:
        self.rows += other.rows
        self.seqs += other.seqs
        self.next_pos += other.next_pos


def load_llama_cpp(model_dir: Path, *, gguf: str | None, slots: int, max_seq_len: int, threads: int) -> LlamaCppModel:
    """The :class:`LlamaCppModel` for ``model_dir`` (its GGUF found by :func:`find_gguf`)."""
    from transformers import AutoConfig, GenerationConfig

    if not llama_cpp_available():
        raise RuntimeError(
            "model.precision int4 (task.backend llama_cpp) needs llama-cpp-python, which this Python worker cannot "
            "import; make venv builds it from its sdist (cmake and a C++ compiler), or use model.precision fp32"
        )
    path = find_gguf(model_dir, gguf)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    try:
        generation = GenerationConfig.from_pretrained(str(model_dir), local_files_only=True)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    return LlamaCppModel(path, config=config, generation_config=generation, slots=slots, max_seq_len=max_seq_len,
                         threads=threads)


def _common_prefix(prompts: Sequence[Sequence[int]]) -> list[int]:
    """The longest run of tokens every prompt starts with.

    >>> _common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]])
    [1, 2]
    """
    first = list(prompts[0])
    n = len(first)
    for p in prompts[1:]:
        n = min(n, len(p))
        for i in range(n):
            if p[i] != first[i]:
                n = i
                break
    return first[:n]


_LOG_CALLBACK: Any = None


def _quiet_llama_log() -> None:
    """Route llama.cpp's own log (model loading prints pages of it) to nowhere, once per process."""
    global _LOG_CALLBACK
    import llama_cpp

    if _LOG_CALLBACK is None:
        _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
