"""Read a source as a stream (``source.stream``): new Delta versions or new files, micro-batch by micro-batch.

- ``delta`` with the Delta connector: ``readStream.format("delta")`` (``startingVersion``,
  ``maxFilesPerTrigger``, ``maxBytesPerTrigger``); without it the jar-free reader of
  :mod:`pipeline.io.delta.stream_source` (local paths and S3). Below Spark 4.2 that reader applies the read
  limits itself, from the checkpoint's last offset (:func:`checkpoint_offset`); an available-now run then
  needs a processing-time trigger and a last version (:class:`OpenStream`).
- ``parquet`` and ``json``: Spark's file stream source over the folder, with the schema given
  (``stream.schema_ddl``) or taken from the files there when the stream starts. JSON lines keep a line
  that does not parse in ``_corrupt_record`` (:func:`pipeline.io.file_readers.read_json`), so it is
  quarantined as ``malformed`` with its raw text, as in a batch run.

:func:`stream_failure` turns what a failed query says about its source (a schema change, rows removed
from a Delta source) into a :class:`SourceError` that names the change and what to do.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config import SourceConfig
from pipeline.errors import SourceError
from pipeline.io.file_readers import CORRUPT_RECORD_COLUMN
from pipeline.io.delta.state import unreadable_features
from pipeline.io.sources import has_delta_connector
from pipeline.io.stores import table_store
from pipeline.core.locations import Location, resolve_location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OpenStream", "checkpoint_offset", "open_stream", "read_stream", "stream_failure"]

# the connector's error classes for a source that changed under a stream, and what they mean in our words
_CONNECTOR_CHANGES = {
    "DELTA_SCHEMA_CHANGED": "the schema of the stream's source {path} changed",
    "DELTA_SOURCE_TABLE_IGNORE_CHANGES": "the stream's source {path} had rows updated or deleted",
    "DELTA_SOURCE_IGNORE_DELETE": "the stream's source {path} had rows deleted",
}


@dataclass(frozen=True)
class OpenStream:
    """A source read as a stream: ``df``, and ``until``: None, or the version an available-now run reads to
    when the jar-free Delta reader applies the read limits itself (Spark below 4.2, where a source without
    ``SupportsTriggerAvailableNow`` reads one micro-batch per available-now query): the query then runs on a
    processing-time trigger and the job stops it once a micro-batch read through ``until``."""

    df: "DataFrame"
    until: int | None = None


def read_stream(spark: "SparkSession", source: SourceConfig) -> "DataFrame":
    """The source as a streaming DataFrame (``source.where`` applied); :func:`open_stream`'s ``df``."""
    return open_stream(spark, source).df


def open_stream(spark: "SparkSession", source: SourceConfig) -> OpenStream:
    """The source as a streaming DataFrame (``source.where`` applied) and how to run its query; the stream's
    settings are ``source.stream``. Raises :class:`SourceError` for a source that cannot be streamed here."""
    stream = source.stream
    if stream is None:
        raise ValueError("read_stream needs source.stream")
    location = Location.of(str(source.path)).spark
    until = None
    try:
        if source.format == "delta":
            df, until = _delta_stream(spark, source)
        else:
            reader = spark.readStream.schema(_file_schema(spark, source))
            reader = _limits(reader, max_files=stream.max_files_per_trigger, max_bytes=stream.max_bytes_per_trigger)
            if source.format == "json":
                df = (reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_RECORD_COLUMN)
                      .json(location))
            else:
                df = reader.parquet(location)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark raises many kinds; name the source in all of them
        from pipeline.core.error_text import error_line

        raise SourceError(f"could not read source {source.path!r} as a stream (format {source.format}): "
                          f"{error_line(exc)}") from exc
    return OpenStream(df.where(source.where) if source.where else df, until)


def _limits(reader: Any, *, max_files: int | None, max_bytes: int | None) -> Any:
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    if max_bytes is not None:
        reader = reader.option("maxBytesPerTrigger", str(max_bytes))
    return reader


def _file_schema(spark: "SparkSession", source: SourceConfig) -> Any:
    """The rows' schema: ``stream.schema_ddl``, else the files' there now (JSON: with ``_corrupt_record``)."""
    from pyspark.sql.types import StringType, StructField, StructType

    assert source.stream is not None
    location = Location.of(str(source.path)).spark
    if source.stream.schema_ddl:
        schema = StructType.fromDDL(source.stream.schema_ddl)
    else:
        try:
            if source.format == "json":
                from pipeline.io.file_readers import read_json

                schema = read_json(spark, location).schema
            else:
                schema = spark.read.parquet(location).schema
        except Exception as exc:  # noqa: BLE001 - an empty or missing folder: say what to set
            raise SourceError(
                f"the stream's source {source.path} has no {source.format} files to take the rows' schema from "
                f"({type(exc).__name__}); set source.stream.schema_ddl (e.g. 'doc_id string, text string')") from None
    if source.format == "json" and CORRUPT_RECORD_COLUMN not in schema.fieldNames():
        schema = StructType([*schema.fields, StructField(CORRUPT_RECORD_COLUMN, StringType(), True)])
    return schema


