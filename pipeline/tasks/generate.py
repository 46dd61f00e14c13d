"""``generate``: one completion per row from a prompt template, with static or continuous batching.

Each row becomes a prompt (``task.template`` over its columns, inside the
model's chat template when it has one), is generated with its own token
budget and its own sampling seed, and gets back ``completion``,
``prompt_tokens``, ``completion_tokens``, ``finish_reason`` (stop, length,
error) and ``latency_ms``, plus the shared status columns. Rows where any
template column is null (``skipped_null``) or blank (``skipped_empty``) are
flagged, never dropped; so are rows whose template values together carry
nothing for the model (``skipped_no_content``: only control or format
characters and U+FFFD, or only the tokenizer's special and unknown tokens).
Binary columns are decoded as UTF-8, invalid bytes becoming U+FFFD.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Hashable, Literal, Sequence, Union

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from pipeline import faults
from pipeline.config import BatchingConfig, ModelConfig, TaskConfig
from pipeline.endpoint.config import EndpointConfig
from pipeline.generation.config import VllmConfig
from pipeline.generation.engine import BatchGenerator, GenerationRequest, GenerationResult
from pipeline.generation.prompts import PromptBuilder, template_fields
from pipeline.generation.sampling import SamplingParams, row_seed
from pipeline.generation.vllm_backend import EngineError
from pipeline.metrics import WorkerCounts
from pipeline.registry import register_task
from pipeline.rows import Status
from pipeline.tasks._endpoint import EndpointJob
from pipeline.tasks.base import (
    MALFORMED, MALFORMED_ERROR, NO_CONTENT, STATUS_FIELDS, carries_content, content_free, malformed_rows,
    special_token_ids,
)

__all__ = ["GenerateTask", "GenerateTaskConfig", "LoadedGenerator"]


class GenerateTaskConfig(TaskConfig):
    """Text generation with a causal LM: one completion per row from a prompt template.

    Memory is bounded here, not by the machine: the KV cache holds at most
    ``slots`` rows of ``max_input_tokens + max_new_tokens_limit`` tokens
    (checked against ``max_kv_cache_mb`` when set).
    """

    kind: Literal["generate"] = "generate"
    # Same tokens whatever the batching (tests/test_generation.py: static and continuous batching equal
    # unbatched generate at any slot count); the others only size or place the KV cache and engine.
    # No batching key is read by this kind.
    fingerprint_ignore: ClassVar[frozenset[str]] = frozenset({
        "mode", "slots", "max_kv_cache_mb", "vllm.max_num_seqs", "vllm.gpu_memory_utilization",
        "vllm.kv_cache_mb", "vllm.in_process", *(f"endpoint.{k}" for k in EndpointConfig.PER_TRY),
    })
    fingerprint_batching: ClassVar[tuple[str, ...]] = ()
    per_try_settings: ClassVar[frozenset[str]] = frozenset(f"endpoint.{k}" for k in EndpointConfig.PER_TRY)
    backend: Literal["auto", "transformers", "vllm", "llama_cpp", "endpoint"] = Field(
        "auto", description="`transformers`, `vllm`, `llama_cpp` (the GGUF's int4 weights; `model.precision int4`), "
        "`endpoint` (an OpenAI-compatible server: `task.endpoint`), or `auto` (llama_cpp for int4, else vllm where "
        "the worker imports it, else transformers)")
    gguf: str | None = Field(
        None, description="int4 / llama_cpp: the .gguf file (or `package:<module>/<file>`); none: a *.gguf in the "
        "model folder, else the file the folder was converted from (jobs/prepare_llm.py)")
    # vLLM always batches continuously
    mode: Literal["static", "continuous"] = Field(
        "continuous", description="transformers backend: `continuous` (finished rows leave, queued prompts join "
        "at the next step) or `static` (fixed length-sorted batches)")
    template: str = Field(
        "{text}", description="prompt: `str.format` over column names; the columns it names are the task's inputs")
    use_chat_template: Union[bool, Literal["auto"]] = Field(
        "auto", description="wrap the prompt in the model's chat template (`auto`: when it has one)")
    system_prompt: str | None = Field(None, description="system message inside the chat template")
    max_input_tokens: int = Field(512, gt=0, description="prompt tokens per row; longer inputs are cut and flagged")
    truncation: Literal["keep_start", "keep_end"] = Field(
        "keep_start", description="which end of an over-long column value survives (the template is never cut)")
    max_new_tokens: int = Field(64, gt=0, description="tokens generated per row")
    max_new_tokens_column: str | None = Field(
        None, description="an integer column with a per-row budget (nulls fall back to `max_new_tokens`)")
    max_new_tokens_limit: int = Field(256, gt=0, description="the largest per-row budget (sizes the KV cache)")
    temperature: float = Field(0.0, ge=0, description="0 is greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    seed: int = Field(0, description="sampling seed, combined with each row's key")
    seed_column: str | None = Field(None, description="column whose value seeds each row; none: the prompt text")
    stop: list[str] = Field(default_factory=list, description="stop strings (cut from the completion)")
    slots: int = Field(8, gt=0, description="transformers backend: rows decoded together (vllm: `vllm.max_num_seqs`)")
    max_kv_cache_mb: float | None = Field(None, gt=0, description="refuse configs whose KV cache needs more")
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    endpoint: EndpointConfig | None = Field(
        None, description="the server of `backend: endpoint` (`base_url`, `model`, `api_key`, limits; see below)")

    @model_validator(mode="after")
    def _limits(self) -> "GenerateTaskConfig":
        if self.backend == "endpoint" and self.endpoint is None:
            raise ValueError("backend endpoint needs task.endpoint: {base_url: ..., model: ...}")
        if self.endpoint is not None and self.backend != "endpoint":
            raise ValueError(f"task.endpoint is set but task.backend is {self.backend!r}; set backend: endpoint")
        if self.max_new_tokens > self.max_new_tokens_limit:
            raise ValueError(
                f"max_new_tokens {self.max_new_tokens} exceeds max_new_tokens_limit {self.max_new_tokens_limit}; "
                "raise the limit (it sizes the KV cache) or lower max_new_tokens"
            )
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        return self

    def check_job(self, job: Any) -> None:
        precision = job.model.precision
        if self.backend == "endpoint":
            if precision != "fp32":
                raise ValueError(f"model.precision {precision!r} is the server's choice on the endpoint "
                                 "backend; leave it unset")
            return
        if not job.model.path:
            raise ValueError("model.path is required (a model folder) unless task.backend is endpoint")
        if precision == "int8":
            raise ValueError(
                "model.precision int8 is for encoder tasks (embed, classify); "
                "generate runs in fp32, bf16 or fp16 (weights loaded in that dtype), or int4 (the GGUF on llama.cpp)"
            )
        if self.backend == "llama_cpp" and precision not in ("int4", "auto"):
            raise ValueError(f"task.backend llama_cpp runs a GGUF's int4 weights; set model.precision int4 (or auto), "
                             f"not {precision}")
        if precision == "int4" and self.backend in ("transformers", "vllm"):
            raise ValueError(f"model.precision int4 runs on task.backend llama_cpp (or auto), not {self.backend}")


RESULT_FIELDS = [
    pa.field("completion", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("completion_tokens", pa.int32()),
    pa.field("finish_reason", pa.string()),
    pa.field("latency_ms", pa.float64()),
]


@dataclass
class LoadedGenerator:
    """What ``load`` builds once per worker: tokenizer, prompt builder and the generator of one backend.

    ``generator`` is a :class:`BatchGenerator` (transformers) or a
    :class:`~pipeline.generation.vllm_backend.VllmGenerator`: both take
    ``GenerationRequest``s and return ``GenerationResult``s in input order.
    """

    tokenizer: Any
    prompts: PromptBuilder
    generator: Any
    backend: str = "transformers"
    precision: str = "fp32"
    # the model's vocabulary (config.json): a prompt token past it means a tokenizer that does not match
    vocab_size: int | None = None

    @property
    def load_counts(self) -> dict[str, Any]:
        """Merged into the run's counts once per load: the summary shows which backend and precision ran."""
        if self.backend == "vllm":
            mode = f"continuous, {self.generator.placement}"
        elif self.backend == "llama_cpp":
            mode = f"{self.generator.mode}, int4 weights ({self.generator.model.gguf.name})"
        else:  # the dtype the weights were loaded in, read from the model itself
            mode = f"{self.generator.mode}, {self.precision} weights"
        return {"precision_used": {self.precision: 1}, "generation_backend": {f"{self.backend} ({mode})": 1}}


