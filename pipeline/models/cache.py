"""The per-worker model cache: load once per Python worker process, reuse for every task.

It must live in an importable module: a function defined in ``__main__`` is
pickled by value with its globals, so a cache there would arrive empty in
every task.

A load ends with what survives it frozen (``gc.freeze``): PySpark's worker runs a full ``gc.collect()``
after every task, which would walk the model's objects and the modules its first load imported (the model
classes of transformers) each time, 0.14-0.17 s a task with the tests' tiny BERT. Dropping a model thaws
them, so what it held can be collected, and freezes the survivors again.
"""

from __future__ import annotations

import gc
import os
import socket
import threading
from typing import Any, Callable, Hashable

__all__ = ["clear", "discard", "discard_keys", "get_or_load", "load_count", "note_unreported", "take_unreported", "worker_id"]

_models: dict[Hashable, Any] = {}
_loads: dict[Hashable, int] = {}
# loads no task has counted yet (a warm-up loaded them, pipeline.spark.warmup): the first task to use one counts it
_unreported: dict[Hashable, dict[str, Any]] = {}
# reentrant: a factory may discard other entries (a worker holds one vLLM engine at a time)
_lock = threading.RLock()


def worker_id() -> str:
    """``host:pid`` of this Python worker, for per-worker counts."""
    return f"{socket.gethostname()}:{os.getpid()}"


def get_or_load(key: Hashable, factory: Callable[[], Any]) -> tuple[Any, bool]:
    """The cached object for ``key``, calling ``factory()`` the first time; ``(obj, loaded_now)``."""
    with _lock:
        if key in _models:
            return _models[key], False
        obj = factory()
        _models[key] = obj
        _loads[key] = _loads.get(key, 0) + 1
        _freeze_survivors()
        return obj, True


def _freeze_survivors() -> None:
    """Collect, then freeze what is left: the next collections skip it (the module docstring)."""
    gc.collect()
    gc.freeze()


def _thaw() -> None:
    """After models were dropped: their frozen objects back to the collector, the rest frozen again."""
    gc.unfreeze()
    _freeze_survivors()


def note_unreported(key: Hashable, counts: dict[str, Any]) -> None:
    """Keep ``counts`` (what loading ``key`` cost) for the first task that uses it: a load outside any task."""
    with _lock:
        if key in _models:
            _unreported[key] = counts


def take_unreported(key: Hashable) -> dict[str, Any] | None:
    """The counts :func:`note_unreported` kept for ``key``, once (None after, or when none were kept)."""
    with _lock:
        return _unreported.pop(key, None)


def load_count(key: Hashable | None = None) -> int:
    """How many times ``key`` (or anything, when None) was loaded in this process."""
    return sum(_loads.values()) if key is None else _loads.get(key, 0)


def discard(match: Callable[[Any], bool]) -> int:
    """Drop the cached objects for which ``match(obj)`` is true (a failed engine, one being replaced)."""
    with _lock:
        return _drop([k for k, obj in _models.items() if match(obj)])


def discard_keys(match: Callable[[Hashable], bool]) -> int:
    """Drop the cached objects whose key ``match`` is true for (an older revision of a model being replaced)."""
    with _lock:
        return _drop([k for k in _models if match(k)])


def clear() -> None:
    """Drop every cached model (tests; freeing accelerator memory)."""
    with _lock:
        _drop(list(_models))
        _unreported.clear()


def _drop(keys: list[Hashable]) -> int:
    """Drop ``keys`` (held under ``_lock``) and thaw what they held so it can be collected; how many."""
    for key in keys:
        del _models[key]
        _unreported.pop(key, None)
    if keys:
        _thaw()
    return len(keys)