def _delta_stream(spark: "SparkSession", source: SourceConfig) -> "tuple[DataFrame, int | None]":
    stream = source.stream
    assert stream is not None
    if has_delta_connector(spark):
        reader = _limits(spark.readStream.format("delta"), max_files=stream.max_files_per_trigger,
                         max_bytes=stream.max_bytes_per_trigger)
        if stream.starting_version is not None:
            reader = reader.option("startingVersion", str(stream.starting_version))
        return reader.load(Location.of(str(source.path)).spark), None
    import pyarrow as pa
    from deltalake.exceptions import TableNotFoundError

    from pipeline.arrow_types import from_arrow_schema
    from pipeline.io.delta.stream_source import DeltaStreamDataSource, STREAM_FORMAT, stream_options
    from pipeline.core.sessions import register_data_source

    path = str(source.path)
    loc = Location.of(path)
    store = table_store(loc.path or loc)
    try:
        table = store.table()
    except TableNotFoundError:
        raise SourceError(f"no Delta table at {path} to stream from (no _delta_log folder); create it first, or "
                          "stream a folder of files (source.format parquet or json)") from None
    if blocked := unreadable_features(table):
        raise SourceError(f"Delta table {path} uses {', '.join(blocked)}, which the jar-free stream reader cannot "
                          "honour; stream it with the Delta connector")
    arrow_schema = pa.schema(table.schema().to_arrow())
    if stream.max_files_per_trigger and stream.max_bytes_per_trigger:
        raise SourceError("stream.max_files_per_trigger and stream.max_bytes_per_trigger cannot both be set; "
                          "keep one")
    register_data_source(spark, DeltaStreamDataSource)
    own, resume, until = _own_limits(spark, stream, table.version())
    options = stream_options(store, arrow_schema=arrow_schema, schema_string=table.schema().to_json(),
                             starting_version=stream.starting_version, max_files=stream.max_files_per_trigger,
                             max_bytes=stream.max_bytes_per_trigger, own_limits=own, resume_offset=resume,
                             until_version=until)
    df = (spark.readStream.format(STREAM_FORMAT).schema(from_arrow_schema(arrow_schema, prefer_timestamp_ntz=False))
          .options(**options).load())
    return df, until


def _own_limits(spark: "SparkSession", stream: Any, version: int) -> tuple[bool, dict | None, int | None]:
    """``(own limits, resume offset, until)`` of the jar-free reader: below Spark 4.2 with a read limit it applies
    the limit itself from the checkpoint's last offset, and an available-now run with something left to read runs
    to the table's version now (``until``; see :class:`OpenStream`)."""
    from pipeline.core.compat import STREAM_READ_LIMITS_SINCE, session_spark, spark_line

    limited = stream.max_files_per_trigger or stream.max_bytes_per_trigger
    if not limited or spark_line(session_spark(spark)) >= STREAM_READ_LIMITS_SINCE:
        return False, None, None
    resume = checkpoint_offset(spark, resolve_location(stream.checkpoint_path))
    if stream.trigger != "available_now":
        return True, resume, None
    if resume is None:
        first = stream.starting_version
        behind = first is None or first <= version
    else:
        behind = bool(resume.get("snapshot")) or int(resume["version"]) < version
    return True, resume, version if behind else None


def checkpoint_offset(spark: "SparkSession", checkpoint: str) -> dict | None:
    """The jar-free Delta reader's offset in the last micro-batch a query's checkpoint logged (``offsets/<n>``:
    ``v1``, the batch's metadata, then one line per source); None when the checkpoint has logged none.

    Read through Spark, so any location Spark's checkpoint reaches. Raises :class:`SourceError` when the
    checkpoint holds another source's offsets (it was written by another reader: the Delta connector's)."""
    loc = Location.of(checkpoint)
    if loc.local and not os.path.isdir(os.path.join(loc.path or "", "offsets")):
        return None  # a new stream (asked without Spark, which logs a missing path as an error)
    try:
        files = (spark.read.format("binaryFile").option("pathGlobFilter", "[0-9]*")
                 .load(checkpoint.rstrip("/") + "/offsets").select("path", "content").collect())
    except Exception:  # noqa: BLE001 - no offsets folder yet: a new stream
        return None
    logged = [(int(row["path"].rstrip("/").rsplit("/", 1)[-1]), bytes(row["content"])) for row in files
              if row["path"].rstrip("/").rsplit("/", 1)[-1].isdigit()]
    if not logged:
        return None
    batch, content = max(logged)
    lines = content.decode().splitlines()
    line = lines[2].strip() if len(lines) > 2 else "-"
    offset = json.loads(line) if line not in ("", "-") else None
    if offset is not None and not (isinstance(offset, dict) and "version" in offset and "snapshot" in offset):
        raise SourceError(f"the stream's checkpoint {checkpoint} holds another reader's offsets ({line[:200]}, "
                          f"micro-batch {batch}): it was written with the Delta connector. Keep the session that "
                          "wrote it (the connector), or start again with a new stream.checkpoint_path and "
                          "stream.starting_version where the old stream stopped")
    return offset


def stream_failure(exc: BaseException, source: SourceConfig) -> SourceError | None:
    """The :class:`SourceError` a failed query's error stands for, when the source changed under the stream
    (its schema, or rows removed from a Delta source); None for any other failure."""
    from pipeline.core.error_text import python_error_line

    text = str(exc)
    line = python_error_line(text)
    if line and line.startswith("SourceError: "):
        return SourceError(line[len("SourceError: "):])
    for error_class, what in _CONNECTOR_CHANGES.items():
        if error_class in text:
            said = what.format(path=source.path)
            return SourceError(
                f"{said} ({error_class}); the query stopped before reading it. A schema change: if the job can "
                "score the new rows (source.id_column, the text column and keep_columns are still there), run the "
                "same command again and the stream reads on with the new schema. Rows changed or deleted: a "
                "stream reads appends only; score the table as a batch (drop source.stream), or start a new "
                "stream (a new stream.checkpoint_path, stream.starting_version after that version)")
    return None
