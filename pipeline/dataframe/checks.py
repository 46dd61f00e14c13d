"""What ``score(df)`` and ``register_function`` check before any Spark job, and the column function they build.

The task, model and batching come in as keyword arguments, dicts or config objects and are validated into a
:class:`~pipeline.config.JobConfig` by :func:`pipeline.config.build_config`: the same pydantic models, the
same cross-checks and the same messages (``task.pooling: Input should be 'mean' or 'cls'``) as a YAML
file. Its ``source`` and ``sink`` sections only stand in for the caller's DataFrame and write
(:data:`CALLER`): nothing reads or writes them, and neither is in the task fingerprint.

Then, in this order, all before any Spark job (reading ``df.schema`` is analysis, not a job): the columns
named (present, of a type the task reads, no output column already taken) and the model, checked and
fingerprinted as ``run_job`` checks it (:func:`pipeline.tasks.job.checked_model`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pipeline.config import BatchingConfig, ConfigError, JobConfig, ModelConfig, TaskConfig, build_config
from pipeline.errors import SourceError
from pipeline.config.fingerprint import task_fingerprint
from pipeline.registry import ModelInfo, TaskKind, get_task_kind, kind_and_task

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipeline.spark.column_udf import ColumnPlan

__all__ = ["CALLER", "Scoring", "check_columns", "check_function_name", "checked", "input_columns", "prepare_scoring"]

# what the job config's source and sink sections name: the caller's DataFrame and the caller's own write
CALLER = "score(df)"
_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Scoring:
    """A task validated and its model checked: what the column function is built from."""

    config: JobConfig
    kind: TaskKind
    task: Any
    model: ModelInfo

    @property
    def lineage(self) -> dict[str, str]:
        """The model's lineage columns, with the task fingerprint ``run_job`` gives the same settings."""
        return self.model.lineage(task_fingerprint(self.config, revision=self.model.revision))

    def column_plan(self, *, with_id: bool, rate_share: float = 1.0) -> "ColumnPlan":
        """The column function's plan: ``run_job``'s inference plan for this config (no staging, progress
        or metrics column: the caller's query owns the run), fault drills from ``SBI_FAULTS``."""
        from pipeline.core import faults
        from pipeline.spark.column_udf import ColumnPlan
        from pipeline.spark.udf import InferencePlan

        plan = InferencePlan.for_job(self.config, model_path=self.model.path, task_class=self.kind.task,
                                     input_columns=tuple(self.task.input_columns),
                                     faults=tuple(faults.from_env().items()), journal_requests=False,
                                     rate_share=rate_share, model_revision=self.model.revision)
        return ColumnPlan(plan, with_id=with_id, lineage=tuple(self.lineage.items()))


def prepare_scoring(task: Any, *, model: Any, batching: Any, settings: Mapping[str, Any], id_column: str | None,
                    caller: str) -> tuple[JobConfig, TaskKind, Any]:
    """``(config, kind, task)``: the arguments validated as a job config, and the kind's task built from it.

    ``caller`` names the call in error messages (``invalid config score(): ...``).
    """
    _refuse_kind(_kind_name(task), caller)
    data = {
        "job": "score",
        "source": {"format": "table", "table": CALLER, "id_column": id_column or "id"},
        "model": _section(model, ModelConfig, "model", path_key="path"),
        "task": _task_section(task, settings),
        "sink": {"table": CALLER},
        "run": {"progress": False},
    }
    if batching is not None:
        data["batching"] = _section(batching, BatchingConfig, "batching")
    config = build_config(data, source=caller, expand_env=False)
    endpoint = getattr(config.task, "endpoint", None)
    if endpoint is not None and endpoint.mode == "batch":
        raise ConfigError(f"{caller}: task.endpoint.mode batch needs a run (run_job, `pipeline run`): its requests go "
                          "to the provider in files, answered within hours, and the run collects and commits them; "
                          f"{caller} scores a DataFrame as Spark computes it: use mode live here")
    kind, built = kind_and_task(config)
    return config, kind, built


def checked(config: JobConfig, kind: TaskKind, task: Any, spark: Any = None) -> Scoring:
    """Before any Spark work, as ``run_job`` checks them: the Spark (the installed pyspark, and ``spark``'s
    server when it is a Spark Connect session), the extras the task needs (the ``pip install`` line when one
    is missing), then the model, checked and fingerprinted (a registry alias pinned to its version)."""
    from pipeline.core.compat import check_spark
    from pipeline.core.sessions import is_connect
    from pipeline.tasks.job import checked_model

    check_spark()
    if spark is not None and is_connect(spark):
        check_spark(spark.version, where="the Spark Connect server")
    kind.job.check_extras(config, kind.task)
    config, model = checked_model(config, kind, task)
    return Scoring(config, kind, task, model)


def _kind_name(task: Any) -> str | None:
    if isinstance(task, str):
        return task
    if isinstance(task, TaskConfig):
        return task.kind
    return str(task["kind"]) if isinstance(task, Mapping) and "kind" in task else None


