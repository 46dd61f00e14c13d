"""``score(df)``'s column and the SQL function: a scalar Arrow UDF over ``run_job``'s worker code.

:func:`inference_udf` wraps :func:`pipeline.spark.udf.score_partition` (the function ``run_job``'s
``mapInArrow`` runs: the per-worker model cache, length-sorted padded batches, per-row statuses, poison
rows isolated, out-of-memory splits) as an iterator Arrow UDF that returns one struct per row: the task's
result and status columns, then the model's lineage (:data:`pipeline.core.rows.MODEL_LINEAGE_COLUMNS`).

A column function rather than ``mapInArrow`` because only the task's inputs (and the id) cross into
Python: the caller's other columns stay in the JVM, whatever their types and widths, and Spark puts each
result beside its row. That needs the worker to answer row for row in input order, rows without an id
included (:func:`pipeline.spark.chunks.in_input_order`).

Where Spark has no Arrow column function (Spark 4.0: ``arrow_udf`` came in 4.1) the same worker runs inside a
pandas UDF (:attr:`ColumnPlan.pandas_types` set), whose edges convert pandas to Arrow and back without changing a
value (:mod:`pipeline.spark.pandas_edges`): the same rows, statuses and values on either.

The function is marked nondeterministic, so Spark runs it once per row: a deterministic one is copied
into a filter pushed below it (``scored.where("status = 'ok'")`` would score every row twice) and into
each field taken from its struct.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import pyarrow as pa

from pipeline.spark.udf import InferencePlan, score_partition

if TYPE_CHECKING:
    from pyspark.sql.udf import UserDefinedFunction

__all__ = ["ColumnPlan", "inference_udf", "plain_ddl", "result_schema", "score_columns", "score_pandas"]


@dataclass(frozen=True)
class ColumnPlan:
    """What the column function needs on an executor: the inference plan, whether its first argument is
    the row id (rows with a null id get ``invalid_id``), and the lineage values every row gets."""

    plan: InferencePlan
    with_id: bool
    lineage: tuple[tuple[str, str], ...] = ()
    # the pandas path (no arrow_udf): the Arrow type of each task input as Spark sends it (None: read from the
    # values, the SQL function's); the id then arrives as its null flag. None: the Arrow path
    pandas_types: tuple[pa.DataType | None, ...] | None = None


def result_schema(column: ColumnPlan) -> pa.Schema:
    """The struct the function returns: the task's result and status columns, then the lineage columns."""
    task_schema = column.plan.build_task().output_schema()
    return pa.schema([*task_schema, *[pa.field(name, pa.string()) for name, _ in column.lineage]])


def score_columns(column: ColumnPlan, arrays: Iterator[Any]) -> Iterator[pa.Array]:
    """The Arrow UDF: each batch of argument arrays (the id first when ``column.with_id``, then the task's
    inputs in :attr:`InferencePlan.input_columns` order) -> one struct array, row for row, in order."""
    plan = column.plan
    names = ["id", *plan.input_columns]
    schema = result_schema(column)
    task_names = schema.names[:len(schema) - len(column.lineage)]

    def batches() -> Iterator[pa.RecordBatch]:
        for item in arrays:
            values = list(item) if isinstance(item, tuple) else [item]
            if not column.with_id:  # no id given: one that is never null, so no row is flagged invalid_id
                values.insert(0, pa.array(np.zeros(len(values[0]), dtype=np.int8)))
            yield pa.RecordBatch.from_arrays(values, names=names)

    for out in score_partition(plan, batches()):
        n = out.num_rows
        fields = [out.column(name) for name in task_names]
        fields += [pa.array([value] * n, pa.string()) for _, value in column.lineage]
        yield pa.StructArray.from_arrays(fields, fields=list(schema))


def score_pandas(column: ColumnPlan, series: Iterator[Any]) -> Iterator[Any]:
    """The pandas UDF (Spark 4.0): each batch of argument Series (the id's null flag first when
    ``column.with_id``) back to Arrow, through :func:`score_columns`, and its struct out as a pandas DataFrame."""
    from pipeline.spark.pandas_edges import arrow_arguments, id_null_flags, pandas_result

    types = column.pandas_types or ()

    def arrays() -> Iterator[tuple[pa.Array, ...]]:
        for item in series:
            values = list(item) if isinstance(item, tuple) else [item]
            ids = [id_null_flags(values.pop(0))] if column.with_id else []
            yield (*ids, *arrow_arguments(values, types))

    for struct in score_columns(column, arrays()):
        yield pandas_result(struct)


def inference_udf(column: ColumnPlan) -> "UserDefinedFunction":
    """The column function of ``column``: called on the id (when ``with_id``; its null flag on the pandas path)
    and the task's input columns, it returns :func:`result_schema` as a struct. An Arrow UDF, or a pandas UDF
    when ``column.pandas_types`` is set. Nondeterministic: Spark evaluates it once per row."""
    from pyspark.sql.pandas.types import from_arrow_schema

    if column.plan.metrics_column is not None or column.plan.keep_columns:
        raise ValueError("a column function returns the task's columns only: its plan keeps no columns and has "
                         "no metrics column")
    return_type = from_arrow_schema(result_schema(column))
    with warnings.catch_warnings():  # the type is given, not hinted: a partial has no hints to read
        warnings.filterwarnings("ignore", message=".*type hints for (arrow|pandas) UDF.*", category=UserWarning)
        if column.pandas_types is not None:
            from pyspark.sql.functions import PandasUDFType, pandas_udf

            udf = pandas_udf(partial(score_pandas, column), return_type, PandasUDFType.SCALAR_ITER)
        else:
            from pyspark.sql.functions import ArrowUDFType, arrow_udf

            udf = arrow_udf(partial(score_columns, column), return_type, ArrowUDFType.SCALAR_ITER)
    return udf.asNondeterministic()


def plain_ddl(data_type: Any) -> str:
    """``data_type`` (a Spark type) as DDL with its string types spelled plainly, names quoted.

    A Spark Connect client sends a function's string types with an explicit default collation, and a Delta
    table written from them records ``string collate UTF8_BINARY``, which delta-rs refuses; a cast to the
    DDL spelling records ``string`` (as :func:`pipeline.io.delta.connector` does for ``mapInArrow``), the
    values unchanged.

    >>> from pyspark.sql.types import ArrayType, FloatType, MapType, StringType, StructField, StructType
    >>> plain_ddl(StructType([StructField("a b", ArrayType(FloatType())), StructField("m", MapType(StringType(),
    ...     FloatType()))]))
    'struct<`a b`:array<float>,`m`:map<string,float>>'
    """
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, StructType):
        fields = ",".join(f"`{f.name.replace('`', '``')}`:{plain_ddl(f.dataType)}" for f in data_type.fields)
        return f"struct<{fields}>"
    if isinstance(data_type, ArrayType):
        return f"array<{plain_ddl(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"map<{plain_ddl(data_type.keyType)},{plain_ddl(data_type.valueType)}>"
    return data_type.simpleString()
