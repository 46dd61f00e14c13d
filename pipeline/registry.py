"""The task registry: the one extension point every task kind goes through.

A task kind is one module under ``pipeline/tasks/`` (or anywhere importable)
that defines its config model (a :class:`~pipeline.config.TaskConfig`), its
task class (the :class:`~pipeline.tasks.base.Task` protocol) and, when the
defaults do not fit, its driver-side hooks (a :class:`TaskJob`), and registers
them once::

    class TranslateConfig(TaskConfig):
        kind: Literal["translate"] = "translate"
        target: str = Field("de", description="target language")

    register_task(TranslateConfig, TranslateTask)

The job config's ``task`` (:class:`~pipeline.config.JobConfig`), the CLI, the
README's config reference and the runner all read this registry; the modules
of ``pipeline.tasks`` are imported on the first lookup, so nothing else lists
the built-in kinds.

This module sits in the config layer: it imports no pyspark, torch or
task module at import time. The :class:`TaskJob` defaults reach the io and
model layers lazily, inside the methods the runner calls.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig, TaskConfig
from pipeline.fingerprint import check_declarations

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ModelInfo", "TaskJob", "TaskKind", "get_task_kind", "register_task", "task_kinds"]


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


class TaskJob:
    """The driver-side parts of a task kind, called by :func:`pipeline.runner.run_job` in this order.

    The defaults fit tasks that read one source row and write one output row
    per input row (embed, classify, generate); a kind overrides only what
    differs (the ``recommend`` kind reads users and interactions, explodes
    top-K lists and refreshes a latest table).
    """

    def model_info(self, config: JobConfig, task: Any) -> ModelInfo:
        """Check the model before any work and fingerprint it for lineage.

        The folder, its weights (every weight of the architecture present and
        used, safetensors unless ``model.allow_pickle``), the architecture
        against the task, and the task's token length against the model's
        positions (``pipeline.models.checks``).
        """
        from pipeline.models.checks import check_model
        from pipeline.models.loading import model_revision, resolve_model_path

        path = resolve_model_path(config.model.path, registry_uri=config.model.registry_uri)
        needed = task.positions_needed() if hasattr(task, "positions_needed") else (None, "")
        check_model(path, kind=getattr(task, "model_kind", task.kind), allow_pickle=config.model.allow_pickle,
                    max_tokens=needed[0], max_tokens_key=needed[1])
        return ModelInfo(config.model.path, config.model.name or path.name, model_revision(path))

    def read_inputs(self, spark: "SparkSession", config: JobConfig, task: Any) -> "DataFrame":
        """``id``, the task's input columns and the kept columns, checked against the source."""
        from pipeline.io.sources import read_source, select_input

        return select_input(read_source(spark, config.source), config.source, tuple(task.input_columns))

    def shape_output(self, scored: "DataFrame", config: JobConfig) -> "DataFrame":
        """The rows to write, from the scored rows (with lineage, without failed rows); default: as they are."""
        return scored

    def check_complete(self, *, rows_in: int, rows_out: int, rows_quarantined: int,
                       counts: dict[str, Any]) -> str | None:
        """None when every input row is accounted for; else what does not add up."""
        if rows_in == rows_out + rows_quarantined:
            return None
        return f"{rows_in} rows in but {rows_out} written + {rows_quarantined} quarantined"

    def after_commit(self, spark: "SparkSession", config: JobConfig, *, output: str, run_id: str,
                     ds: Any) -> dict[str, str]:
        """Work after the output committed (e.g. a latest table); returns summary lines ``{label: value}``."""
        return {}

    def summary_lines(self, spark: "SparkSession", config: JobConfig, counts: dict[str, Any],
                      model: ModelInfo) -> dict[str, str]:
        """Extra lines for the end-of-run summary, ``{label: value}``."""
        return {}


@dataclass(frozen=True)
class TaskKind:
    """One registered task kind: its config model, its task class and its driver-side hooks."""

    kind: str
    config: type[TaskConfig]
    task: type
    job: TaskJob = field(default_factory=TaskJob)

    @property
    def summary(self) -> str:
        """The first line of the config's docstring: what the task does."""
        return (self.config.__doc__ or "").strip().splitlines()[0] if self.config.__doc__ else ""


_kinds: dict[str, TaskKind] = {}
_discovered = False
_lock = threading.RLock()


def register_task(config: type[TaskConfig], task: type, *, job: TaskJob | None = None) -> TaskKind:
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
    entry = TaskKind(kind, config, task, job or TaskJob())
    with _lock:
        old = _kinds.get(kind)
        if old is not None and (_qualname(old.config), _qualname(old.task)) != (_qualname(config), _qualname(task)):
            raise ValueError(f"task kind {kind!r} is already registered by {_qualname(old.task)}")
        _kinds[kind] = entry
    return entry


def unregister_task(kind: str) -> None:
    """Forget ``kind`` (tests that register throwaway kinds)."""
    with _lock:
        _kinds.pop(kind, None)


def get_task_kind(kind: str) -> TaskKind:
    """The registered entry for ``kind``; raises ``KeyError`` naming the known kinds."""
    _discover()
    try:
        return _kinds[kind]
    except KeyError:
        raise KeyError(f"unknown task kind {kind!r}; known: {', '.join(sorted(_kinds))}") from None


def task_kinds() -> dict[str, TaskKind]:
    """Every registered kind by name (the built-in ones included)."""
    _discover()
    return dict(_kinds)


def _discover() -> None:
    """Import every module of ``pipeline.tasks`` once; each registers its kind at import."""
    global _discovered
    if _discovered:
        return
    with _lock:
        if _discovered:
            return
        package = importlib.import_module("pipeline.tasks")
        for module in pkgutil.iter_modules(package.__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"pipeline.tasks.{module.name}")
        _discovered = True


def _qualname(obj: type) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"
