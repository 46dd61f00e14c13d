"""The Spark side of batch mode on the endpoint backend: the rows' request lines, and each row's request key.

Two ``mapInArrow`` passes over the rows a run scores, each calling the task's own request code
(``task.batch_calls``: ``(row, call)`` of each row sent, :class:`pipeline.endpoint.Call`) on the executors,
with no model and no server: :func:`request_lines` gives the driver one request line per row sent (what it writes into the
run's request files), and :func:`with_request_keys` gives each row its request key, which the answers
collected from the provider are joined on (``pipeline.stages.batch``). Works on classic and Connect
sessions (DataFrame API only).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from pipeline.core.rows import REQUEST_KEY_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["request_lines", "with_request_keys"]

_LINES = pa.schema([("key", pa.string()), ("line", pa.string()), ("estimate", pa.int64())])


def _inputs(plan: Any, batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([batch.column(batch.schema.get_field_index(c)) for c in plan.input_columns],
                                      names=list(plan.input_columns))


def _lines(plan: Any, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pipeline.endpoint.batch_wire import request_line

    task = plan.build_task()
    for batch in batches:
        if not batch.num_rows:
            continue
        calls = [call for _, call in task.batch_calls(_inputs(plan, batch))]
        yield pa.RecordBatch.from_arrays([pa.array([c.key for c in calls], pa.string()),
                                          pa.array([request_line(c.key, c.path, c.body) for c in calls], pa.string()),
                                          pa.array([c.estimate for c in calls], pa.int64())], schema=_LINES)


def _keys(plan: Any, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    task = plan.build_task()
    for batch in batches:
        keys: list[str | None] = [None] * batch.num_rows
        if batch.num_rows:
            for i, call in task.batch_calls(_inputs(plan, batch)):
                keys[i] = call.key
        yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(keys, pa.string())],
                                         names=[*batch.schema.names, REQUEST_KEY_COLUMN])


def request_lines(rows: "DataFrame", plan: Any) -> "DataFrame":
    """``(key, line, estimate)``: the request line of each row of ``rows`` that is sent (``plan``: the run's
    :class:`pipeline.spark.udf.InferencePlan`, whose ``input_columns`` the task reads), duplicates included."""
    from pipeline.arrow_types import from_arrow_schema

    return rows.mapInArrow(partial(_lines, plan), from_arrow_schema(_LINES))


def with_request_keys(rows: "DataFrame", plan: Any) -> "DataFrame":
    """``rows`` with :data:`pipeline.core.rows.REQUEST_KEY_COLUMN`: each row's request key (null: not sent)."""
    from pipeline.arrow_types import from_arrow_schema, to_arrow_schema

    schema = to_arrow_schema(rows.schema).append(pa.field(REQUEST_KEY_COLUMN, pa.string()))
    return rows.mapInArrow(partial(_keys, plan), from_arrow_schema(schema))
