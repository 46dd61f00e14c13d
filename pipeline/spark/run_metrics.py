"""Run metrics from the data itself: the per-task counts the executors emit, gathered on the driver.

Each inference task writes its final counts as JSON into one row of the
metrics column (``pipeline.spark.udf.METRICS_COLUMN``). The runner attaches a
``DataFrame.observe`` to the rows it writes, collecting those JSON values
while the write runs (no extra Spark job), and drops the column before the
write. ``observe`` works on classic and Spark Connect sessions alike, for
the Python data source writer as for ``format("delta")``, where an
accumulator needs a ``SparkContext``.

Exactly once: a failed task attempt's rows never reach the write, so its
counts are never observed; Spark merges a result task's observed metrics once
per partition, whatever the retries. Should the observation bring nothing
back, :meth:`ObservedCounts.counts` reads the column from the persisted
scored rows instead.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any, Iterable

from pipeline.core.metrics import Counts, merge_counts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["ObservedCounts", "merge_task_counts", "observe_counts", "observed_row"]

_NAME = "task_counts"
_SEPARATOR = "\n"  # between the tasks' JSON counts in the one observed string


def merge_task_counts(values: Iterable[str | None]) -> Counts:
    """Merge the tasks' JSON counts (nulls skipped) into one nested dict.

    >>> merge_task_counts(['{"rows": 2, "status": {"ok": 2}}', None, '{"rows": 3, "status": {"ok": 2, "error": 1}}'])
    {'rows': 5, 'status': {'ok': 4, 'error': 1}}
    >>> merge_task_counts([])
    {}
    """
    total: Counts = {}
    for value in values:
        if value:
            merge_counts(total, json.loads(value))
    return total


class ObservedCounts:
    """The observation on a write, and where to read the counts if it brings nothing back."""

    def __init__(self, observation: Any, scored: "DataFrame", column: str) -> None:
        self.observation, self.scored, self.column = observation, scored, column

    def counts(self, *, wait_s: float = 60.0) -> Counts:
        """The merged counts of every task whose rows were written (call after the write)."""
        values = _get(self.observation, wait_s)
        if values is None:  # not observed (the plan did not run it): read the persisted rows
            from pyspark.sql import functions as F

            rows = self.scored.where(F.col(self.column).isNotNull()).select(self.column).collect()
            values = [r[0] for r in rows]
        return merge_task_counts(values)


def observe_counts(scored: "DataFrame", column: str) -> tuple["DataFrame", ObservedCounts]:
    """``(rows to write, handle)``: ``scored`` observed for its ``column`` values, without ``column``."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation(_NAME)
    # one string, not an array: Spark 4.0's Connect server cannot send an array in observed metrics
    # ("Unsupported component type ... in arrays"); each value is compact JSON, which holds no newline
    joined = F.concat_ws(_SEPARATOR, F.collect_list(F.col(column)))
    observed = scored.observe(observation, joined.alias("values"))
    return observed.drop(column), ObservedCounts(observation, scored, column)


def _get(observation: Any, wait_s: float) -> list[str] | None:
    """The observed values, or None when none arrived (a classic ``get`` would block forever then)."""
    observed = observed_row(observation, wait_s)
    values = None if observed is None else observed.get("values")
    # nothing at all: not observed (Spark 4.0 Connect through a data source write)
    return None if values is None else [v for v in values.split(_SEPARATOR) if v]


def observed_row(observation: Any, wait_s: float) -> dict[str, Any] | None:
    """What ``observation`` (a ``pyspark.sql.Observation``) collected, or None when nothing arrived within
    ``wait_s`` (a classic ``get`` blocks forever on an observation its plan never ran; Connect raises)."""
    box: dict[str, Any] = {}

    def fetch() -> None:
        try:
            box["row"] = dict(observation.get)
        except Exception as exc:  # noqa: BLE001 - Connect raises when nothing was observed
            box["error"] = exc

    thread = threading.Thread(target=fetch, daemon=True, name="observed-row")
    thread.start()
    thread.join(wait_s)
    return box.get("row")
