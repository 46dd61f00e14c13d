"""Inference tasks: pure Python over Arrow/torch, one module per task kind.

Each module defines its config model and task class and registers them with
:func:`pipeline.registry.register_task`; :func:`build_task` finds them there.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import BatchingConfig, ModelConfig, TaskConfig
from pipeline.tasks.base import STATUS_FIELDS, Task, TextTask

__all__ = ["STATUS_FIELDS", "Task", "TextTask", "build_task"]


def build_task(task_config: TaskConfig, *, model: ModelConfig, batching: BatchingConfig) -> Any:
    """The task object for ``task_config.kind`` (a registered kind)."""
    from pipeline.registry import get_task_kind

    try:
        kind = get_task_kind(task_config.kind)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return kind.task(task_config, model=model, batching=batching)

