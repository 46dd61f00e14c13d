"""Spark's schema conversions to and from Arrow, the same on every supported Spark line.

pyspark's own helpers changed their keywords between lines (Spark 4.0's ``to_arrow_schema(timestamp_utc=True)``
became ``timezone="UTC"`` later), so both Spark glue (``pipeline.spark``) and the table code (``pipeline.io``)
convert through here: a timestamp is UTC on every line. On the platform floor beside them (they never import
each other); pyspark is imported inside the functions, on the driver or an executor that has it.

Why it sits at the package's top level, the one floor module there that is neither a face nor public: inside
``spark/`` or ``io/`` the other would have to import it (the two never meet), and ``core/`` may import no pyspark,
not even inside a function (a forbidden contract).
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

__all__ = ["from_arrow_schema", "to_arrow_schema"]


@lru_cache(maxsize=None)
def _keywords(function: Any) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def to_arrow_schema(schema: Any) -> Any:
    """A Spark ``StructType`` as a ``pyarrow.Schema``, timestamps in UTC."""
    from pyspark.sql.pandas.types import to_arrow_schema as convert

    if "timezone" in _keywords(convert):  # Spark 4.1 and later
        return convert(schema, timezone="UTC")
    return convert(schema, timestamp_utc=True)  # Spark 4.0


def from_arrow_schema(schema: Any, *, prefer_timestamp_ntz: bool = False) -> Any:
    """A ``pyarrow.Schema`` as a Spark ``StructType``."""
    from pyspark.sql.pandas.types import from_arrow_schema as convert

    return convert(schema, prefer_timestamp_ntz=prefer_timestamp_ntz)