def _refuse_kind(kind: str | None, caller: str) -> None:
    """A kind whose rows are not one output row per DataFrame row (``TaskJob.not_for_dataframes``)."""
    try:
        why = get_task_kind(kind).job.not_for_dataframes if kind else None
    except KeyError:
        return  # the config's validation names the known kinds
    if why:
        raise ConfigError(f"{caller}: task kind {kind!r} cannot score a DataFrame: {why}")


def _section(value: Any, section: type, key: str, *, path_key: str | None = None) -> Any:
    """A config section given as an instance, a dict, or (``path_key``) a path string."""
    if value is None:
        return {}
    if isinstance(value, (section, Mapping)):
        return value
    if path_key and isinstance(value, (str, os.PathLike)):
        return {path_key: os.fspath(value)}
    what = "a path, a dict or a ModelConfig" if path_key else f"a dict or a {section.__name__}"
    raise ConfigError(f"{key} must be {what}; got {type(value).__name__} {value!r}")


def _task_section(task: Any, settings: Mapping[str, Any]) -> Any:
    """The ``task`` section: a kind's name, a dict with ``kind`` or a TaskConfig, with ``settings`` over it."""
    if isinstance(task, str):
        return {"kind": task, **settings}
    if isinstance(task, TaskConfig):
        if not settings:
            return task
        return {**{name: getattr(task, name) for name in {"kind", *task.model_fields_set}}, **settings}
    if isinstance(task, Mapping):
        return {**task, **settings}
    raise ConfigError(f"task must be a task kind (e.g. 'embed'), a dict with 'kind' or a TaskConfig; got "
                      f"{type(task).__name__} {task!r}")


def input_columns(task: Any, text_column: str | Sequence[str] | None) -> dict[str, str]:
    """``{task input: DataFrame column}``: ``text_column`` names the column(s) the task reads, in the order of
    its inputs (``task.input_columns``); without it each input is read from the column of its own name.

    >>> class Embed: input_columns = ("text",)
    >>> input_columns(Embed(), "body"), input_columns(Embed(), None)
    ({'text': 'body'}, {'text': 'text'})
    """
    inputs = tuple(task.input_columns)
    if text_column is None:
        return {c: c for c in inputs}
    given = [text_column] if isinstance(text_column, str) else list(text_column)
    if len(given) != len(inputs) or not all(isinstance(c, str) for c in given):
        raise ConfigError(f"text_column {text_column!r}: the {task.kind} task reads {len(inputs)} column(s), "
                          f"{list(inputs)}; give one DataFrame column for each, in that order")
    return dict(zip(inputs, given))


def check_columns(df: "DataFrame", task: Any, outputs: Sequence[str], *, columns: Mapping[str, str],
                  id_column: str | None) -> None:
    """Refuse, from ``df``'s schema alone, columns that are missing, of a type the task cannot read, or taken
    by an output column (the scored DataFrame keeps every input column)."""
    schema = df.schema
    names = [f.name for f in schema.fields]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise SourceError(f"the DataFrame has more than one column named {duplicated}; rename or drop them first "
                          "(score(df) keeps every input column)")
    named = {"id_column": [id_column] if id_column else [], "text_column": list(columns.values())}
    missing = {key: [c for c in cols if c not in names] for key, cols in named.items()}
    missing = {key: cols for key, cols in missing.items() if cols}
    if missing:
        said = "; ".join(f"{key} {cols}" for key, cols in missing.items())
        raise SourceError(f"the DataFrame has no column {said}; it has {names}. Name existing columns "
                          "(text_column: the column(s) the task reads, id_column: the row id)")
    types = {f.name: f.dataType.typeName() for f in schema.fields}
    for task_input, allowed in _input_types(task).items():
        column = columns[task_input]
        if types[column] not in allowed:
            raise SourceError(f"column {column!r} has type {types[column]}; the {task.kind} task reads "
                              f"{task_input!r} as {' or '.join(allowed)}: cast it, or name another column")
    taken = [c for c in outputs if c in names]
    if taken:
        raise SourceError(f"the scored DataFrame adds columns {taken} that the DataFrame already has; rename "
                          f"yours first, e.g. df.withColumnRenamed({taken[0]!r}, 'input_{taken[0]}')")


def _input_types(task: Any) -> dict[str, tuple[str, ...]]:
    """The Spark types each task input may have, where the task says (text, image bytes or paths)."""
    inputs = tuple(task.input_columns)
    if inputs == ("text",):  # a text task reads strings, or bytes it decodes leniently (as run_job)
        return {"text": ("string", "binary")}
    image_input = getattr(task.config, "image_input", None)
    if image_input is not None and getattr(task.config, "image_column", None):
        return {task.config.image_column: ("binary",) if image_input == "bytes" else ("string",)}
    return {}


def check_function_name(name: str) -> None:
    """A SQL function's name: letters, digits and underscores, not starting with a digit."""
    if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
        raise ConfigError(f"function name {name!r} is not a SQL identifier: use letters, digits and underscores, "
                          "e.g. minilm_embed")
