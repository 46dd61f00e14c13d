"""One chunk of ``generate`` (and ``extract``) on a local backend: each row's status, prompt, budget and completion.

:func:`generate_chunk` flags the rows that are not generated (``malformed``,
``skipped_null`` or ``skipped_empty`` when any template value is null or
blank, ``skipped_no_content`` when no value carries anything for the model,
``error`` for a prompt the model cannot take or a bad per-row budget), builds
one request per remaining row (its prompt, token budget and sampling seed)
and generates them together (:func:`_generate`): if the whole batch fails,
row by row, so one bad row never fails its neighbours. A failed engine is
dropped from the worker so Spark's retry of the task starts a fresh one.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from pipeline.core import faults
from pipeline.generation.engine import GenerationRequest, GenerationResult
from pipeline.generation.sampling import row_seed
from pipeline.generation.vllm_backend import EngineError
from pipeline.core.metrics import WorkerCounts
from pipeline.core.rows import Status
from pipeline.tasks._content import carries_content, content_free, malformed_rows, special_token_ids
from pipeline.tasks._generate_images import RowImage
from pipeline.tasks._generate_rows import sent_rows

__all__ = ["generate_chunk", "row_budget"]


def generate_chunk(task: Any, loaded: Any, chunk: pa.RecordBatch, cols: dict[str, list[Any]],
                   counts: WorkerCounts) -> tuple[list[GenerationResult | None], np.ndarray, np.ndarray, np.ndarray]:
    """``(results, status, error, truncated)`` of a chunk on a local backend (transformers, vLLM, llama.cpp)."""
    n = chunk.num_rows
    status = np.full(n, Status.OK, dtype=object)
    error = np.full(n, None, dtype=object)
    truncated = np.zeros(n, dtype=bool)
    results: list[GenerationResult | None] = [None] * n
    cfg = task.config

    rows, texts, requests = [], [], []
    special = special_token_ids(loaded.tokenizer)
    has_content = partial(_has_content, cfg, loaded.tokenizer, special=special)
    for i, values, image in sent_rows(task, cols, malformed_rows(chunk), status, error, has_content):
        try:
            request, cut = _request(task, loaded, cols, i, values, image)
        except ValueError as exc:
            status[i], error[i] = Status.ERROR, str(exc)
            continue
        rows.append(i)
        texts.append(" ".join(map(str, values.values())))
        requests.append(request)
        truncated[i] = cut
        if cut:
            status[i] = Status.TRUNCATED

    for i, result in zip(rows, _generate(loaded, requests, texts, counts)):
        results[i] = result
        if result.finish_reason == "error":
            status[i], error[i] = Status.ERROR, result.error
    return results, status, error, truncated


def _request(task: Any, loaded: Any, cols: Mapping[str, list[Any]], i: int, values: Mapping[str, Any],
             image: RowImage | None) -> tuple[GenerationRequest, bool]:
    """Row ``i``'s request (prompt, budget, seed; its image's inputs) and whether its text was cut to fit."""
    cfg = task.config
    key = cols[cfg.seed_column][i] if cfg.seed_column else "\x1f".join(map(str, values.values()))
    if image is None:
        prompt = loaded.prompts.build(values)
        _check_vocab(prompt.token_ids, loaded.vocab_size)
        return GenerationRequest(prompt.token_ids, row_budget(cfg, cols, i), row_seed(cfg.seed, key)), prompt.truncated
    pil = image.pil()
    try:
        shown = loaded.prompts.build_row(values, pil)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the processor refused this image: the row's error
        raise ValueError(f"the model's processor could not take this image: {type(exc).__name__}: {exc}") from exc
    _check_vocab(shown.token_ids, loaded.vocab_size)
    seed = row_seed(cfg.seed, key if cfg.seed_column else f"{key}\x1f{image.digest}")
    expanded = loaded.prompts.expand
    return GenerationRequest(shown.token_ids, row_budget(cfg, cols, i), seed, inputs=shown.inputs if expanded else None,
                             images=() if expanded else (pil,)), shown.truncated


def row_budget(config: Any, cols: Mapping[str, list[Any]], i: int) -> int:
    """Row ``i``'s max_new_tokens: its column value (capped at the limit) or the config default."""
    value = cols[config.max_new_tokens_column][i] if config.max_new_tokens_column else None
    if value is None:
        return config.max_new_tokens
    if int(value) <= 0:
        raise ValueError(f"{config.max_new_tokens_column} is {value}; it must be a positive number of tokens")
    return min(int(value), config.max_new_tokens_limit)


