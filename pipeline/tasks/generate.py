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

from pathlib import Path
from typing import Any, ClassVar, Hashable, Literal, Union

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from pipeline.config import BatchingConfig, ModelConfig, TaskConfig
from pipeline.config.base import READS
from pipeline.endpoint.config import EndpointConfig
from pipeline.generation.config import VllmConfig
from pipeline.generation.engine import GenerationResult
from pipeline.generation.prompts import template_fields
from pipeline.images.decode import DEFAULT_MAX_PIXELS
from pipeline.core.metrics import WorkerCounts
from pipeline.registry import register_task
from pipeline.core.rows import ANSWER_COLUMN, STATUS_FIELDS
from pipeline.tasks._content import malformed_rows
from pipeline.tasks._endpoint import EndpointBackend, EndpointJob
from pipeline.tasks._generate_chunk import generate_chunk
from pipeline.tasks._generate_columns import RESULT_FIELDS, count_finish_reasons, generation_batch
from pipeline.tasks._generate_load import load_generator

__all__ = ["GenerateTask", "GenerateTaskConfig"]


class GenerateTaskConfig(TaskConfig):
    """Text generation with a causal LM: one completion per row from a prompt template.

    Memory is bounded here, not by the machine: the KV cache holds at most
    ``slots`` rows of ``max_input_tokens + max_new_tokens_limit`` tokens
    (checked against ``max_kv_cache_mb`` when set).
    """

    kind: Literal["generate"] = "generate"
    # Same tokens whatever the batching (tests/generation/test_generation.py: static and continuous batching equal
    # unbatched generate at any slot count); the others only size or place the KV cache and engine.
    # No batching key is read by this kind.
    fingerprint_ignore: ClassVar[frozenset[str]] = frozenset({
        "mode", "slots", "max_kv_cache_mb", "vllm.max_num_seqs", "vllm.gpu_memory_utilization",
        "vllm.kv_cache_mb", "vllm.in_process",
        *(f"endpoint.{k}" for k in (*EndpointConfig.PER_TRY, *EndpointConfig.SAME_ROWS)),
    })
    fingerprint_batching: ClassVar[tuple[str, ...]] = ()
    per_try_settings: ClassVar[frozenset[str]] = frozenset(f"endpoint.{k}" for k in EndpointConfig.PER_TRY)
    backend: Literal["auto", "transformers", "vllm", "llama_cpp", "endpoint"] = Field(
        "auto", description="`transformers`, `vllm`, `llama_cpp` (the GGUF's int4 weights; `model.precision int4`), "
        "`endpoint` (an OpenAI-compatible server: `task.endpoint`), or `auto` (llama_cpp for int4, else vllm where "
        "the worker imports it, else transformers)")
    gguf: str | None = Field(
        None, description="int4 / llama_cpp: the .gguf file (or `package:<module>/<file>`); none: a *.gguf in the "
        "model folder, else the file the folder was converted from (jobs/prepare_llm.py)", json_schema_extra=READS)
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
    image_column: str | None = Field(
        None, description="a column holding each row's image (bytes, or paths/URIs with `image_input: path`) for a "
        "vision-language model: `{<column>}` in the template marks where it goes, else it comes before the text; "
        "decoded and checked on the workers, a bad image is a flagged row (docs/tasks/images_in_prompts.md)")
    image_input: Literal["bytes", "path"] = Field(
        "bytes", description="with `image_column`: `bytes` or `path` (read on the workers)")
    max_pixels: int = Field(
        DEFAULT_MAX_PIXELS, gt=0, description="with `image_column`: larger images are refused before decoding")

    @model_validator(mode="after")
    def _limits(self) -> "GenerateTaskConfig":
        if self.image_column is not None and self.backend == "llama_cpp":
            raise ValueError("task.image_column needs a vision-language model on backend transformers, vllm or "
                             "endpoint; llama_cpp runs text models only")
        if self.image_column is not None and self.endpoint is not None and self.endpoint.api != "chat":
            raise ValueError("task.image_column on the endpoint backend sends image_url parts, which only the chat "
                             "API takes: set task.endpoint.api: chat")
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
        if precision in ("int4", "auto") and self.image_column is not None:
            raise ValueError(f"model.precision {precision} runs text models on llama.cpp; with task.image_column "
                             "use fp32, bf16 or fp16")
        if precision == "int4" and self.backend in ("transformers", "vllm"):
            raise ValueError(f"model.precision int4 runs on task.backend llama_cpp (or auto), not {self.backend}")


