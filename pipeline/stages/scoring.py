"""How a run's rows are scored: the number of inference tasks, how rows are dealt to them, the UDF and
the lineage columns every scored row carries.

Parallelism is planned, not inherited: the rows are dealt to tasks of equal rows and mixed lengths
(:func:`pipeline.spark.planning.deal_rows`, deterministic across task retries), and the source's own
split count never decides it.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig
from pipeline.config.fingerprint import task_fingerprint
from pipeline.registry import ModelInfo
from pipeline.stages.inputs import malformed_input, prepare_inputs
from pipeline.stages.outcomes import kind_and_task

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["calibration_rows", "plan_inference_tasks", "prepare_scores", "score_inputs"]


def plan_inference_tasks(spark: "SparkSession", config: JobConfig, rows: int, task: Any = None) -> int:
    """Inference tasks for ``rows`` rows: ``source.repartition`` if set, else planned from rows and cores.

    Rows per task: ``spark.rows_per_task`` when set, else the task's own preference (``rows_per_task``
    on the task class: generation prefers small tasks), else the default.
    """
    from pipeline.spark.planning import count_cores, plan_tasks

    if config.source.repartition is not None:
        return config.source.repartition
    rows_per_task = config.spark.rows_per_task
    if "rows_per_task" not in config.spark.model_fields_set:
        rows_per_task = getattr(task, "rows_per_task", None) or rows_per_task
    return plan_tasks(rows, cores=count_cores(spark), rows_per_task=rows_per_task)


def _deal(inputs: "DataFrame", tasks: int, task: Any) -> "DataFrame":
    """``inputs`` dealt to ``tasks`` tasks, weighted by the length of the task's first input column if it has one."""
    from pipeline.spark.planning import deal_rows

    types = dict(inputs.dtypes)
    first = next(iter(task.input_columns), None)
    weight = first if types.get(first) in ("string", "binary") else None
    return deal_rows(inputs, tasks, weight=weight, order=tuple(c for c in ("id", "content_hash") if c in types))


def score_inputs(
    inputs: "DataFrame", config: JobConfig, *, tasks: int, run_id: str, ds: dt.date, scored_at: dt.datetime,
    model: ModelInfo, faults: dict[str, Any] | None = None, task: Any = None, progress_dir: str | None = None,
    staging_dir: str | None = None, try_id: str = "", max_tokens: int | None = None, rate_share: float = 1.0,
    fingerprint: str | None = None, carry_failed: bool = False,
) -> "DataFrame":
    """The lazily scored rows with lineage, in ``tasks`` inference tasks of equal rows and mixed lengths.

    The rows are dealt out by :func:`pipeline.spark.planning.deal_rows` (deterministic across
    task retries), and the source's own split count never decides the parallelism. Each task's counts ride in
    ``METRICS_COLUMN`` (see ``pipeline.spark.run_metrics``); drop it before writing. With ``staging_dir``
    (a plan folder of :mod:`pipeline.journal.plans`) each finished task stages its rows there, and a task
    a finished earlier try staged for the same input rows reuses them. ``fingerprint``: the run's task
    fingerprint (:attr:`pipeline.config.identity.RunIdentity.task_fingerprint`; computed from the config when not
    given).
    ``carry_failed``: a quarantined row carries its task inputs out (``_sbi_input_<c>``, see
    :func:`pipeline.spark.udf.internal_columns`) for the quarantine table.
    """
    from pyspark.sql import functions as F

    from pipeline.spark.udf import METRICS_COLUMN, InferencePlan, apply_inference

    kind, task = kind_and_task(config, task)
    plan = InferencePlan.for_job(
        config, model_path=model.path, task_class=kind.task,
        keep_columns=("content_hash", *config.source.keep_columns),
        input_columns=(*task.input_columns, *malformed_input(inputs),
                       *(c for c in getattr(task, "optional_input_columns", ()) if c in inputs.columns)),
        progress_interval_s=config.run.progress_interval_s if config.run.progress else None,
        faults=tuple((faults or {}).items()), metrics_column=METRICS_COLUMN,
        progress_dir=progress_dir, staging_dir=staging_dir, calibration_rows=calibration_rows(inputs, config, task),
        try_id=try_id, max_tokens=max_tokens, rate_share=rate_share, profile=config.run.quality.enabled,
        model_revision=model.revision,
        carry_inputs=(*task.input_columns, *malformed_input(inputs)) if carry_failed else (),
    )
    scored = apply_inference(_deal(inputs, tasks, task), plan).withColumnRenamed("id", config.source.id_column)
    lineage = model.lineage(fingerprint or task_fingerprint(config, revision=model.revision))
    scored = scored.select(
        "*",
        *[F.lit(value).alias(name) for name, value in lineage.items()],
        F.lit(run_id).alias("run_id"),
        F.lit(scored_at).cast("timestamp").alias("scored_at"),
    )
    if "ds" in config.sink.partition_by:
        scored = scored.withColumn("ds", F.lit(ds).cast("date"))
    return scored


def calibration_rows(inputs: "DataFrame", config: JobConfig, task: Any) -> tuple[str, ...]:
    """Up to ``model.accuracy_gate.sample_rows`` texts of the job's own rows for the accuracy gate, or ().

    Drawn once on the driver, the same on every worker: the rows with the smallest
    ``xxhash64`` of their id and text (so the same rows for the same input, whatever the
    file layout), non-blank, each cut to ``batching.max_length`` x 16 characters like the
    tokenizer's clip. Only for tasks that calibrate (encoder kinds) at a precision the
    gate checks.
    """
    from pyspark.sql import functions as F

    gate = config.model.accuracy_gate
    if (not getattr(task, "calibrates_on_rows", False) or config.model.precision == "fp32" or not gate.enabled
            or gate.sample_rows == 0):
        return ()
    column = task.input_columns[0]
    text = F.substring(F.col(column).cast("string"), 1, config.batching.max_length * 16)
    rows = (inputs.select(text.alias("t"), F.xxhash64(F.col("id").cast("string"), text).alias("h"))
            .where(F.col("t").isNotNull() & (F.length(F.trim(F.col("t"))) > 0))
            .orderBy("h", "t").limit(gate.sample_rows).collect())
    return tuple(r["t"] for r in rows)


def prepare_scores(
    spark: "SparkSession", config: JobConfig, *, run_id: str, ds: dt.date, scored_at: dt.datetime,
    model: ModelInfo, faults: dict[str, Any] | None = None, task: Any = None, tasks: int | None = None,
) -> tuple["DataFrame", "DataFrame"]:
    """``(inputs, scored)``: :func:`prepare_inputs` and :func:`score_inputs` in one call.

    Without ``tasks`` the inputs are counted to plan them.
    """
    inputs = prepare_inputs(spark, config, revision=model.revision, task=task)
    tasks = tasks or plan_inference_tasks(spark, config, inputs.count(), task)
    scored = score_inputs(inputs, config, tasks=tasks, run_id=run_id, ds=ds, scored_at=scored_at,
                          model=model, faults=faults, task=task)
    return inputs, scored
