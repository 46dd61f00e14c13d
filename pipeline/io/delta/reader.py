"""Read a Delta snapshot whose files Spark cannot open itself: a Spark Python data source on pyarrow.

Without the Delta connector (and its Hadoop S3A jars) Spark has no ``s3a://`` file system, so a
table on S3 is read here: the driver resolves the snapshot's files with delta-rs and hands them
over; each Spark task reads one file through pyarrow's ``S3FileSystem`` and adds the partition
columns from the log. One task per file, so a table is read in parallel as Spark would.
:func:`read_with_deltalake` is the whole jar-free Delta read (:func:`pipeline.io.sources.read_delta` without
the connector): it resolves the snapshot, refuses what it cannot honour, and reads a local table's Parquet
files with Spark, a table on S3 here.

    read_snapshot(spark, store, files, arrow_schema, partition_columns)
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.errors import SourceError
from pipeline.core.locations import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "DeltaFilesDataSource", "FilePartition", "NamedDataSource", "READ_FORMAT", "file_batches", "log_string",
    "read_snapshot", "read_with_deltalake",
]

READ_FORMAT = "sbi_delta_files"


class FilePartition(InputPartition):
    """One data file of a Delta table (relative to the table's folder) and its partition values: a task's input."""

    def __init__(self, rel: str, partition_values: dict[str, Any]) -> None:
        super().__init__(rel)
        self.rel = rel
        self.partition_values = partition_values


class NamedDataSource(DataSource):
    """A Python data source registered as its class's ``format_name``: Spark asks the class for ``name()``."""

    format_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.format_name


class DeltaFilesDataSource(NamedDataSource):
    """``format("sbi_delta_files")``: the given Parquet files of a snapshot, with their partition values."""

    format_name = READ_FORMAT

    def reader(self, schema: Any) -> "DeltaFilesReader":
        return DeltaFilesReader(dict(self.options))


class DeltaFilesReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        from pipeline.io.stores import TableStore

        self.store = TableStore(options["path"], json.loads(options.get("storage_options_secret") or "null"))
        self.files = json.loads(options["files"])
        self.schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(options["arrow_schema"])))

    def partitions(self) -> Sequence[FilePartition]:
        return [FilePartition(f["path"], f["partition_values"]) for f in self.files]

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        yield from file_batches(self.store, partition.rel, partition.partition_values, self.schema)


def file_batches(store: Any, rel: str, partition_values: dict[str, Any], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of one data file of a table (``rel``, relative to ``store``'s folder) in the table's ``schema``:
    its partition columns from ``partition_values`` (the log's strings), a column the file lacks as nulls."""
    data = store.read_parquet(rel)
    columns = []
    for field in schema:
        if field.name in partition_values:
            value = partition_values[field.name]
            columns.append(pa.array([value] * data.num_rows, pa.string()).cast(field.type))
        elif field.name in data.column_names:
            columns.append(data[field.name].cast(field.type))
        else:  # a column added to the table after this file was written
            columns.append(pa.nulls(data.num_rows, field.type))
    yield from pa.Table.from_arrays(columns, schema=schema).to_batches()


def log_string(value: Any) -> str | None:
    """A typed partition value as the Delta log writes it (``2026-11-28``, ``true``), for a cast back.

    >>> import datetime as dt
    >>> log_string(dt.date(2026, 11, 28)), log_string(True), log_string(None), log_string(3)
    ('2026-11-28', 'true', None, '3')
    """
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def read_snapshot(spark: "SparkSession", store: Any, files: list[dict[str, Any]], arrow_schema: pa.Schema,
                  spark_schema: Any) -> "DataFrame":
    """The rows of ``files`` (``{"path": <relative, unquoted>, "partition_values": {...}}``) of ``store``."""
    _register(spark)
    options = {"path": store.location, "files": json.dumps(files),
               "arrow_schema": arrow_schema.serialize().to_pybytes().hex()}
    if store.remote:  # Spark redacts option values whose key says "secret"
        options["storage_options_secret"] = json.dumps(store.options)
    return spark.read.format(READ_FORMAT).schema(spark_schema).options(**options).load()


def _register(spark: "SparkSession") -> None:
    from pipeline.core.sessions import register_data_source

    register_data_source(spark, DeltaFilesDataSource)


def read_with_deltalake(spark: "SparkSession", loc: Location, *, version: int | None = None) -> "DataFrame":
    """The snapshot of the Delta table at ``loc`` (at ``version``) resolved with ``deltalake``, without the Delta
    connector: Spark reads a local table's Parquet files; a table on S3 is read through :func:`read_snapshot`.
    Refuses (:class:`~pipeline.errors.SourceError`) no table, and a table whose features this reader cannot honour."""
    from deltalake.exceptions import TableNotFoundError
    from pyspark.sql import functions as F

    from pipeline.arrow_types import from_arrow_schema
    from pipeline.io.delta.state import UNSUPPORTED_READER_FEATURES, unreadable_features
    from pipeline.io.paths import connector_hint
    from pipeline.io.stores import table_store

    path = loc.path or loc.raw  # the local path, or the S3 URI as written
    store = table_store(replace(loc, raw=path) if loc.local else loc)
    try:
        table = store.table(version=version)
    except TableNotFoundError:
        raise SourceError(
            f"no Delta table at {path} (no _delta_log folder); for the demo run `make demo`, "
            "or set source.path / source.format to your data"
        ) from None
    blocked = unreadable_features(table)
    if blocked:
        reasons = "; ".join(f"{f}: {UNSUPPORTED_READER_FEATURES[f]}" for f in blocked)
        raise SourceError(
            f"Delta table {path} uses {', '.join(blocked)}, which the deltalake-backed reader cannot honour "
            f"({reasons}). Run with the Delta Spark connector ({connector_hint()}) "
            "or rewrite the table without those features."
        )
    arrow_schema = pa.schema(table.schema().to_arrow())
    spark_schema = from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False)
    partition_cols = list(table.metadata().partition_columns)
    data_schema = spark_schema.__class__([f for f in spark_schema.fields if f.name not in partition_cols])
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if not actions:
        return spark.createDataFrame([], spark_schema)
    if store.remote:  # Spark has no s3a:// file system without the connector's jars: pyarrow reads the files
        from urllib.parse import unquote
        files = [{"path": unquote(a["path"]),
                  "partition_values": {c: log_string(a.get(f"partition.{c}")) for c in partition_cols}}
                 for a in actions]
        return read_snapshot(spark, store, files, arrow_schema, spark_schema)
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
