"""Task counts gathered with ``DataFrame.observe`` during a Python-data-source write, on both session kinds."""

from __future__ import annotations

import datetime as dt
import doctest
import json

from deltalake import DeltaTable

import pipeline.spark.run_metrics as run_metrics
from pipeline.config import SinkConfig
from pipeline.io.delta.sink import write_sink
from pipeline.spark.chunks import with_metrics
from pipeline.spark.run_metrics import observe_counts
from pipeline.spark.udf import METRICS_COLUMN


def test_doctests():
    result = doctest.testmod(run_metrics)
    assert result.attempted >= 2 and result.failed == 0


def _emit_counts_then_fail_once(batches):
    """Like the inference glue: counts on the task's last row; partition 0's first attempt fails AFTER emitting."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    rows, held = 0, None
    for batch in batches:
        if held is not None:
            yield with_metrics(held, METRICS_COLUMN, None)
        held, rows = batch, rows + batch.num_rows
    if held is not None:
        yield with_metrics(held, METRICS_COLUMN, json.dumps({"rows": rows, "tasks": 1}))
    if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
        raise RuntimeError("injected: this attempt fails after its counts went downstream")


def test_observed_counts_arrive_once_per_task_through_the_data_source_write(any_spark, tmp_path):
    from pyspark.sql import functions as F

    scored = (any_spark.range(0, 100, 1, 1).repartition(4, "id")
              .mapInArrow(_emit_counts_then_fail_once, f"id long, {METRICS_COLUMN} string")
              .withColumn("ds", F.lit(dt.date(2026, 11, 30))))
    to_write, observed = observe_counts(scored, METRICS_COLUMN)
    assert METRICS_COLUMN not in to_write.columns
    sink = SinkConfig(path=str(tmp_path / "out"), mode="overwrite_partition")
    write_sink(to_write, sink, partition_values={"ds": dt.date(2026, 11, 30)})

    values = run_metrics._get(observed.observation, 60)
    assert values is not None, "the observation brought nothing back from the write"
    # 4 tasks, each counted once: the failed attempt's counts reached the writer but are not merged
    assert len(values) == 4 and run_metrics.merge_task_counts(values) == {"rows": 100, "tasks": 4}
    table = DeltaTable(str(tmp_path / "out")).to_pyarrow_table()
    assert table.num_rows == 100 and METRICS_COLUMN not in table.schema.names
