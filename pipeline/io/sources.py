"""Read the rows to score: Delta by path, catalog tables, Parquet, JSON-lines logs, text files.

A Delta table is read through the Delta Spark connector when the session has
it (Databricks, ``--packages io.delta:delta-spark_...``); otherwise its current
snapshot's files are resolved with ``deltalake`` and read as Parquet by Spark.
That fallback refuses tables whose features it cannot honour (deletion
vectors, column mapping) instead of returning wrong rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config import SourceConfig
from pipeline.errors import SourceError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["SourceError", "has_delta_connector", "read_delta", "read_source", "select_input"]

# Reader features whose semantics a plain Parquet read would get wrong.
_UNSUPPORTED_READER_FEATURES = {
    "deletionVectors": "rows deleted through deletion vectors would reappear",
    "columnMapping": "physical column names differ from the logical ones",
    "v2Checkpoint": "the snapshot cannot be resolved reliably",
}


def has_delta_connector(spark: "SparkSession") -> bool:
    """Whether ``format("delta")`` works in this session (Delta jars on the JVM classpath)."""
    import os

    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    try:
        jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
        jvm.java.lang.Class.forName("org.apache.spark.sql.delta.sources.DeltaDataSource")
        return True
    except Exception:  # noqa: BLE001 - no JVM access (Spark Connect) or class missing
        return False


def read_delta(spark: "SparkSession", path: str) -> "DataFrame":
    """A Delta table's current snapshot as a DataFrame, with or without the Delta connector."""
    if has_delta_connector(spark):
        return spark.read.format("delta").load(path)
    return _read_delta_with_deltalake(spark, path)


def _read_delta_with_deltalake(spark: "SparkSession", path: str) -> "DataFrame":
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        table = DeltaTable(path)
    except TableNotFoundError:
        raise SourceError(
            f"no Delta table at {path} (no _delta_log folder); for the demo run `make demo`, "
            "or set source.path / source.format to your data"
        ) from None
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    config = table.metadata().configuration or {}
    if config.get("delta.columnMapping.mode", "none") != "none":
        features.add("columnMapping")
    blocked = sorted(features & set(_UNSUPPORTED_READER_FEATURES))
    if blocked:
        reasons = "; ".join(f"{f}: {_UNSUPPORTED_READER_FEATURES[f]}" for f in blocked)
        raise SourceError(
            f"Delta table {path} uses {', '.join(blocked)}, which the deltalake-backed reader cannot honour "
            f"({reasons}). Run with the Delta Spark connector (--packages io.delta:delta-spark_2.13:<version>) "
            "or rewrite the table without those features."
        )
    arrow_schema = pa.schema(table.schema().to_arrow())
    spark_schema = from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False)
    partition_cols = list(table.metadata().partition_columns)
    data_schema = spark_schema.__class__([f for f in spark_schema.fields if f.name not in partition_cols])
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if not actions:
        return spark.createDataFrame([], spark_schema)
    root = table.table_uri.rstrip("/")
    groups: dict[tuple, list[str]] = {}
    for action in actions:
        key = tuple(action.get(f"partition.{c}") for c in partition_cols)
        groups.setdefault(key, []).append(_join(root, action["path"]))
    frames = []
    for key, files in groups.items():
        df = spark.read.schema(data_schema).parquet(*files)
        for col, value in zip(partition_cols, key):
            df = df.withColumn(col, F.lit(value).cast(spark_schema[col].dataType))
        frames.append(df.select(*spark_schema.fieldNames()))
    result = frames[0]
    for df in frames[1:]:
        result = result.unionByName(df)
    return result


def _join(root: str, rel: str) -> str:
    from urllib.parse import unquote

    if "://" in rel:
        return rel
    root = root[len("file://"):] if root.startswith("file://") else root
    return f"{root}/{unquote(rel)}"


def read_source(spark: "SparkSession", config: SourceConfig) -> "DataFrame":
    """The configured source as a DataFrame, filtered and limited, not yet validated."""
    fmt = config.format
    try:
        if fmt == "delta":
            df = read_delta(spark, str(config.path))
        elif fmt == "table":
            df = spark.read.table(str(config.table))
        elif fmt == "parquet":
            df = spark.read.parquet(str(config.path))
        elif fmt == "json":
            df = spark.read.json(str(config.path))
        elif fmt == "text":
            df = _read_text(spark, str(config.path))
        else:  # pragma: no cover - config validation forbids it
            raise SourceError(f"unknown source.format {fmt!r}")
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark raises many kinds; name the source in all of them
        where = config.table if fmt == "table" else config.path
        raise SourceError(f"could not read source {where!r} (format {fmt}): {_first_line(exc)}") from exc
    if config.where:
        df = df.where(config.where)
    if config.limit:
        df = df.limit(config.limit)
    if config.repartition:
        df = df.repartition(config.repartition)
    return df


def _read_text(spark: "SparkSession", path: str) -> "DataFrame":
    """Plain text files: one row per line, ``id`` = file path and line number, ``text`` = the line."""
    from pyspark.sql import functions as F

    lines = spark.read.text(path).withColumn("_file", F.input_file_name())
    rdd = lines.rdd.zipWithIndex().map(lambda pair: (f"{pair[0]['_file']}:{pair[1]}", pair[0]["value"]))
    return spark.createDataFrame(rdd, "id string, text string")


def select_input(df: "DataFrame", config: SourceConfig, input_columns: tuple[str, ...]) -> "DataFrame":
    """Check the configured columns exist and project to ``id``, the task inputs and kept columns.

    The task sees its inputs under canonical names (``text`` for text tasks);
    the id column is carried as ``id``.
    """
    from pyspark.sql import functions as F

    available = df.columns
    wanted = {"id": config.id_column}
    if input_columns == ("text",):
        wanted["text"] = config.text_column
    else:
        wanted.update({c: c for c in input_columns})
    missing = [src for src in [*wanted.values(), *config.keep_columns] if src not in available]
    if missing:
        raise SourceError(
            f"source is missing column(s) {missing}; it has {available}. "
            "Set source.id_column / source.text_column / source.keep_columns to existing columns."
        )
    clash = [c for c in config.keep_columns if c in wanted]
    if clash:
        raise SourceError(f"source.keep_columns {clash} clash with the input columns {sorted(wanted)}; rename them")
    cols = [F.col(src).alias(dst) for dst, src in wanted.items()]
    if "text" in wanted:
        text_type = df.schema[config.text_column].dataType.typeName()
        if text_type not in ("string", "binary"):
            raise SourceError(
                f"source.text_column {config.text_column!r} has type {text_type}; it must be a string column"
            )
        # binary text stays binary here: the task decodes it leniently (invalid UTF-8 -> U+FFFD)
    return df.select(*cols, *[F.col(c) for c in config.keep_columns])


def _first_line(exc: BaseException) -> Any:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
