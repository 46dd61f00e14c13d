"""Output schemas for structured extraction: check a JSON Schema, type it for Arrow, validate completions.

The ``extract`` task (``pipeline.tasks.extract``) takes a JSON Schema in
``task.output_schema``. This module is the pure part: which schemas are
supported (refused before any work otherwise, naming the keyword), the Arrow
struct the ``fields`` column gets from a schema, and the check of one
completion against it (``jsonschema``, the reference validator, not a
hand-written one). Constrained decoding (``pipeline.generation.grammar``)
makes the model follow the schema; the check here is what decides whether a
row is ``ok`` (a completion cut off at its token budget is not).

Supported: objects (``properties``, ``required``, ``additionalProperties``),
``string``, ``integer``, ``number``, ``boolean``, string ``enum``, arrays of
those (``items``, ``minItems``, ``maxItems``), nested objects,
``minimum``/``maximum``, and a type or ``["<type>", "null"]`` for a nullable
value.

>>> arrow_type({"type": "object", "properties": {"rating": {"type": "integer"}, "tags": {"type": "array",
...     "items": {"type": "string"}, "maxItems": 3}}})
StructType(struct<rating: int64, tags: list<item: string>>)
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

from pipeline.errors import ConfigError

__all__ = ["SCALAR_TYPES", "SUPPORTED_KEYWORDS", "SchemaError", "arrow_type", "check_schema", "load_schema", "parse_completion"]

SCALAR_TYPES = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
# annotations that change nothing in the output, and the keywords each type takes
_ANNOTATIONS = {"title", "description", "$schema", "$id", "examples", "default", "$comment"}
_BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "integer": {"minimum", "maximum"},
    "number": {"minimum", "maximum"},
    "string": {"enum", "minLength", "maxLength"},
    "boolean": set(),
}
SUPPORTED_KEYWORDS = frozenset({"type", "enum"} | _ANNOTATIONS | set().union(*_BY_TYPE.values()))


class SchemaError(ConfigError):
    """An output schema this task cannot follow (the message names the keyword and where it is)."""


def load_schema(value: Mapping[str, Any] | str) -> dict[str, Any]:
    """The schema itself: inline (a mapping, or a JSON string) or read from a ``.json`` file path."""
    if isinstance(value, Mapping):
        return dict(value)
    text = value.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"task.output_schema is not valid JSON: {exc}") from None
    path = Path(value)
    if not path.is_file():
        raise SchemaError(f"task.output_schema {value!r} is neither an inline schema nor a JSON file that exists")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SchemaError(f"task.output_schema file {value} is not valid JSON: {exc}") from None


def check_schema(schema: Mapping[str, Any]) -> None:
    """Refuse a schema that is invalid JSON Schema or uses what this task does not support.

    The top level must be an object (it becomes the ``fields`` struct).

    >>> try:
    ...     check_schema({"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}})
    ... except SchemaError as exc:
    ...     print(str(exc)[:70])
    task.output_schema.properties.x: keyword 'pattern' is not supported (s
    """
    from pipeline.core.extras import require

    require(("extract",), for_what="task.kind extract (its output_schema is checked with jsonschema)")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError as InvalidSchema

    try:
        Draft202012Validator.check_schema(schema)
    except InvalidSchema as exc:
        where = ".".join(str(p) for p in exc.path)
        raise SchemaError(f"task.output_schema{'.' + where if where else ''} is not valid JSON Schema: "
                          f"{exc.message}") from None
    if set(schema) <= SUPPORTED_KEYWORDS and _types(schema, "task.output_schema") != ["object"]:
        raise SchemaError("task.output_schema must be an object schema ({\"type\": \"object\", \"properties\": ...}): "
                          "its properties become the fields struct's columns")
    _check(schema, "task.output_schema")


def _types(node: Mapping[str, Any], where: str) -> list[str]:
    """The node's non-null type(s); an enum without a type is a string enum."""
    if "type" not in node:
        if "enum" in node:
            return ["string"]
        raise SchemaError(f"{where}: needs a 'type' (one of object, array, {', '.join(SCALAR_TYPES)})")
    types = node["type"] if isinstance(node["type"], list) else [node["type"]]
    real = [t for t in types if t != "null"]
    if len(real) != 1:
        raise SchemaError(f"{where}: type {node['type']!r} is not supported: use one type, or [\"<type>\", \"null\"] "
                          "for a value that may be null")
    if real[0] not in _BY_TYPE:
        raise SchemaError(f"{where}: type {real[0]!r} is not supported (supported: {', '.join(_BY_TYPE)})")
    return real


def _check(node: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(node) - SUPPORTED_KEYWORDS)
    if unknown:
        allowed = sorted(SUPPORTED_KEYWORDS - _ANNOTATIONS)
        raise SchemaError(f"{where}: keyword {unknown[0]!r} is not supported (supported: {', '.join(allowed)}; "
                          "and annotations such as description)")
    (kind,) = _types(node, where)
    misplaced = sorted((set(node) - _ANNOTATIONS - {"type"}) - _BY_TYPE[kind])
    if misplaced:
        raise SchemaError(f"{where}: keyword {misplaced[0]!r} does not apply to type {kind!r}")
    if "enum" in node and not all(isinstance(v, str) for v in node["enum"]):
        raise SchemaError(f"{where}: enum values must be strings (they land in a string column), got {node['enum']!r}")
    if kind == "object":
        props = node.get("properties") or {}
        if not props:
            raise SchemaError(f"{where}: an object needs 'properties' (they become struct fields)")
        missing = sorted(set(node.get("required", ())) - set(props))
        if missing:
            raise SchemaError(f"{where}: required names {missing} that are not in properties")
        if node.get("additionalProperties") not in (None, False):
            raise SchemaError(f"{where}: additionalProperties may only be false (extra keys have no column)")
        for name, sub in props.items():
            _check(sub, f"{where}.properties.{name}")
    elif kind == "array":
        if "items" not in node:
            raise SchemaError(f"{where}: an array needs 'items' (its element type)")
        _check(node["items"], f"{where}.items")


def arrow_type(node: Mapping[str, Any]) -> pa.DataType:
    """The Arrow type of a (checked) schema node: objects are structs, arrays lists, enums strings."""
    (kind,) = _types(node, "schema")
    if kind == "object":
        return pa.struct([pa.field(name, arrow_type(sub)) for name, sub in node["properties"].items()])
    if kind == "array":
        return pa.list_(arrow_type(node["items"]))
    return SCALAR_TYPES[kind]


def parse_completion(text: str, schema: Mapping[str, Any], validator: Any = None) -> tuple[dict | None, str | None]:
    """``(fields, None)`` when ``text`` is JSON valid against ``schema``, else ``(None, reason)``.

    ``fields`` holds exactly the schema's properties (absent optional ones as
    None), ready for :func:`arrow_type`'s struct. ``validator``: a prebuilt
    ``Draft202012Validator`` (built once per task, not per row).

    >>> s = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 5}}, "required": ["n"]}
    >>> parse_completion('{"n": 3}', s), parse_completion('{"n": 9}', s)[1]
    (({'n': 3}, None), 'does not follow the schema at n: 9 is greater than the maximum of 5')
    >>> parse_completion('{"n": 3', s)[1][:38]
    'not valid JSON (cut off or malformed):'
    >>> parse_completion('{"n": 4e999}', s)[1]
    'number 4e999 is out of range for a double column'
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    try:
        # strict=False: a raw control character inside a string is kept, not a failure (xgrammar's JSON grammar
        # allows them, as most parsers do; the value lands in a string column as it is)
        value = json.loads(text, strict=False, parse_int=_int64, parse_float=_finite_float,
                           parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON (cut off or malformed): {exc}"
    except ValueError as exc:  # a number no Delta column holds
        return None, str(exc)
    validator = validator or Draft202012Validator(schema)
    error = best_match(validator.iter_errors(value))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path)
        return None, f"does not follow the schema{' at ' + where if where else ''}: {error.message}"
    return _project(value, schema), None


def _int64(text: str) -> int:
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"integer {text[:40]} does not fit a 64-bit column")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range for a double column")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"{text} is not a JSON number")


def _project(value: Any, node: Mapping[str, Any]) -> Any:
    """``value`` with only the schema's properties (so an extra key never reaches Arrow)."""
    if value is None:
        return None
    (kind,) = _types(node, "schema")
    if kind == "object":
        return {name: _project(value.get(name), sub) for name, sub in node["properties"].items()}
    if kind == "array":
        return [_project(v, node["items"]) for v in value]
    if kind == "number":
        return float(value)
    return value
