"""What ``generate`` (and ``extract``) load once per worker: the backend that runs, its generator and the prompts.

:func:`load_generator` picks the backend (:func:`choose_backend`: llama.cpp
for int4 weights, vLLM where the worker imports it, else transformers; the
endpoint backend loads nothing and is not here), loads the model on it and
builds a :class:`LoadedGenerator`: the tokenizer, the prompt builder and a
generator that takes ``GenerationRequest``s and returns ``GenerationResult``s
in input order. It takes the task as a plain argument and asks it only for
its settings and the hooks a subclass changes (``system_prompt``,
``constraint``, ``vllm_json_schema``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.generation.engine import BatchGenerator
from pipeline.generation.prompts import PromptBuilder
from pipeline.generation.sampling import SamplingParams

__all__ = ["LoadedGenerator", "choose_backend", "load_generator"]


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


def load_generator(task: Any, model_dir: Path, device: str) -> LoadedGenerator:
    """Load ``task``'s model from ``model_dir`` on the backend that runs (see :func:`choose_backend`)."""
    from pipeline.models.loading import read_model_config

    cfg = task.config
    backend = choose_backend(task.model, cfg, model_dir)
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, stop=tuple(cfg.stop))
    precision = task.model.precision
    processor = None
    if backend == "vllm":
        tokenizer, generator = _load_vllm(task, model_dir, device, sampling)
        if cfg.image_column:
            from transformers import AutoProcessor

            processor = AutoProcessor.from_pretrained(str(model_dir), local_files_only=True)
    elif backend == "llama_cpp":
        tokenizer, generator = _load_llama_cpp(task, model_dir, sampling)
        precision = "int4"
    else:
        from pipeline.generation.loading import weights_precision

        tokenizer, generator, processor = _load_transformers(task, model_dir, device, sampling)
        precision = weights_precision(generator.model)
    prompts = _prompt_builder(task, tokenizer, processor, backend)
    config = read_model_config(model_dir)
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return LoadedGenerator(tokenizer, prompts, generator, backend=backend, precision=precision,
                           vocab_size=int(vocab) if vocab else None)


def _prompt_builder(task: Any, tokenizer: Any, processor: Any, backend: str) -> PromptBuilder:
    """The rows' prompt builder; with ``task.image_column`` the vision one, over the model's processor (which
    the transformers backend loaded; vLLM's rows keep the image's placeholder, the engine expands it)."""
    cfg = task.config
    settings = dict(template=cfg.template, use_chat_template=cfg.use_chat_template, system_prompt=task.system_prompt(),
                    max_input_tokens=cfg.max_input_tokens, truncation=cfg.truncation)
    if not cfg.image_column:
        return PromptBuilder(tokenizer, **settings)
    from pipeline.generation.vision import VisionPromptBuilder

    return VisionPromptBuilder(processor, image_field=cfg.image_column, expand=backend == "transformers", **settings)


def _dense_precision(model: Any) -> str:
    """The weights' dtype on the transformers and vllm backends (``auto`` without llama.cpp: fp32)."""
    return "fp32" if model.precision == "auto" else model.precision


def choose_backend(model: Any, config: Any, model_dir: Path) -> str:
    """The backend that runs: llama_cpp for int4 (and for auto where it and a GGUF are here), else as configured.

    ``auto`` precision picks int4 on llama.cpp where this worker can (it is several times faster than fp32
    on a CPU, docs/benchmarks_generation.md); its accuracy is measured by ``make bench-precision``, not gated
    at load. Anything else runs the transformers backend at fp32.
    """
    from pipeline.generation.vllm_backend import resolve_backend

    precision, backend = model.precision, config.backend
    if precision == "int4" or backend == "llama_cpp":
        return "llama_cpp"
    if precision == "auto" and backend == "auto" and not str(model.device).startswith("cuda"):
        from pipeline.generation.llama_cpp_backend import find_gguf, llama_cpp_available
        from pipeline.models.loading import ModelError

        try:
            if llama_cpp_available() and find_gguf(model_dir, config.gguf):
                return "llama_cpp"
        except ModelError:
            pass
    return resolve_backend(backend)


def _load_llama_cpp(task: Any, model_dir: Path, sampling: SamplingParams) -> tuple[Any, BatchGenerator]:
    import torch
    from transformers import AutoTokenizer

    from pipeline.generation.llama_cpp_backend import LlamaSlotBatch, load_llama_cpp

    cfg = task.config
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = load_llama_cpp(model_dir, gguf=cfg.gguf, slots=cfg.slots, max_seq_len=task.max_seq_len,
                           threads=torch.get_num_threads())
    generator = BatchGenerator(model, tokenizer, mode=cfg.mode, slots=cfg.slots, max_seq_len=task.max_seq_len,
                               sampling=sampling, constraint=task.constraint(tokenizer, model),
                               batch_class=LlamaSlotBatch)
    return tokenizer, generator


def _load_transformers(task: Any, model_dir: Path, device: str, sampling: SamplingParams
                       ) -> tuple[Any, BatchGenerator, Any]:
    """``(tokenizer, generator, processor)``: a causal LM, or with ``task.image_column`` a vision-language model
    and its processor (whose tokenizer is the prompts')."""
    from pipeline.generation.kv import check_kv_budget, kv_cache_bytes
    from pipeline.generation.loading import load_causal_lm

    cfg = task.config
    processor = None
    if cfg.image_column:
        from pipeline.generation.vision import load_vision_lm

        processor, model = load_vision_lm(model_dir, device=device, precision=_dense_precision(task.model),
                                          allow_pickle=task.model.allow_pickle)
        tokenizer = processor.tokenizer
    else:
        tokenizer, model = load_causal_lm(model_dir, device=device, precision=_dense_precision(task.model),
                                          allow_pickle=task.model.allow_pickle)
    if cfg.max_kv_cache_mb is not None:
        width = next(model.parameters()).element_size()
        need = kv_cache_bytes(model.config.get_text_config(), rows=cfg.slots, max_seq_len=task.max_seq_len, bytes_per_value=width)
        check_kv_budget(need, cfg.max_kv_cache_mb, what=f"{cfg.slots} slots x {task.max_seq_len} tokens",
                        knob="task.slots")
    generator = BatchGenerator(model, tokenizer, mode=cfg.mode, slots=cfg.slots, max_seq_len=task.max_seq_len,
                               sampling=sampling, constraint=task.constraint(tokenizer, model))
    return tokenizer, generator, processor


def _load_vllm(task: Any, model_dir: Path, device: str, sampling: SamplingParams) -> tuple[Any, Any]:
    from pipeline.generation.loading import check_causal_lm
    from pipeline.generation.vllm_backend import load_vllm
    from pipeline.models import cache
    from pipeline.models.device import task_gpu_addresses

    cfg = task.config
    if cfg.image_column:
        from pipeline.generation.vision import check_vision_lm

        check_vision_lm(model_dir)
    else:
        check_causal_lm(model_dir)
    # one engine per worker: a cached one (another config) is dropped here and shut down by load_vllm
    cache.discard(lambda obj: isinstance(obj, LoadedGenerator) and obj.backend == "vllm")
    gpus = task_gpu_addresses() if device.startswith("cuda") else ()
    return load_vllm(model_dir, config=cfg.vllm, precision=_dense_precision(task.model), max_seq_len=task.max_seq_len,
                     sampling=sampling, gpu_addresses=gpus, max_kv_cache_mb=cfg.max_kv_cache_mb,
                     json_schema=task.vllm_json_schema(), images_per_prompt=1 if cfg.image_column else 0)
