"""Load a causal LM folder (``AutoModelForCausalLM`` + fast tokenizer) for generation.

Kept beside the generation code rather than in ``models.loading`` (which
serves encoder kinds); it reuses that module's path resolution and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.models.loading import ModelError, read_model_config

__all__ = ["load_causal_lm"]


def load_causal_lm(path: Path, *, device: str = "cpu", precision: str = "fp32") -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a Hugging Face causal LM folder, eval mode, on ``device``.

    fp32 is the default because greedy results are compared with unbatched
    generation; ``bf16``/``fp16`` cast the weights on CUDA only (CPU half
    precision is slower here and changes tokens).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = read_model_config(path)
    architectures = config.get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelError(
            f"model folder {path} is not a causal LM (architectures: {architectures or 'none'}); "
            "task.kind: generate needs a *ForCausalLM model (convert a GGUF with jobs/prepare_llm.py)"
        )
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    dtype = dtypes[precision] if str(device).startswith("cuda") else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"could not load the causal LM from {path}: {exc}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"model folder {path}: a fast (Rust) tokenizer is needed (tokenizer.json)")
    model.eval()
    model.to(device)
    return tokenizer, model
