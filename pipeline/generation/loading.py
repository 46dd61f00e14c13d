"""Load a causal LM folder (``AutoModelForCausalLM`` + fast tokenizer) for generation.

Kept beside the generation code rather than in ``models.loading`` (which
serves encoder kinds); it reuses that module's path resolution and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.models.loading import ModelError, load_pretrained, read_model_config

__all__ = ["check_causal_lm", "load_causal_lm"]


def check_causal_lm(path: Path) -> None:
    """Fail with what to do unless ``path`` holds a ``*ForCausalLM`` model (either backend needs one)."""
    architectures = read_model_config(path).get("architectures") or []
    if not any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelError(
            f"model folder {path} is not a causal LM (architectures: {architectures or 'none'}); "
            "task.kind: generate needs a *ForCausalLM model (convert a GGUF with jobs/prepare_llm.py)"
        )


def load_causal_lm(path: Path, *, device: str = "cpu", precision: str = "fp32") -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a Hugging Face causal LM folder, eval mode, on ``device``.

    fp32 is the default because greedy results are compared with unbatched
    generation; ``bf16``/``fp16`` cast the weights on CUDA only (CPU half
    precision is slower here and changes tokens).
    """
    from transformers import AutoModelForCausalLM

    check_causal_lm(path)
    return load_pretrained(path, AutoModelForCausalLM, device=str(device), precision=precision, what="causal LM")
