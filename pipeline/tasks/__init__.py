"""Inference tasks: pure Python over Arrow/torch, one class per task kind."""

from __future__ import annotations

from pipeline.config import BatchingConfig, JobConfig, ModelConfig
from pipeline.tasks.base import STATUS_FIELDS, Task, TextTask
from pipeline.tasks.classify import ClassifyTask
from pipeline.tasks.embed import EmbedTask
from pipeline.tasks.generate import GenerateTask

__all__ = [
    "STATUS_FIELDS", "ClassifyTask", "EmbedTask", "GenerateTask", "Task", "TextTask", "build_task",
]

_TASKS = {"embed": EmbedTask, "classify": ClassifyTask, "generate": GenerateTask}


def build_task(task_config, *, model: ModelConfig, batching: BatchingConfig) -> Task:
    """The task object for ``task_config.kind``."""
    try:
        cls = _TASKS[task_config.kind]
    except KeyError:
        raise ValueError(f"unknown task kind {task_config.kind!r}; known: {', '.join(sorted(_TASKS))}") from None
    return cls(task_config, model=model, batching=batching)


def task_for_job(config: JobConfig) -> Task:
    return build_task(config.task, model=config.model, batching=config.batching)
