"""Inference tasks: pure Python over Arrow/torch, one module per task kind.

Each kind's module defines its config model and task class and registers
them with :func:`pipeline.registry.register_task` when imported; this
package imports the built-in kinds by name below (``import pipeline`` imports
this package, so they are registered before any config is validated), and
:func:`build_task` finds them in the registry.
"""

from __future__ import annotations

from typing import Any

# the default driver-side hooks first: every kind registered after them may rely on them
from pipeline.tasks import job  # noqa: F401  (isort: skip)
from pipeline.tasks import classify, classify_image, embed, extract, generate, ocr, recommend  # noqa: F401
from pipeline.config import BatchingConfig, ModelConfig, TaskConfig
from pipeline.registry import get_task_kind
from pipeline.core.rows import STATUS_FIELDS
from pipeline.tasks.base import Task, TextTask

__all__ = ["STATUS_FIELDS", "Task", "TextTask", "build_task"]


def build_task(task_config: TaskConfig, *, model: ModelConfig, batching: BatchingConfig) -> Any:
    """The task object for ``task_config.kind`` (a registered kind)."""
    try:
        kind = get_task_kind(task_config.kind)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return kind.task(task_config, model=model, batching=batching)
