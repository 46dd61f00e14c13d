"""The task config classes by kind: what ``JobConfig.task`` is validated against.

The config layer owns this table and knows no task kind itself:
:func:`pipeline.registry.register_task` adds each kind's config class here,
so validation never imports the registry or the tasks above it.

>>> class Demo:  # any class with a ``kind``; the registry adds TaskConfig subclasses
...     pass
>>> add_task_config("demo_kind", Demo); task_config_class("demo_kind") is Demo
True
>>> remove_task_config("demo_kind"); task_config_class("demo_kind") is None
True
"""

from __future__ import annotations

import threading

__all__ = ["add_task_config", "known_kinds", "remove_task_config", "task_config_class"]

_configs: dict[str, type] = {}
_lock = threading.Lock()


def add_task_config(kind: str, config: type) -> None:
    """Validate ``task`` blocks of ``kind`` with ``config`` (a :class:`~pipeline.config.TaskConfig` subclass)."""
    with _lock:
        _configs[kind] = config


def remove_task_config(kind: str) -> None:
    """Forget ``kind`` (a kind unregistered by a test)."""
    with _lock:
        _configs.pop(kind, None)


def task_config_class(kind: str) -> type | None:
    """The config class of ``kind``; None for a kind nobody registered."""
    return _configs.get(kind)


def known_kinds() -> list[str]:
    """The registered kinds, sorted (for error messages)."""
    return sorted(_configs)