class GenerateTask(EndpointBackend):
    """The ``generate`` task (see the module docstring); ``input_columns`` come from the template."""

    kind: ClassVar[str] = "generate"
    # Rows per inference task unless spark.rows_per_task is set: decoding is slow and continuous batching
    # needs no big chunks, so smaller tasks let the progress line move (pipeline.spark.planning).
    rows_per_task: ClassVar[int] = 512
    # batch mode on the endpoint backend: each row's answer from the provider's batch API, when joined
    optional_input_columns: ClassVar[tuple[str, ...]] = (ANSWER_COLUMN,)

    def __init__(self, config: GenerateTaskConfig, *, model: ModelConfig, batching: BatchingConfig) -> None:
        self.config = config
        self.model = model
        self.batching = batching
        self.image_column = config.image_column
        # the template's text values; the image column (named in it or not) is read apart
        self.template_columns = tuple(c for c in template_fields(config.template) if c != config.image_column)
        extra = [c for c in (config.image_column, config.max_new_tokens_column, config.seed_column) if c]
        self.input_columns: tuple[str, ...] = tuple(dict.fromkeys([*self.template_columns, *extra]))

    @classmethod
    def extras(cls, config: GenerateTaskConfig, model: ModelConfig) -> tuple[str, ...]:
        """The wheel's extras this task needs on the driver and every executor (:mod:`pipeline.core.extras`)."""
        images = ("vision",) if config.image_column else ()
        if config.backend == "endpoint":
            return ("endpoint", *images)
        if config.backend == "vllm":
            return ("transformers", "vllm", *images)
        if config.backend == "llama_cpp" or model.precision == "int4":
            return ("transformers", "int4")
        return ("transformers", *images)

    @property
    def model_kind(self) -> str:
        """What the driver checks the model folder as: a vision-language model for image rows."""
        return "generate_vision" if self.image_column else self.kind

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

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Statuses and prompt tokens, completion lengths and finish reasons (:mod:`pipeline.core.sketches`)."""
        from pipeline.tasks._profile import profile_generation

        profile.rows(out)
        profile_generation(out, profile)

    # -- the endpoint backend (EndpointBackend): no local model; each task attempt gets its journal and budget
    @property
    def request_path(self) -> str:
        """The API path its rows are posted to (the batch API's ``endpoint``)."""
        return self.config.endpoint.api_path() if self.config.endpoint else "/chat/completions"

    def endpoint_calls(self, chunk: pa.RecordBatch) -> tuple[list[int], list[Any], np.ndarray, np.ndarray]:
        from pipeline.tasks._endpoint import generation_calls

        cols = {c: chunk.column(chunk.schema.get_field_index(c)).to_pylist() for c in self.input_columns}
        return generation_calls(self, cols, malformed_rows(chunk))

    def load(self, model_dir: Path | None, device: str) -> Any:
        """The endpoint's settings (no local model), or the model loaded on its backend (``_generate_load``)."""
        if self.config.backend == "endpoint":
            from pipeline.tasks._endpoint import LoadedEndpoint

            return LoadedEndpoint(self.config.endpoint)
        assert model_dir is not None
        return load_generator(self, model_dir, device)

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
            from pipeline.tasks._endpoint import generate_rows
            from pipeline.tasks._endpoint_batch import rows_client

            results, status, error = generate_rows(self, cols, malformed_rows(chunk), counts, rows_client(self, chunk))
        else:
            results, status, error, truncated = generate_chunk(self, loaded, chunk, cols, counts)
        leading = self.check_outputs(results, status, error)

        counts.add("rows", n)
        counts.add("chunks")
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        count_finish_reasons(counts, results)
        return generation_batch(results, truncated, status, error, schema=self.output_schema(), leading=leading)

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


register_task(GenerateTaskConfig, GenerateTask, job=EndpointJob())
