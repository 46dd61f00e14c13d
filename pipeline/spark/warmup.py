"""A small job's model loaded in a Python worker while the driver plans, so inference starts at once.

On a light session (``pipeline.stages.small_jobs``) the first inference task used to pay, after the
driver's planning: the start of Spark's Python worker daemon (torch and transformers imported,
``pipeline.spark.daemon``: about 3.4 s on 2 cores) and the model's load (about 2.3 s for MiniLM).
:func:`start_warm_up` runs one Spark task of one row as soon as the session exists, on a thread of
its own, while the driver plans on the other core: the task starts the daemon and loads the model
into its worker's cache (:func:`pipeline.spark.udf.load_model`); the reused worker then serves an
inference task with the model loaded, and the daemon forks the others at once.

The warm-up changes nothing a run writes: its task has its own job group (not the run's progress),
a failed warm-up is ignored (the inference task meets the same error and reports it), and its load
is counted by the first task that uses the model (``model_loads``, ``load_seconds``). With an
accuracy gate calibrating on the job's rows (drawn later, while planning) the warm-up only replays
a remembered verdict (``pipeline.models.verdicts``): where none is remembered it loads nothing and
the inference tasks measure on the rows. Skipped when the gate's verdict is not remembered
(``model.accuracy_gate.remember: false``): the model's cache key then depends on the rows.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from pipeline.spark.udf import InferencePlan, load_model

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["WARM_UP_GROUP", "start_warm_up", "warm_up", "warm_up_plan"]

WARM_UP_GROUP = "sbi-warm-up"


def warm_up(plan: InferencePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: load ``plan``'s model into this worker's cache, its cost kept for the first task."""
    from pyspark import TaskContext

    for _ in batches:
        pass
    try:
        load_model(plan.build_task(), plan, TaskContext.get(), defer=True)
    except Exception:  # noqa: BLE001 - no verdict to replay, or an error the inference task meets and reports
        yield pa.RecordBatch.from_pydict({"loaded": [False]})
        return
    yield pa.RecordBatch.from_pydict({"loaded": [True]})


def start_warm_up(spark: "SparkSession", plan: InferencePlan, *, labels: Any = None) -> threading.Thread:
    """Run :func:`warm_up` in one task on a daemon thread (its own job group); returns the started thread.

    ``labels`` (the run's :class:`~pipeline.spark.job_labels.JobLabels`) name its job as the run's ``warm-up``."""

    def run() -> None:
        try:
            spark.sparkContext.setJobGroup(WARM_UP_GROUP, "load the model while the driver plans",
                                           interruptOnCancel=True)
            if labels is not None:  # after the group: setJobGroup sets a description of its own
                labels.stage("warm-up")
            spark.range(1, numPartitions=1).mapInArrow(partial(warm_up, plan), "loaded boolean").collect()
        except Exception:  # noqa: BLE001 - the inference task loads the model itself and reports any error
            pass
        finally:
            if labels is not None:
                labels.release()

    thread = threading.Thread(target=run, name="sbi-warm-up", daemon=True)
    thread.start()
    return thread


def warm_up_plan(config: Any, *, model_path: str, task_class: Any,
                 model_revision: str = "") -> InferencePlan | None:
    """The plan whose model the job's inference tasks will load (the cache key is the task's), or None when
    that key is only known with the job's rows (an accuracy gate calibrating on them whose verdict is not
    remembered). A gate that will calibrate on the rows makes a plan that only replays a remembered verdict."""
    gate = config.model.accuracy_gate
    rows = (getattr(task_class, "calibrates_on_rows", False) and config.model.precision != "fp32" and gate.enabled
            and gate.sample_rows > 0)
    if rows and not gate.remember:
        return None
    return InferencePlan.for_job(config, model_path=model_path, task_class=task_class,
                                 model_revision=model_revision, recall_verdict_only=bool(rows))