class GenerateTask:
    """The ``generate`` task (see the module docstring); ``input_columns`` come from the template."""

    kind: ClassVar[str] = "generate"
    # Rows per inference task unless spark.rows_per_task is set: decoding is slow and continuous batching
    # needs no big chunks, so smaller tasks let the progress line move (pipeline.spark.planning).
    rows_per_task: ClassVar[int] = 512

    def __init__(self, config: GenerateTaskConfig, *, model: ModelConfig, batching: BatchingConfig) -> None:
        self.config = config
        self.model = model
        self.batching = batching
        self.template_columns = template_fields(config.template)
        extra = [c for c in (config.max_new_tokens_column, config.seed_column) if c]
        self.input_columns: tuple[str, ...] = tuple(dict.fromkeys([*self.template_columns, *extra]))

    @property
    def max_seq_len(self) -> int:
        return self.config.max_input_tokens + self.config.max_new_tokens_limit

    def positions_needed(self) -> tuple[int, str]:
        """The longest sequence a row can reach (prompt + generated tokens), checked on the driver."""
        return self.max_seq_len, "task.max_input_tokens + task.max_new_tokens_limit"

    # -- protocol ---------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        return pa.schema(RESULT_FIELDS + STATUS_FIELDS)

    def cache_key(self) -> Hashable:
        return (self.kind, self.model.path, self.model.precision, self.model.device, repr(self.config))

    # -- the endpoint backend: no local model; each task attempt gets its journal and budget ---------
    @property
    def journals_requests(self) -> bool:
        """Whether rows go to a server (the Spark glue then binds each attempt: :meth:`bind_attempt`)."""
        return self.config.backend == "endpoint"

    def bind_attempt(self, journal: Any, *, max_tokens: int | None, rate_share: float) -> None:
        """This attempt's request journal, the run's token budget and this task's share of the rates."""
        from pipeline.tasks._endpoint import Attempt

        self.attempt = Attempt(journal=journal, max_tokens=max_tokens, rate_share=rate_share)

    def resolve_model_dir(self, path: str) -> Path | None:
        """The local model folder to load (none on the endpoint backend: the server holds the model)."""
        if self.config.backend == "endpoint":
            return None
        from pipeline.models.loading import resolve_model_path

        return resolve_model_path(path, registry_uri=self.model.registry_uri)

    def load(self, model_dir: Path | None, device: str) -> Any:
        from pipeline.models.loading import read_model_config

        cfg = self.config
        if cfg.backend == "endpoint":
            from pipeline.tasks._endpoint import LoadedEndpoint

            return LoadedEndpoint(cfg.endpoint)
        assert model_dir is not None
        backend = self._backend(model_dir)
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, stop=tuple(cfg.stop))
        precision = self.model.precision
        if backend == "vllm":
            tokenizer, generator = self._load_vllm(model_dir, device, sampling)
        elif backend == "llama_cpp":
            tokenizer, generator = self._load_llama_cpp(model_dir, sampling)
            precision = "int4"
        else:
            from pipeline.generation.loading import weights_precision

            tokenizer, generator = self._load_transformers(model_dir, device, sampling)
            precision = weights_precision(generator.model)
        prompts = PromptBuilder(
            tokenizer, template=cfg.template, use_chat_template=cfg.use_chat_template,
            system_prompt=self.system_prompt(), max_input_tokens=cfg.max_input_tokens, truncation=cfg.truncation,
        )
        vocab = read_model_config(model_dir).get("vocab_size")
        return LoadedGenerator(tokenizer, prompts, generator, backend=backend, precision=precision,
                               vocab_size=int(vocab) if vocab else None)

    @property
    def _dense_precision(self) -> str:
        """The weights' dtype on the transformers and vllm backends (``auto`` without llama.cpp: fp32)."""
        return "fp32" if self.model.precision == "auto" else self.model.precision

    def _backend(self, model_dir: Path) -> str:
        """The backend that runs: llama_cpp for int4 (and for auto where it and a GGUF are here), else as configured.

        ``auto`` precision picks int4 on llama.cpp where this worker can (it is several times faster than fp32
        on a CPU, docs/benchmarks_generation.md); its accuracy is measured by ``make bench-precision``, not gated
        at load. Anything else runs the transformers backend at fp32.
        """
        from pipeline.generation.vllm_backend import resolve_backend

        precision, backend = self.model.precision, self.config.backend
        if precision == "int4" or backend == "llama_cpp":
            return "llama_cpp"
        if precision == "auto" and backend == "auto" and not str(self.model.device).startswith("cuda"):
            from pipeline.generation.llama_cpp_backend import find_gguf, llama_cpp_available
            from pipeline.models.loading import ModelError

            try:
                if llama_cpp_available() and find_gguf(model_dir, self.config.gguf):
                    return "llama_cpp"
            except ModelError:
                pass
        return resolve_backend(backend)

    def _load_llama_cpp(self, model_dir: Path, sampling: SamplingParams) -> tuple[Any, BatchGenerator]:
        import torch
        from transformers import AutoTokenizer

        from pipeline.generation.llama_cpp_backend import LlamaSlotBatch, load_llama_cpp

        cfg = self.config
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        model = load_llama_cpp(model_dir, gguf=cfg.gguf, slots=cfg.slots, max_seq_len=self.max_seq_len,
                               threads=torch.get_num_threads())
        generator = BatchGenerator(model, tokenizer, mode=cfg.mode, slots=cfg.slots, max_seq_len=self.max_seq_len,
                                   sampling=sampling, constraint=self.constraint(tokenizer, model),
                                   batch_class=LlamaSlotBatch)
        return tokenizer, generator

    def _load_transformers(self, model_dir: Path, device: str, sampling: SamplingParams) -> tuple[Any, BatchGenerator]:
        from pipeline.generation.kv import check_kv_budget, kv_cache_bytes
        from pipeline.generation.loading import load_causal_lm

        cfg = self.config
        tokenizer, model = load_causal_lm(model_dir, device=device, precision=self._dense_precision,
                                          allow_pickle=self.model.allow_pickle)
        if cfg.max_kv_cache_mb is not None:
            width = next(model.parameters()).element_size()
            need = kv_cache_bytes(model.config, rows=cfg.slots, max_seq_len=self.max_seq_len, bytes_per_value=width)
            check_kv_budget(need, cfg.max_kv_cache_mb, what=f"{cfg.slots} slots x {self.max_seq_len} tokens",
                            knob="task.slots")
        generator = BatchGenerator(model, tokenizer, mode=cfg.mode, slots=cfg.slots, max_seq_len=self.max_seq_len,
                                   sampling=sampling, constraint=self.constraint(tokenizer, model))
        return tokenizer, generator

    def _load_vllm(self, model_dir: Path, device: str, sampling: SamplingParams) -> tuple[Any, Any]:
        from pipeline.generation.loading import check_causal_lm
        from pipeline.generation.vllm_backend import load_vllm
        from pipeline.models import cache
        from pipeline.models.device import task_gpu_addresses

        cfg = self.config
        check_causal_lm(model_dir)
        # one engine per worker: a cached one (another config) is dropped here and shut down by load_vllm
        cache.discard(lambda obj: isinstance(obj, LoadedGenerator) and obj.backend == "vllm")
        gpus = task_gpu_addresses() if device.startswith("cuda") else ()
        return load_vllm(model_dir, config=cfg.vllm, precision=self._dense_precision, max_seq_len=self.max_seq_len,
                         sampling=sampling, gpu_addresses=gpus, max_kv_cache_mb=cfg.max_kv_cache_mb,
                         json_schema=self.vllm_json_schema())

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        missing = [c for c in self.input_columns if c not in chunk.schema.names]
        if missing:
            raise ValueError(
                f"generate: input chunk lacks column(s) {missing} (has {chunk.schema.names}); the template "
                f"{self.config.template!r} and task settings need {list(self.input_columns)}"
            )
        n = chunk.num_rows
        cols = {c: chunk.column(chunk.schema.get_field_index(c)).to_pylist() for c in self.input_columns}
        truncated = np.zeros(n, dtype=bool)
        if getattr(loaded, "backend", None) == "endpoint":
            from pipeline.tasks._endpoint import attempt_client, generate_rows

            client = attempt_client(self.config.endpoint, getattr(self, "attempt", None))
            results, status, error = generate_rows(self, cols, malformed_rows(chunk), counts, client)
        else:
            results, status, error, truncated = self._generate_rows(loaded, chunk, cols, counts)
        leading = self.check_outputs(results, status, error)

        counts.add("rows", n)
        counts.add("chunks")
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        reasons: dict[str, int] = {}
        for result in results:
            if result is not None:
                reasons[result.finish_reason] = reasons.get(result.finish_reason, 0) + 1
        counts.merge({"finish_reasons": reasons})
        return self._to_batch(results, truncated, status, error, leading=leading)

    def _generate_rows(self, loaded: LoadedGenerator, chunk: pa.RecordBatch, cols: dict[str, list[Any]],
                       counts: WorkerCounts) -> tuple[list[GenerationResult | None], np.ndarray, np.ndarray,
                                                      np.ndarray]:
        """``(results, status, error, truncated)`` of a chunk on a local backend (transformers, vLLM)."""
        n = chunk.num_rows
        status = np.full(n, Status.OK, dtype=object)
        error = np.full(n, None, dtype=object)
        truncated = np.zeros(n, dtype=bool)
        results: list[GenerationResult | None] = [None] * n

        rows, texts, requests = [], [], []
        special = special_token_ids(loaded.tokenizer)
        malformed = malformed_rows(chunk)
        for i in range(n):
            if malformed[i]:
                status[i], error[i] = MALFORMED, MALFORMED_ERROR
                continue
            values = {c: _as_text(cols[c][i]) for c in self.template_columns}
            if any(v is None for v in values.values()):
                status[i] = Status.SKIPPED_NULL
                continue
            # Like a null, a blank value in any column the template needs leaves nothing to generate from.
            if any(not str(v).strip() for v in values.values()):
                status[i] = Status.SKIPPED_EMPTY
                continue
            if not any(self._has_content(loaded.tokenizer, str(v), special) for v in values.values()):
                status[i] = NO_CONTENT
                continue
            try:
                prompt = loaded.prompts.build(values)
                self._check_vocab(prompt.token_ids, loaded.vocab_size)
                budget = self._budget(cols, i)
            except ValueError as exc:
                status[i], error[i] = Status.ERROR, str(exc)
                continue
            key = cols[self.config.seed_column][i] if self.config.seed_column else "\x1f".join(map(str, values.values()))
            rows.append(i)
            texts.append(" ".join(map(str, values.values())))
            requests.append(GenerationRequest(prompt.token_ids, budget, row_seed(self.config.seed, key)))
            truncated[i] = prompt.truncated
            if prompt.truncated:
                status[i] = Status.TRUNCATED

        for i, result in zip(rows, self._generate(loaded, requests, texts, counts)):
            results[i] = result
            if result.finish_reason == "error":
                status[i], error[i] = Status.ERROR, result.error
        return results, status, error, truncated

    # -- what a subclass (the extract kind) changes ----------------------------------------------
    def system_prompt(self) -> str | None:
        """The system message inside the chat template."""
        return self.config.system_prompt

    def constraint(self, tokenizer: Any, model: Any) -> Any:
        """The transformers backend's decoding constraint (a ``JsonConstraint``), or None: free text."""
        return None

    def vllm_json_schema(self) -> dict[str, Any] | None:
        """The JSON Schema vLLM's structured outputs constrain each row to, or None: free text."""
        return None

    def check_outputs(self, results: list[GenerationResult | None], status: np.ndarray,
                      error: np.ndarray) -> list[pa.Array]:
        """Check the completions (may flag rows in ``status``/``error``); returns columns put before the results."""
        return []

    # -- helpers ------------------------------------------------------------------------------
    def _has_content(self, tokenizer: Any, value: str, special: frozenset[int]) -> bool:
        """Whether one template value (the row's own text, not the template) gives the model anything.

        A row is generated when any of its values does. Cut like the prompt
        (``max_input_tokens`` x 16 characters) before tokenising.
        """
        if not carries_content(value):
            return False
        cap = self.config.max_input_tokens * 16  # the prompt builder's clip (pipeline.generation.prompts)
        clipped = value[:cap] if self.config.truncation == "keep_start" else value[-cap:]
        return not content_free(tokenizer(clipped, add_special_tokens=False)["input_ids"], special)

    def _budget(self, cols: dict[str, list[Any]], i: int) -> int:
        """This row's max_new_tokens: its column value (capped at the limit) or the config default."""
        cfg = self.config
        value = cols[cfg.max_new_tokens_column][i] if cfg.max_new_tokens_column else None
        if value is None:
            return cfg.max_new_tokens
        if int(value) <= 0:
            raise ValueError(f"{cfg.max_new_tokens_column} is {value}; it must be a positive number of tokens")
        return min(int(value), cfg.max_new_tokens_limit)

    @staticmethod
    def _check_vocab(token_ids: Sequence[int], vocab_size: int | None) -> None:
        top = max(token_ids, default=0)
        if vocab_size is not None and top >= vocab_size:
            raise ValueError(
                f"the prompt has token id {top}, past the model's vocabulary of {vocab_size}: the tokenizer "
                "does not match the model (use the tokenizer saved with these weights)"
            )

    def _generate(self, loaded: LoadedGenerator, requests: list[GenerationRequest], texts: list[str],
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
            self._drop_engine(loaded)
            raise
        except Exception:  # noqa: BLE001 - out of memory, or a row the engine rejects: find it row by row
            counts.add("generate_batch_failures")
            results, stats = [], {}
            for request, text in zip(requests, texts):
                result, row_stats = self._generate_alone(gen, request, text)
                results.append(result)
                for name, value in row_stats.items():
                    stats[name] = stats.get(name, 0) + value
        prompt_tokens = sum(len(r.prompt_ids) for r in requests)
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

    def _generate_alone(self, gen: Any, request: GenerationRequest, text: str) -> tuple[GenerationResult, dict]:
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

    @staticmethod
    def _drop_engine(loaded: LoadedGenerator) -> None:
        """Forget a failed engine in this worker, so Spark's retry of the task builds a fresh one."""
        from pipeline.generation.vllm_backend import shutdown_engine
        from pipeline.models import cache

        cache.discard(lambda obj: obj is loaded)
        shutdown_engine()

    def _to_batch(self, results: list[GenerationResult | None], truncated: np.ndarray, status: np.ndarray,
                  error: np.ndarray, *, leading: Sequence[pa.Array] = ()) -> pa.RecordBatch:
        def col(get: Any) -> list[Any]:
            return [None if r is None else get(r) for r in results]

        prompt_tokens = col(lambda r: r.prompt_tokens)
        columns = [
            *leading,
            pa.array(col(lambda r: None if r.finish_reason == "error" else r.completion), pa.string()),
            pa.array(prompt_tokens, pa.int32()),
            pa.array(col(lambda r: r.completion_tokens), pa.int32()),
            pa.array([r.finish_reason if r is not None else ("error" if s == "error" else None)
                      for r, s in zip(results, status)], pa.string()),
            pa.array(col(lambda r: r.latency_ms), pa.float64()),
            pa.array([p or 0 for p in prompt_tokens], pa.int32()),
            pa.array(truncated, pa.bool_()),
            pa.array(status.tolist(), pa.string()),
            pa.array(error.tolist(), pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())


def _as_text(value: Any) -> Any:
    """A binary value decoded as UTF-8 (invalid bytes -> U+FFFD), as the encoder tasks do; others unchanged."""
    return value.decode("utf-8", errors="replace") if isinstance(value, (bytes, bytearray)) else value


register_task(GenerateTaskConfig, GenerateTask, job=EndpointJob())
