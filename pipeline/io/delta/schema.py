"""The output table's schema when others touch it: a write keeps every column it finds, adds its own, and
refuses a type clash before any work.

Output tables live in a shared lakehouse: a downstream job adds a column (``reviewed``) and sets it on
yesterday's rows. A write that committed its own schema as the table's would drop that column, with its
data, from every day. So both writers merge: the table's columns first, as they are, then the columns this
job adds; the rows this job writes read back with nulls in the columns it does not write. A column this job
writes that the table holds with another type cannot be merged: :func:`check_output_schema` names it before
any row is scored.

Plain values (Delta schemas from ``deltalake``); no Spark.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["check_output_schema", "merge_schemas", "type_clashes"]


def _shape(delta_type: Any) -> Any:
    """A Delta type as plain JSON without nullability (``containsNull``, ``nullable``) or metadata."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items()
                    if k not in ("containsNull", "valueContainsNull", "nullable", "metadata")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(json.loads(delta_type.to_json()))


def _describe(delta_type: Any) -> str:
    shape = _shape(delta_type)
    return shape if isinstance(shape, str) else json.dumps(shape, separators=(",", ":"))


def type_clashes(existing: Any, ours: Any) -> list[str]:
    """The columns of ``ours`` that ``existing`` holds with another type, each as ``name: table X, job Y``.

    >>> import pyarrow as pa
    >>> from deltalake import Schema
    >>> table = Schema.from_arrow(pa.schema([("id", pa.string()), ("score", pa.float64()), ("reviewed", pa.bool_())]))
    >>> type_clashes(table, Schema.from_arrow(pa.schema([("id", pa.large_string()), ("score", pa.float32())])))
    ['score: the table has double, this job writes float']
    """
    found = {f.name.lower(): f for f in existing.fields}
    out = []
    for field in ours.fields:
        theirs = found.get(field.name.lower())
        if theirs is not None and _shape(theirs.type) != _shape(field.type):
            out.append(f"{field.name}: the table has {_describe(theirs.type)}, this job writes {_describe(field.type)}")
    return out


def merge_schemas(existing: Any, ours: Any) -> Any:
    """The table's columns as they are, then the columns of ``ours`` it lacks (a Delta ``Schema``).

    >>> import pyarrow as pa
    >>> from deltalake import Schema
    >>> table = Schema.from_arrow(pa.schema([("id", pa.string()), ("reviewed", pa.bool_())]))
    >>> [f.name for f in merge_schemas(table, Schema.from_arrow(pa.schema([("id", pa.string()), ("score", pa.float32())]))).fields]
    ['id', 'reviewed', 'score']
    """
    from deltalake import Schema

    clashes = type_clashes(existing, ours)
    if clashes:
        raise ValueError(_clash_message(clashes))
    names = {f.name.lower() for f in existing.fields}
    return Schema([*existing.fields, *(f for f in ours.fields if f.name.lower() not in names)])


def check_output_schema(existing: Any, ours: Any, *, target: str) -> None:
    """Raise :class:`~pipeline.errors.SinkError` naming every clash of ``ours`` with the table at ``target``
    (before any work), and every NOT NULL column of the table that this job would leave empty."""
    from pipeline.errors import SinkError

    problems = type_clashes(existing, ours)
    names = {f.name.lower() for f in ours.fields}
    problems += [f"{f.name}: NOT NULL in the table, and this job does not write it"
                 for f in existing.fields if not f.nullable and f.name.lower() not in names]
    if problems:
        raise SinkError(f"output table {target}: " + _clash_message(problems))


def _clash_message(problems: list[str]) -> str:
    return (f"{len(problems)} column(s) cannot take this job's rows ({'; '.join(problems)}); nothing was "
            "written. Write to a new sink.path, or change the column in the table (another job may own it)")


def delta_schema_of(spark_schema: Any) -> Any:
    """A Spark ``StructType`` as a Delta ``Schema`` (through Arrow, timestamps as UTC, as the writers store them)."""
    from deltalake import Schema
    from pipeline.arrow_types import to_arrow_schema

    return Schema.from_arrow(to_arrow_schema(spark_schema))


def existing_schema(spark: Any, *, path: str | None, table: str | None) -> Any:
    """The Delta schema of the output table at ``path`` (or catalog ``table``); None when there is none yet."""
    from pipeline.core.locations import resolve_location
    from pipeline.io.sources import has_delta_connector
    from pipeline.io.stores import is_table, open_table, reachable

    try:
        if table:
            return delta_schema_of(spark.table(table).schema)
        if not path:
            return None
        if has_delta_connector(spark):
            return delta_schema_of(spark.read.format("delta").load(resolve_location(path)).schema)
        return open_table(path).schema() if reachable(path) and is_table(path) else None
    except Exception:  # noqa: BLE001 - no table yet (or unreadable: the write itself will say why)
        return None
