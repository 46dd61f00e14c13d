"""The task registry: the one extension point every task kind goes through.

A task kind is one module under ``pipeline/tasks/`` (or anywhere importable)
that defines its config model (a :class:`~pipeline.config.TaskConfig`), its
task class (the :class:`~pipeline.tasks.base.Task` protocol) and, when the
defaults do not fit, its driver-side hooks (a
:class:`~pipeline.tasks.job.TaskJob`), and registers
them once::

    class TranslateConfig(TaskConfig):
        kind: Literal["translate"] = "translate"
        target: str = Field("de", description="target language")

    register_task(TranslateConfig, TranslateTask)

The CLI, the docs' config reference and the runner read this registry;
each kind's config class also goes to :mod:`pipeline.config.kinds`, which the
job config's ``task`` is validated against. The built-in kinds are the
modules :mod:`pipeline.tasks` imports by name, and ``import pipeline`` imports
that package, so they are registered before any config is validated.

This module sits on the registry floor, above config and below the
engines, io and tasks: it imports none of them. The default driver-side
hooks live with the tasks (:class:`pipeline.tasks.job.TaskJob`), which hand
them in with :func:`set_default_job`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from pipeline.config import JobConfig, TaskConfig
from pipeline.config.kinds import add_task_config, remove_task_config
from pipeline.config.fingerprint import check_declarations
from pipeline.core.rows import MODEL_LINEAGE_COLUMNS

__all__ = ["ModelInfo", "TaskKind", "get_task_kind", "kind_and_task", "register_task", "set_default_job",
           "task_kinds"]


@dataclass(frozen=True)
class ModelInfo:
    """The model a run uses, as checked on the driver before any work.

    ``path`` is what the executors load (``model.path`` itself, or a folder it
    resolved to, such as one revision of a model root); ``name`` and
    ``revision`` go into every output row's lineage.
    """

    path: str
    name: str
    revision: str

    def lineage(self, fingerprint: str) -> dict[str, str]:
        """The lineage columns (:data:`pipeline.core.rows.MODEL_LINEAGE_COLUMNS`) of a row this model scored with
        the task ``fingerprint`` (:func:`pipeline.config.fingerprint.task_fingerprint`).

        >>> ModelInfo("/m", "minilm", "abc").lineage("f00")
        {'model_name': 'minilm', 'model_revision': 'abc', 'task_fingerprint': 'f00'}
        """
        return dict(zip(MODEL_LINEAGE_COLUMNS, (self.name, self.revision, fingerprint)))


@dataclass(frozen=True)
class TaskKind:
    """One registered task kind: its config model, its task class and its driver-side hooks."""

    kind: str
    config: type[TaskConfig]
    task: type
    own_job: Any = None

    @property
    def job(self) -> Any:
        """The kind's driver-side hooks (a :class:`pipeline.tasks.job.TaskJob`): its own, else the default."""
        return self.own_job if self.own_job is not None else _default_job

    @property
    def summary(self) -> str:
        """The first line of the config's docstring: what the task does."""
        return (self.config.__doc__ or "").strip().splitlines()[0] if self.config.__doc__ else ""


_kinds: dict[str, TaskKind] = {}
_lock = threading.RLock()
# the hooks of a kind registered without its own (pipeline.tasks.job sets the TaskJob defaults)
_default_job: Any = None


def set_default_job(job: Any) -> None:
    """The driver-side hooks of every kind registered without its own (:class:`pipeline.tasks.job.TaskJob`)."""
    global _default_job
    _default_job = job


def register_task(config: type[TaskConfig], task: type, *, job: Any = None) -> TaskKind:
    """Register a task kind; its name is the default of ``config.kind``. Returns the entry.

    Registering the same classes again (a module imported twice) is a no-op;
    another class under a taken name is an error, so two modules cannot
    silently fight over one kind.
    """
    if not (isinstance(config, type) and issubclass(config, TaskConfig)):
        raise TypeError(f"register_task needs a TaskConfig subclass, got {config!r}")
    kind = config.model_fields["kind"].default
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{config.__name__}.kind needs a default naming the kind, e.g. kind: Literal['x'] = 'x'")
    check_declarations(config)  # a fingerprint declaration naming a key the config lacks fails at import
    entry = TaskKind(kind, config, task, job)
    with _lock:
        old = _kinds.get(kind)
        if old is not None and (_qualname(old.config), _qualname(old.task)) != (_qualname(config), _qualname(task)):
            raise ValueError(f"task kind {kind!r} is already registered by {_qualname(old.task)}")
        _kinds[kind] = entry
        add_task_config(kind, config)  # what JobConfig.task is validated against
    return entry


def unregister_task(kind: str) -> None:
    """Forget ``kind`` (tests that register throwaway kinds)."""
    with _lock:
        _kinds.pop(kind, None)
        remove_task_config(kind)


def get_task_kind(kind: str) -> TaskKind:
    """The registered entry for ``kind``; raises ``KeyError`` naming the known kinds."""
    try:
        return _kinds[kind]
    except KeyError:
        raise KeyError(f"unknown task kind {kind!r}; known: {', '.join(sorted(_kinds))}") from None


def kind_and_task(config: JobConfig, task: Any = None) -> tuple[TaskKind, Any]:
    """The registered kind of ``config.task``, and ``task`` (built from the config only when not given)."""
    kind = get_task_kind(config.task.kind)
    return kind, task if task is not None else kind.task(config.task, model=config.model, batching=config.batching)


def task_kinds() -> dict[str, TaskKind]:
    """Every registered kind by name (the built-in ones included)."""
    return dict(_kinds)


def _qualname(obj: type) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"
