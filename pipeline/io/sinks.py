"""Write results to Delta: the Delta Spark connector when present, else the deltalake-backed source.

Either way one job makes one Delta commit, and ``overwrite_partition``
replaces only the run's partition (a rerun of the same day replaces its rows).

What a write does is decided apart from doing it: :func:`plan_write` is pure
(no Spark) and returns a :class:`WritePlan` (writer, format, save mode,
options such as ``replaceWhere`` and ``userMetadata``, partitioning, table or
path); :func:`execute_write` carries a plan out. The connector path, whose
jars cannot be fetched here, is thereby tested as a plan. Paths are URIs: a
path with a scheme reaches the connector untouched, and the deltalake writer,
which handles local or mounted paths only, refuses it before any work.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping

from pipeline.config import SinkConfig
from pipeline.errors import SinkError
from pipeline.io.paths import connector_hint, is_local, local_path, remote_refusal, resolve_location
from pipeline.io.sources import has_delta_connector

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "SinkError", "WritePlan", "WriteResult", "check_sink", "execute_write", "plan_write", "resolve_writer",
    "write_sink",
]

Writer = Literal["delta", "deltalake"]


@dataclass(frozen=True)
class WriteResult:
    output: str
    writer: str
    version: int | None
    write_id: str


@dataclass(frozen=True)
class WritePlan:
    """What one write does, decided before any Spark work.

    ``writer`` ``delta`` is ``df.write.format("delta")`` (the connector);
    ``deltalake`` is the ``sbi_delta`` Python data source. ``target`` is the
    catalog table (``table``) or the location (``path``: a URI untouched, a
    plain path made absolute; for ``deltalake`` always a local path).
    """

    writer: Writer
    format: str
    mode: Literal["append", "overwrite"]
    options: Mapping[str, str] = field(default_factory=dict)
    partition_by: tuple[str, ...] = ()
    table: str | None = None
    path: str | None = None
    write_id: str = ""

    @property
    def target(self) -> str:
        return self.table or str(self.path)


def _choose_writer(config: SinkConfig, *, connector: bool) -> Writer:
    if config.writer == "delta" and not connector:
        raise SinkError(
            "sink.writer is 'delta' but the Delta Spark connector is not on this session; add it "
            f"({connector_hint()}), or set sink.writer: auto"
        )
    if config.writer != "auto":
        return config.writer
    return "delta" if connector else "deltalake"


def _location(config: SinkConfig, path: str | None, writer: Writer) -> tuple[str | None, str | None]:
    """``(table, path)`` the writer gets; refuses what the deltalake writer cannot reach."""
    table = None if path else config.table
    key = "sink.quarantine_path" if path else "sink.path"
    location = path or config.path
    if writer == "delta":
        return table, None if table else resolve_location(str(location))
    if table:
        raise SinkError(
            f"sink.table {config.table!r} needs the Delta Spark connector (catalog tables; "
            f"{connector_hint()}); without it set sink.path to a folder instead"
        )
    if not is_local(str(location)):
        raise SinkError(remote_refusal(str(location), what="Delta writer", key=key))
    return None, local_path(str(location))


def check_sink(config: SinkConfig, *, connector: bool) -> None:
    """Refuse, before any work, an output or quarantine table this session cannot write."""
    writer = _choose_writer(config, connector=connector)
    _location(config, None, writer)
    if config.table and not config.quarantine_path:
        raise SinkError(
            f"sink.table {config.table!r} needs sink.quarantine_path (where rows whose scoring failed go)"
        )
    _location(config, config.resolved_quarantine_path(), writer)


def resolve_writer(spark: Any, config: SinkConfig) -> str:
    """``delta`` (the connector) or ``deltalake`` (the Python data source), per ``sink.writer``."""
    return _choose_writer(config, connector=has_delta_connector(spark))


def _sql_literal(value: Any) -> str:
    text = str(value.isoformat() if hasattr(value, "isoformat") else value)
    return "'" + text.replace("'", "''") + "'"


def plan_write(
    config: SinkConfig,
    *,
    partition_values: Mapping[str, Any] | None,
    commit_metadata: Mapping[str, Any] | None,
    path: str | None = None,
    connector: bool,
    faults: Mapping[str, Any] | None = None,
    write_id: str | None = None,
) -> WritePlan:
    """What writing to ``config`` (or to ``path`` with its settings) does; pure, no Spark.

    ``connector``: whether the session has the Delta Spark connector
    (:func:`~pipeline.io.sources.has_delta_connector`). Raises :class:`SinkError`
    for what cannot be written: a catalog table or a remote URI without the
    connector, ``sink.writer: delta`` without it, an ``overwrite_partition``
    without the partition's values.

    >>> p = plan_write(SinkConfig(path="s3://lake/scores"), partition_values={"ds": "2026-11-29"},
    ...                commit_metadata={"sbi.job": "j"}, connector=True, write_id="w1")
    >>> p.writer, p.format, p.mode, p.path, p.partition_by, p.options["replaceWhere"]
    ('delta', 'delta', 'overwrite', 's3://lake/scores', ('ds',), "ds = '2026-11-29'")
    """
    writer = _choose_writer(config, connector=connector)
    table, location = _location(config, path, writer)
    replace = dict(partition_values or {}) if config.mode == "overwrite_partition" else {}
    if config.mode == "overwrite_partition":
        missing = [c for c in config.partition_by if c not in replace]
        if missing:
            raise SinkError(f"mode overwrite_partition needs a value for partition column(s) {missing}")
    write_id = write_id or uuid.uuid4().hex
    metadata = json.dumps({**(commit_metadata or {}), "sbi.write_id": write_id}, default=str)
    mode: Literal["append", "overwrite"] = "append" if config.mode == "append" else "overwrite"
    if writer == "delta":
        options = {"userMetadata": metadata}
        if replace:
            options["replaceWhere"] = " AND ".join(f"{c} = {_sql_literal(v)}" for c, v in replace.items())
        return WritePlan("delta", "delta", mode, options, tuple(config.partition_by), table, location, write_id)

    from pipeline.io.delta_writer import FORMAT_NAME

    options = {
        "path": str(location),
        "partition_by": ",".join(config.partition_by),
        "write_id": write_id,
        "commit_metadata": metadata,
        "faults": json.dumps(dict(faults or {})),
    }
    if replace:
        options["replace_where"] = json.dumps(replace, default=str)
    return WritePlan("deltalake", FORMAT_NAME, mode, options, tuple(config.partition_by), None, location, write_id)


def execute_write(df: "DataFrame", plan: WritePlan) -> WriteResult:
    """Carry out ``plan`` on ``df``: one Delta commit; returns where, which writer and the version made."""
    spark = df.sparkSession
    if plan.writer == "delta":
        w = df.write.format(plan.format).mode(plan.mode).options(**plan.options)
        if plan.partition_by:
            w = w.partitionBy(*plan.partition_by)
        try:
            w.saveAsTable(plan.table) if plan.table else w.save(plan.path)
        except Exception as exc:  # noqa: BLE001
            raise SinkError(f"writing Delta table {plan.target} failed: {_root_cause(exc)}") from exc
        return WriteResult(plan.target, plan.writer, _native_version(spark, plan.table, plan.target), plan.write_id)

    _check_writable(str(plan.path))
    from pipeline.io.delta_writer import DeltaLakeDataSource

    _register_once(spark, DeltaLakeDataSource)
    try:
        df.write.format(plan.format).mode(plan.mode).options(**plan.options).save()
    except Exception as exc:  # noqa: BLE001
        raise SinkError(f"writing Delta table {plan.target} failed: {_root_cause(exc)}") from exc
    return WriteResult(plan.target, plan.writer, _deltalake_version(str(plan.path), plan.write_id), plan.write_id)


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
    plan = plan_write(
        config, partition_values=partition_values, commit_metadata=commit_metadata, path=path,
        connector=has_delta_connector(df.sparkSession), faults=faults,
    )
    return execute_write(df, plan)


_registered: set[Any] = set()
_register_lock = threading.Lock()


def _register_once(spark: Any, source: type) -> None:
    """Register the data source once per session: re-registering races with writes in other threads."""
    from pipeline.spark.session import activate_for_this_thread, session_key

    activate_for_this_thread(spark)
    key = session_key(spark)
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
    """The Python error (``Class: message``) buried in a Spark exception, else its first real line."""
    from pipeline.spark.errors import error_line

    return error_line(exc)
