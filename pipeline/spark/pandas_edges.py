"""The column function's two edges where Spark has no Arrow column function (Spark 4.0): pandas in and out.

Spark 4.0's column functions over batches are pandas UDFs: Spark turns each Arrow batch of arguments into
pandas Series, and the pandas DataFrame returned back into an Arrow struct. The worker
(:func:`pipeline.spark.udf.score_partition`) reads and writes Arrow, so these two edges convert, keeping every
value the arrow_udf of Spark 4.1 and later would pass:

- arguments (:func:`arrow_arguments`): strings and bytes back to the Arrow type Spark sent them as (read from the
  DataFrame's schema on the driver; the SQL function, whose argument types come only with the call, reads it
  from the values). Other types are refused on the driver (:func:`check_pandas_inputs`): pandas turns an
  integer column with nulls into floats (past 2**53 they round) and a null float into NaN. The id arrives as its
  null flag (``id IS NULL``, computed by Spark), for the same reason: only whether it is null matters;
- results (:func:`pandas_result`): the struct's flat fields as Arrow-backed pandas columns, which Spark takes
  back without converting a value; nested ones (embeddings, maps, lists of structs) as the Python values
  Spark's converter reads (arrays, dicts).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

__all__ = ["PANDAS_EXACT_TYPES", "arrow_arguments", "check_pandas_inputs", "id_null_flags", "pandas_result"]

# the Spark types (DataType.typeName()) whose values the pandas path passes unchanged
PANDAS_EXACT_TYPES = ("string", "binary")


def check_pandas_inputs(types: Mapping[str, str], *, spark_version: str, needs: str) -> None:
    """Refuse, on the driver, a column the pandas path cannot pass exactly (``types``: column -> Spark type).

    >>> check_pandas_inputs({"text": "string"}, spark_version="4.0.1", needs="4.1")
    >>> check_pandas_inputs({"n": "integer"}, spark_version="4.0.1", needs="4.1")
    Traceback (most recent call last):
    ...
    pipeline.errors.SourceError: score(df) on Spark 4.0.1 passes the columns it reads through pandas (an Arrow \
column function needs Spark 4.1 or later), which keeps strings and bytes exactly but not column 'n' of type \
integer (nulls, NaN, integers past 2**53): cast it to string first, e.g. F.col('n').cast('string'), or run on \
Spark 4.1 or later
    """
    from pipeline.errors import SourceError

    for column, spark_type in types.items():
        if spark_type not in PANDAS_EXACT_TYPES:
            raise SourceError(
                f"score(df) on Spark {spark_version} passes the columns it reads through pandas (an Arrow column "
                f"function needs Spark {needs} or later), which keeps strings and bytes exactly but not column "
                f"{column!r} of type {spark_type} (nulls, NaN, integers past 2**53): cast it to string first, e.g. "
                f"F.col({column!r}).cast('string'), or run on Spark {needs} or later")


def id_null_flags(flags: Any) -> pa.Array:
    """The id argument rebuilt from its null flags: a column null exactly where the id is (its values unused).

    >>> id_null_flags(__import__("pandas").Series([False, True, False])).to_pylist()
    [0, None, 0]
    """
    mask = np.asarray(flags, dtype=bool)
    return pa.array(np.zeros(len(mask), dtype=np.int8), mask=mask)


def arrow_arguments(values: Sequence[Any], types: Sequence[pa.DataType | None]) -> list[pa.Array]:
    """Each pandas Series back to its Arrow type (None: read from the values, strings or bytes).

    >>> import pandas as pd
    >>> [a.to_pylist() for a in arrow_arguments([pd.Series(["a", None]), pd.Series([b"x", None])],
    ...                                         [pa.string(), None])]
    [['a', None], [b'x', None]]
    >>> arrow_arguments([pd.Series([None, None])], [None])[0].type  # all null, read as text
    DataType(string)
    """
    arrays = []
    for series, arrow_type in zip(values, types):
        if not hasattr(series, "dtype"):  # a struct argument arrives as a pandas DataFrame
            raise TypeError("a struct column cannot be scored through pandas (Spark 4.0): pass a string or binary "
                            "column, or run on Spark 4.1 or later")
        if arrow_type is not None:
            arrays.append(pa.array(series, type=arrow_type, from_pandas=True))
            continue
        array = pa.array(series, from_pandas=True)
        if pa.types.is_null(array.type):
            array = array.cast(pa.string())
        if not (pa.types.is_string(array.type) or pa.types.is_binary(array.type)):
            raise TypeError(f"an argument of type {array.type} cannot be scored through pandas (Spark 4.0): pass "
                            "a string or binary column (CAST(x AS STRING)), or run on Spark 4.1 or later")
        arrays.append(array)
    return arrays


def pandas_result(struct: pa.StructArray) -> Any:
    """The worker's struct as the pandas DataFrame a pandas UDF returns: flat fields Arrow-backed (no copy),
    nested fields as arrays, dicts and lists of dicts.

    >>> s = pa.StructArray.from_arrays([pa.array([1, None], pa.int32()),
    ...     pa.array([[1.5], None], pa.list_(pa.float32())),
    ...     pa.array([[("a", 0.5)], None], pa.map_(pa.string(), pa.float32()))], names=["n", "e", "m"])
    >>> frame = pandas_result(s)
    >>> str(frame["n"].dtype), [None if v is None else v.tolist() for v in frame["e"]], list(frame["m"])
    ('int32[pyarrow]', [[1.5], None], [{'a': 0.5}, None])
    """
    import pandas as pd

    columns = {}
    for field, array in zip(struct.type, struct.flatten()):
        if pa.types.is_nested(field.type):
            columns[field.name] = pd.Series(array.to_pandas(maps_as_pydicts="strict"), dtype=object)
        else:
            columns[field.name] = pd.Series(pd.arrays.ArrowExtensionArray(array))
    return pd.DataFrame(columns)
