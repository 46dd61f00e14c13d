"""The Arrow side of the ``recommend`` task: the users' seen-item lists in, the ragged top-K lists out.

Both without a Python list per row: offsets and flat values, as Arrow keeps them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ragged_lists", "seen_lists"]


def seen_lists(column: pa.Array, rows: np.ndarray) -> list[np.ndarray]:
    """The list column's values for ``rows`` as int64 arrays (a null list is empty), without Python lists."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise TypeError(f"seen column must be a list of item ids, got {column.type}")
    column = column.cast(pa.list_(pa.int64()))
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(column).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    # Null item ids become -1, which no catalog knows, so encode_users drops them.
    return [flat[starts[i]:starts[i + 1]] for i in rows]


def ragged_lists(values: np.ndarray, keep: np.ndarray, rows: np.ndarray, n: int, value_type: pa.DataType) -> pa.Array:
    """A list array of length ``n``: row ``rows[j]`` gets ``values[j][keep[j]]``, other rows are null."""
    lengths = np.zeros(n, dtype=np.int32)
    lengths[rows] = keep.sum(axis=1)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = np.ones(n, dtype=bool)
    mask[rows] = False
    flat = pa.array(values[keep], value_type)  # row-major: each row's kept slots, best first
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=pa.array(mask))
