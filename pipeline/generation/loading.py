"""Load a causal LM folder (``AutoModelForCausalLM`` + fast tokenizer) for generation.

Kept beside the generation code rather than in ``models.loading`` (which
serves encoder kinds); it reuses that module's path resolution and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.models.loading import ModelError, load_pretrained, read_model_config

__all__ = ["check_causal_lm", "load_causal_lm", "weights_precision"]


def check_causal_lm(path: Path) -> None:
    """Fail with what to do unless ``path`` holds a causal LM (``*ForCausalLM``, ``GPT2LMHeadModel``...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    architectures = read_model_config(path).get("architectures") or []
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if not any(a.endswith("ForCausalLM") or a in causal for a in architectures):
        raise ModelError(
            f"model folder {path} is not a causal LM (architectures: {architectures or 'none'}); "
            "task.kind: generate needs a *ForCausalLM model (convert a GGUF with jobs/prepare_llm.py)"
        )


def load_causal_lm(path: Path, *, device: str = "cpu", precision: str = "fp32",
                   allow_pickle: bool = False) -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a Hugging Face causal LM folder, eval mode, on ``device``.

    fp32 is the default because greedy results are compared with unbatched
    generation. ``bf16``/``fp16`` load the weights in that dtype on any
    device, so the model really runs in it (on a CPU without native bf16 it
    is slower than fp32, and either changes tokens); :func:`weights_precision`
    names what was loaded.
    """
    from transformers import AutoModelForCausalLM

    check_causal_lm(path)
    return load_pretrained(path, AutoModelForCausalLM, device=str(device), precision=precision, what="causal LM",
                           allow_pickle=allow_pickle, cast_on_cpu=True)


def weights_precision(model: Any) -> str:
    """``fp32``, ``bf16`` or ``fp16``: the dtype of ``model``'s floating-point weights (the first one's name else)."""
    import torch

    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    for param in model.parameters():
        if param.is_floating_point():
            return names.get(param.dtype, str(param.dtype).removeprefix("torch."))
    return "fp32"  # pragma: no cover - a model without float weights
