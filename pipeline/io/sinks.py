"""Write results to Delta: the Delta Spark connector when present, else the deltalake-backed source.

Either way one job makes one Delta commit, and ``overwrite_partition``
replaces only the run's partition (a rerun of the same day replaces its rows).
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from pipeline.config import SinkConfig
from pipeline.io.sources import has_delta_connector

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SinkError", "WriteResult", "resolve_writer", "write_sink"]


class SinkError(RuntimeError):
    """The output table cannot be written (unwritable path, partitioning mismatch, commit failure)."""


@dataclass(frozen=True)
class WriteResult:
    output: str
    writer: str
    version: int | None
    write_id: str


def resolve_writer(spark: Any, config: SinkConfig) -> str:
    """``delta`` (the connector) or ``deltalake`` (the Python data source), per ``sink.writer``."""
    if config.writer != "auto":
        if config.writer == "delta" and not has_delta_connector(spark):
            raise SinkError(
                "sink.writer is 'delta' but the Delta Spark connector is not on this session; add "
                "--packages io.delta:delta-spark_2.13:<version> (and the Delta SQL extension), "
                "or set sink.writer: auto"
            )
        return config.writer
    return "delta" if has_delta_connector(spark) else "deltalake"


def _sql_literal(value: Any) -> str:
    text = str(value.isoformat() if hasattr(value, "isoformat") else value)
    return "'" + text.replace("'", "''") + "'"


def write_sink(
    df: "DataFrame",
    config: SinkConfig,
    *,
    partition_values: Mapping[str, Any] | None = None,
    commit_metadata: Mapping[str, Any] | None = None,
    faults: Mapping[str, Any] | None = None,
    path: str | None = None,
) -> WriteResult:
    """Write ``df`` as configured; returns where, with which writer, and the Delta version made.

    ``partition_values`` names the partition this run writes (e.g. ``{"ds": date}``);
    with ``mode: overwrite_partition`` exactly that partition is replaced.
    ``path`` writes to another folder with the same settings (the quarantine table).
    """
    spark = df.sparkSession
    writer = resolve_writer(spark, config)
    table = None if path else config.table
    target = table or os.path.abspath(str(path or config.path))
    replace = dict(partition_values or {}) if config.mode == "overwrite_partition" else {}
    if config.mode == "overwrite_partition":
        missing = [c for c in config.partition_by if c not in replace]
        if missing:
            raise SinkError(f"mode overwrite_partition needs a value for partition column(s) {missing}")
    spark_mode = "append" if config.mode == "append" else "overwrite"
    write_id = uuid.uuid4().hex
    metadata = {**(commit_metadata or {}), "sbi.write_id": write_id}

    if writer == "delta":
        w = df.write.format("delta").mode(spark_mode).option("userMetadata", json.dumps(metadata, default=str))
        if config.partition_by:
            w = w.partitionBy(*config.partition_by)
        if replace:
            w = w.option("replaceWhere", " AND ".join(f"{c} = {_sql_literal(v)}" for c, v in replace.items()))
        try:
            w.saveAsTable(table) if table else w.save(target)
        except Exception as exc:  # noqa: BLE001
            raise SinkError(f"writing Delta table {target} failed: {str(exc).strip().splitlines()[0]}") from exc
        version = _native_version(spark, table, target)
        return WriteResult(target, writer, version, write_id)

    if table:
        raise SinkError(
            f"sink.table {config.table!r} needs the Delta Spark connector (catalog tables); "
            "without it set sink.path to a folder instead"
        )
    _check_writable(target)
    from pipeline.io.delta_writer import FORMAT_NAME, DeltaLakeDataSource

    _register_once(spark, DeltaLakeDataSource)
    w = (
        df.write.format(FORMAT_NAME).mode(spark_mode)
        .option("path", target)
        .option("partition_by", ",".join(config.partition_by))
        .option("write_id", write_id)
        .option("commit_metadata", json.dumps(metadata, default=str))
        .option("faults", json.dumps(dict(faults or {})))
    )
    if replace:
        w = w.option("replace_where", json.dumps(replace, default=str))
    try:
        w.save()
    except Exception as exc:  # noqa: BLE001
        raise SinkError(f"writing Delta table {target} failed: {_root_cause(exc)}") from exc
    return WriteResult(target, writer, _deltalake_version(target, write_id), write_id)


_registered: set[Any] = set()
_register_lock = threading.Lock()


def _register_once(spark: Any, source: type) -> None:
    """Register the data source once per session: re-registering races with writes in other threads.

    Works on both session kinds: a Connect session registers it in its server-side session (keyed
    by the session id; the server's Python workers import the source class).
    """
    from pipeline.spark.session import is_connect

    if is_connect(spark):
        key: Any = ("connect", spark.session_id)
    else:
        key = id(spark._jsparkSession)
        # Python data sources are looked up in the JVM thread's active session; a write from
        # another Python thread runs on a JVM thread that has none.
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    with _register_lock:
        if key not in _registered:
            spark.dataSource.register(source)
            _registered.add(key)


def _check_writable(path: str) -> None:
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise SinkError(f"output path {path} cannot be created: {probe} is a file, not a folder; set sink.path elsewhere")
    if not os.access(probe, os.W_OK):
        raise SinkError(f"output path {path} is not writable ({probe} denies writing); set sink.path elsewhere")


def _deltalake_version(path: str, write_id: str) -> int | None:
    """The version of the commit carrying ``write_id`` (None if it is not in recent history)."""
    from deltalake import DeltaTable

    for entry in DeltaTable(path).history(limit=50):
        if entry.get("sbi.write_id") == write_id:
            return int(entry["version"])
    return None


def _native_version(spark: Any, table: str | None, target: str) -> int | None:
    try:
        name = table or f"delta.`{target}`"
        row = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()[0]
        return int(row["version"])
    except Exception:  # noqa: BLE001 - the version is informative only
        return None


def _root_cause(exc: BaseException) -> str:
    """The Python error message buried in a Spark exception, else its first line."""
    text = str(exc)
    for marker in ("SinkError:", "ValueError:", "DeltaError:", "CommitFailedError:", "DeltaProtocolError:",
                   "SchemaMismatchError:", "PermissionError:", "OSError:"):
        if marker in text:
            tail = text.rsplit(marker, 1)[1].strip().splitlines()
            return f"{marker} {tail[0]}" if tail else marker
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
