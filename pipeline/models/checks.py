"""Driver-side checks of a Hugging Face model folder, before any Spark work.

A model folder can look fine and still be wrong: a ``config.json`` that names
another architecture than the weights beside it (``GPT2LMHeadModel`` next to
BERT weights) loads as a randomly initialised model, and transformers'
missing-weights warning is easy to miss on an executor. So the driver:

1. lists the checkpoint's tensor names without reading a tensor (safetensors
   headers, the sharded index; a pickle checkpoint only with
   ``model.allow_pickle`` and then ``torch.load(weights_only=True)`` onto the
   meta device);
2. builds the task's architecture on the meta device (no memory, no weights)
   and maps each checkpoint name the way ``from_pretrained`` does (its key
   renamings and converters, the base-model prefix), then drops what
   transformers itself ignores (tied weights, ``_keys_to_ignore_on_load_*``,
   legacy ``position_ids``/``inv_freq`` buffers);
3. refuses any missing or unexpected weight, an architecture that does not
   suit the task, and a token length past the model's position limit.

Imports torch and transformers lazily (it runs on the driver only).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ModelError

__all__ = ["ModelCheck", "check_model", "checkpoint_keys", "pickle_files", "position_limit", "safetensors_files"]

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
_SAMPLE = 5
# tokens the first positions are offset by: RoBERTa-style models number positions from padding_idx + 1
_OFFSET_MODEL_TYPES = ("roberta", "xlm-roberta", "camembert", "longformer", "mpnet", "data2vec-text", "xmod", "ibert")


@dataclass(frozen=True)
class ModelCheck:
    """What the driver learnt about a model folder: its architecture and how many token positions it has."""

    architecture: str
    positions: int | None
    weights: str  # "safetensors" or "pickle"
    tensors: int
    # answered from the cache of an earlier check of the same files (pipeline.models.files.cached_by_files)
    cached: bool = False


def safetensors_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


def pickle_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in _PICKLE_SUFFIXES)


def checkpoint_keys(path: Path, *, allow_pickle: bool = False) -> tuple[dict[str, tuple[int, ...] | None], str]:
    """The checkpoint's tensor names with their shapes, and its format (``safetensors`` or ``pickle``).

    No tensor is read: safetensors headers, or a pickle unpickled onto the meta
    device (a sharded pickle's index gives names only, shapes None).

    Safetensors files win when both formats are present (transformers prefers
    them too). A folder with only pickle checkpoints needs ``allow_pickle``:
    unpickling runs code from the file.
    """
    from safetensors import safe_open

    files = safetensors_files(path)
    if files:
        keys: dict[str, tuple[int, ...] | None] = {}
        for file in files:
            try:
                with safe_open(str(file), framework="numpy") as fh:
                    names = {name: tuple(fh.get_slice(name).get_shape()) for name in fh.keys()}
            except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds
                raise ModelError(
                    f"model weights {file} are unreadable ({exc}); the file is corrupt or truncated: "
                    "copy the model folder again"
                ) from None
            if not names:
                raise ModelError(f"model weights {file} hold no tensors; copy the model folder again")
            keys.update(names)
        index = path / "model.safetensors.index.json"
        if index.is_file():
            listed = set(_read_json(index).get("weight_map", {}))
            absent = sorted(listed - set(keys))
            if absent:
                raise ModelError(
                    f"model folder {path}: {index.name} lists {len(absent)} tensor(s) no shard holds "
                    f"(e.g. {absent[:_SAMPLE]}); a shard is missing: copy the model folder again"
                )
        return keys, "safetensors"
    pickles = pickle_files(path)
    if not pickles:
        raise ModelError(f"model folder {path} has no weights file (*.safetensors)")
    if not allow_pickle:
        raise ModelError(
            f"model folder {path} has only pickle checkpoints ({', '.join(p.name for p in pickles)}) and no "
            "*.safetensors: loading a pickle can run code hidden in the file. Convert it to safetensors "
            "(model.save_pretrained(folder, safe_serialization=True) where you trust it), or set "
            "model.allow_pickle: true if you trust its source (it is then loaded with torch.load(weights_only=True))"
        )
    return _pickle_keys(path, pickles), "pickle"


def _pickle_keys(path: Path, pickles: list[Path]) -> dict[str, tuple[int, ...] | None]:
    import pickle

    import torch

    index = path / "pytorch_model.bin.index.json"
    if index.is_file():
        return dict.fromkeys(_read_json(index).get("weight_map", {}))
    keys: dict[str, tuple[int, ...] | None] = {}
    for file in pickles:
        try:
            state = torch.load(str(file), map_location="meta", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise ModelError(
                f"model weights {file} hold more than tensors, which torch.load(weights_only=True) refuses "
                f"({str(exc).splitlines()[0]}); convert the checkpoint to safetensors where you trust it"
            ) from None
        except Exception as exc:  # noqa: BLE001 - a truncated zip, a foreign format
            raise ModelError(f"model weights {file} are unreadable ({exc}); copy the model folder again") from None
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise ModelError(f"model weights {file} are not a state dict ({type(state).__name__})")
        keys.update({str(k): tuple(v.shape) if hasattr(v, "shape") else None for k, v in state.items()})
    return keys


def _read_json(file: Path) -> dict[str, Any]:
    try:
        return json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"{file} is unreadable or not JSON ({exc}); copy the model folder again") from None


def position_limit(config: Any) -> int | None:
    """Token positions the model can embed: ``max_position_embeddings`` (``n_positions``) less any offset.

    RoBERTa-style models number positions from ``pad_token_id + 1``, so a
    514-position RoBERTa takes 512 tokens. None when the config names no limit.
    """
    text = getattr(config, "get_text_config", lambda: config)()  # a vision-language model: its language model's
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    if getattr(config, "model_type", "") in _OFFSET_MODEL_TYPES:
        limit -= int(getattr(config, "pad_token_id", None) or 1) + 1
    return limit


def _loader(kind: str) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForSequenceClassification

    return {"embed": AutoModel, "classify": AutoModelForSequenceClassification, "generate": AutoModelForCausalLM,
            "generate_vision": AutoModelForImageTextToText}[kind]


_WHAT = {
    "embed": "an encoder (task.kind: embed uses its hidden states)",
    "classify": "a sequence classifier (*ForSequenceClassification)",
    "generate": "a causal language model (*ForCausalLM)",
    "generate_vision": "a vision-language model (image-text-to-text, with its processor)",
}


def _architecture(path: Path, config: Any, kind: str) -> type:
    """The class ``kind`` loads for ``config``, after checking the config suits the task."""
    from transformers.models.auto.auto_factory import _get_model_class
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    declared = list(getattr(config, "architectures", None) or [])
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    hint = {
        "embed": "use a sentence encoder (e.g. a sentence-transformers model) for task.kind: embed",
        "classify": "use task.kind: embed for an encoder, or a fine-tuned *ForSequenceClassification model",
        "generate": "use a *ForCausalLM model (convert a GGUF with jobs/prepare_llm.py)",
        "generate_vision": "task.image_column needs an AutoModelForImageTextToText folder (LLaVA, Idefics3...)",
    }[kind]
    if kind == "classify" and not any(a.endswith("ForSequenceClassification") for a in declared):
        raise ModelError(
            f"model folder {path} is not a sequence classifier (architectures: {declared or 'none'}); {hint}"
        )
    if kind == "generate" and not any(a in causal or a.endswith("ForCausalLM") for a in declared):
        raise ModelError(f"model folder {path} is not a causal LM (architectures: {declared or 'none'}); {hint}")
    if kind == "embed" and any(a in causal or a.endswith("ForCausalLM") for a in declared):
        raise ModelError(f"model folder {path} is a causal language model ({declared}); {hint}")
    loader = _loader(kind)
    try:
        cls = _get_model_class(config, loader._model_mapping)
    except (KeyError, ValueError):
        raise ModelError(
            f"model folder {path}: its config.json (model_type {getattr(config, 'model_type', None)!r}, "
            f"architectures {declared or 'none'}) is not {_WHAT[kind]}; {hint}"
        ) from None
    if kind != "generate_vision" and getattr(cls, "main_input_name", "input_ids") != "input_ids":
        raise ModelError(
            f"model folder {path}: {cls.__name__} takes {cls.main_input_name!r}, not text; "
            f"task.kind: {kind} needs a text model ({_WHAT[kind]}): check config.json and model.path"
        )
    return cls


def _weight_mismatch(cls: type, config: Any, keys: dict[str, tuple[int, ...] | None]
                    ) -> tuple[list[str], list[str], list[str]]:
    """``(missing, unexpected, other shape)`` weight names of ``keys`` against ``cls`` built on the meta device."""
    import torch
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    with torch.device("meta"):
        model = cls._from_config(config)
    expected = model.state_dict()
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    prefix = model.base_model_prefix
    found: set[str] = set()
    unexpected: set[str] = set()
    reshaped: list[str] = []
    converted = False
    for key in keys:
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if renamed not in expected and key in expected:
            renamed, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=expected)
        if renamed in expected:
            found.add(renamed)
            converted = converted or pattern is not None
            shape, want = keys[key], tuple(expected[renamed].shape)
            if pattern is None and shape is not None and shape != want:
                reshaped.append(f"{key} {list(shape)} (model: {list(want)})")
        else:
            unexpected.add(key)
    missing = set(expected) - found - set(getattr(model, "all_tied_weights_keys", {}) or {})
    if converted:  # one checkpoint tensor fills several parameters (fused or split): trust the converter's targets
        targets = [t for c in converters for t in c.target_patterns]
        missing = {k for k in missing if not any(re.search(t, k) for t in targets)}
    buffers = {name for name, _ in model.named_buffers()}
    ignore_unexpected = set(model._keys_to_ignore_on_load_unexpected or ())
    if any(b.endswith("rotary_emb.inv_freq") for b in buffers):
        ignore_unexpected.add(r"rotary_emb\.inv_freq")
    if any(b.endswith("position_ids") for b in buffers):
        ignore_unexpected.add(r"(^|\.)position_ids$")
    ignore_missing = set(model._keys_to_ignore_on_load_missing or ())
    missing = {k for k in missing if not any(re.search(p, k) for p in ignore_missing)}
    unexpected = {k for k in unexpected if not any(re.search(p, k) for p in ignore_unexpected)}
    if prefix and not hasattr(model, prefix):
        # a base model (AutoModel) read from a checkpoint with a head: the head's weights are not for this task
        if any(k.startswith(f"{prefix}.") for k in keys):
            unexpected = {k for k in unexpected if k.startswith(f"{prefix}.")}
    return sorted(missing), sorted(unexpected), sorted(reshaped)


def check_model(path: Path, *, kind: str, allow_pickle: bool = False, max_tokens: int | None = None,
                max_tokens_key: str = "batching.max_length") -> ModelCheck:
    """Check ``path`` holds a complete ``kind`` model whose positions fit ``max_tokens``; raises ModelError.

    ``kind`` is ``embed``, ``classify`` or ``generate``; ``max_tokens_key`` names
    the setting that asks for ``max_tokens`` in the error.
    """
    from importlib.metadata import version

    from pipeline.models.files import cached_by_files

    # The same files pass the same check: a passed check is kept by the files' metadata (names, sizes,
    # modification times, the bytes of config.json), for this kind, token length and transformers version.
    # A new process then skips building the architecture (seconds of imports); a failure is never kept.
    what = (f"check_model v1 kind={kind} allow_pickle={allow_pickle} max_tokens={max_tokens} "
            f"key={max_tokens_key} transformers={version('transformers')}")
    files = [p for p in path.iterdir() if p.is_file()]
    fields, cached = cached_by_files(what, files, lambda: _check_model(
        path, kind=kind, allow_pickle=allow_pickle, max_tokens=max_tokens, max_tokens_key=max_tokens_key).__dict__)
    return ModelCheck(**{**fields, "cached": cached})


def _check_model(path: Path, *, kind: str, allow_pickle: bool, max_tokens: int | None,
                 max_tokens_key: str) -> ModelCheck:
    from transformers import AutoConfig

    keys, fmt = checkpoint_keys(path, allow_pickle=allow_pickle)
    _read_json(path / "config.json")
    if kind not in _WHAT:  # a kind of its own (not a transformers text model): the folder and weights only
        return ModelCheck("", None, fmt, len(keys))
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(
            f"model folder {path}: config.json does not describe a model transformers knows ({exc}); "
            "check model.path (code from the model folder is never run)"
        ) from None
    cls = _architecture(path, config, kind)
    missing, unexpected, reshaped = _weight_mismatch(cls, config, keys)
    if missing or unexpected or reshaped:
        parts = []
        if missing:
            parts.append(f"{len(missing)} weight(s) of {cls.__name__} are not in the checkpoint (e.g. {missing[:_SAMPLE]})")
        if unexpected:
            parts.append(f"{len(unexpected)} checkpoint tensor(s) fit no weight of it (e.g. {unexpected[:_SAMPLE]})")
        if reshaped:
            parts.append(f"{len(reshaped)} tensor(s) have another shape than config.json gives (e.g. {reshaped[:3]})")
        raise ModelError(
            f"model folder {path}: the weights do not match config.json "
            f"(architectures {list(config.architectures or []) or 'none'}, model_type {config.model_type!r}): "
            f"{'; '.join(parts)}. Loading it would leave randomly initialised weights: put the config.json "
            "saved with these weights back, or point model.path at the right folder"
        )
    limit = position_limit(config)
    if max_tokens is not None and limit is not None and max_tokens > limit:
        raise ModelError(
            f"{max_tokens_key} is {max_tokens} tokens but {cls.__name__} in {path} has {limit} positions; "
            f"longer rows would fail: set {max_tokens_key} to {limit} or less"
        )
    return ModelCheck(cls.__name__, limit, fmt, len(keys))