def _has_content(config: Any, tokenizer: Any, value: str, *, special: frozenset[int]) -> bool:
    """Whether one template value (the row's own text, not the template) gives the model anything.

    A row is generated when any of its values does. Cut like the prompt
    (``max_input_tokens`` x 16 characters) before tokenising.
    """
    if not carries_content(value):
        return False
    cap = config.max_input_tokens * 16  # the prompt builder's clip (pipeline.generation.prompts)
    clipped = value[:cap] if config.truncation == "keep_start" else value[-cap:]
    return not content_free(tokenizer(clipped, add_special_tokens=False)["input_ids"], special)


def _check_vocab(token_ids: Sequence[int], vocab_size: int | None) -> None:
    top = max(token_ids, default=0)
    if vocab_size is not None and top >= vocab_size:
        raise ValueError(
            f"the prompt has token id {top}, past the model's vocabulary of {vocab_size}: the tokenizer "
            "does not match the model (use the tokenizer saved with these weights)"
        )


def _generate(loaded: Any, requests: list[GenerationRequest], texts: list[str],
              counts: WorkerCounts) -> list[GenerationResult]:
    """Generate all rows together; if the batch fails (e.g. out of memory), retry rows one at a time."""
    if not requests:
        return []
    gen = loaded.generator

    def finished(_: int, result: GenerationResult) -> None:
        # progress only (a chunk of generation can take minutes); the run's totals are added below
        counts.add("progress_rows")
        counts.add("progress_tokens", result.prompt_tokens + result.completion_tokens)
        if counts.on_batch is not None:
            counts.on_batch(counts)

    started = time.perf_counter()
    try:
        if faults.enabled:  # drills: run.faults poison_marker / oom_above_rows
            faults.check_batch(texts)
        results = gen.generate(requests, on_finish=finished)
        stats = gen.stats
    except EngineError:
        _drop_engine(loaded)
        raise
    except Exception:  # noqa: BLE001 - out of memory, or a row the engine rejects: find it row by row
        counts.add("generate_batch_failures")
        results, stats = [], {}
        for request, text in zip(requests, texts):
            result, row_stats = _generate_alone(gen, request, text)
            results.append(result)
            for name, value in row_stats.items():
                stats[name] = stats.get(name, 0) + value
    prompt_tokens = sum(r.prompt_tokens for r in results)  # vLLM's count an image's tokens as it expanded them
    completion_tokens = sum(r.completion_tokens for r in results)
    counts.add("prompt_tokens", prompt_tokens)
    counts.add("completion_tokens", completion_tokens)
    counts.add("tokens", prompt_tokens + completion_tokens)
    # vLLM pads nothing: its prefill tokens are the prompt tokens
    prefill_padded = stats.get("prefill_padded_tokens", prompt_tokens)
    counts.add("padded_tokens", int(prefill_padded + stats.get("decode_row_steps", 0)))
    counts.add("batches", int(stats.get("prefills", stats.get("steps", 0))))
    counts.add("generate_seconds", stats.get("prefill_s", 0.0) + stats.get("decode_s", 0.0) + stats.get("step_s", 0.0))
    # per-batch metrics: one generate call (a chunk's rows) is the batch here
    counts.record_batch(rows=len(requests), tokens=prompt_tokens + completion_tokens,
                        padded_tokens=int(prefill_padded + stats.get("decode_row_steps", 0)),
                        padded_length=max(len(r.prompt_ids) for r in requests),
                        seconds=time.perf_counter() - started)
    return results


def _generate_alone(gen: Any, request: GenerationRequest, text: str) -> tuple[GenerationResult, dict]:
    """One row on its own: its result (an error result if it fails alone too) and the generator's counters."""
    single = gen.one_at_a_time()
    try:
        if faults.enabled:
            faults.check_batch([text])
        return single.generate([request])[0], dict(single.stats)
    except EngineError:
        raise  # the engine, not the row: _generate drops it and the task is retried
    except Exception as exc:  # noqa: BLE001 - the row is flagged with the error, never dropped
        return GenerationResult("", [], len(request.prompt_ids), "error", 0.0,
                                error=f"generation failed for this row alone: {type(exc).__name__}: {exc}"), {}


def _drop_engine(loaded: Any) -> None:
    """Forget a failed engine in this worker, so Spark's retry of the task builds a fresh one."""
    from pipeline.generation.vllm_backend import shutdown_engine
    from pipeline.models import cache

    cache.discard(lambda obj: obj is loaded)
    shutdown_engine()
