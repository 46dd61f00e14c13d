"""Write results to Delta: the Delta Spark connector when present, else the deltalake-backed source.

Either way one job makes one Delta commit, and ``overwrite_partition``
replaces only the run's partition (a rerun of the same day replaces its rows).

A write made for a run carries a Delta transaction id derived from the
LOGICAL run (its run key, :func:`pipeline.identity.run_key`): an append of a run that already committed
(its driver died after the commit, and the scheduler retried it) adds nothing.

What a write does is decided apart from doing it: :func:`plan_write` is pure
(no Spark) and returns a :class:`WritePlan` (writer, format, save mode,
options such as ``replaceWhere`` and ``userMetadata``, partitioning, table or
path); :func:`execute_write` carries a plan out. Both writers run in the tests
(the connector from the jars ``make jars`` caches; see ``docs/object_stores.md``
for what the connector path does differently). Paths are URIs: a path with a
scheme reaches the connector untouched; the deltalake writer handles local or
mounted paths and ``s3://``/``s3a://`` (delta-rs's own object store, settings from
the environment: :mod:`pipeline.io.stores`) and refuses any other scheme before any work.
"""

from __future__ import annotations

import dataclasses
import json
import os
import hashlib
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping

from pipeline.config import SinkConfig, SourceConfig
from pipeline.errors import SinkError, lost_commit_message
from pipeline.io.paths import connector_hint, is_local, local_path, remote_refusal, resolve_location
from pipeline.io.sources import has_delta_connector
from pipeline.io.stores import StoreError, configured, is_object_store, open_table, storage_options, table_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "SinkError", "WritePlan", "WriteResult", "check_sink", "commit_metadata", "committed_run", "committed_run_via",
    "execute_write", "plan_write",
    "resolve_writer", "source_snapshot", "write_sink",
]

Writer = Literal["delta", "deltalake"]


@dataclass(frozen=True)
class WriteResult:
    output: str
    writer: str
    version: int | None
    write_id: str
    # the run had committed before (same transaction app id): this write added nothing; version is that commit's
    already_committed: bool = False
    # leftovers of dead writes the commit's sweep removed: files, bytes, markers (deltalake writer)
    swept: Mapping[str, Any] = field(default_factory=dict)
    # a keyed write: rows left out because an overlapping run committed the same keys first
    overlapped: int = 0


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
    # a keyed append: only keys the target lacks are inserted (the connector: an insert-only MERGE)
    key_columns: tuple[str, ...] = ()
    # the key's partition values, for the MERGE's partition pruning: {"ds": date}
    key_scope: Mapping[str, Any] = field(default_factory=dict)
    # fault drills (tests only, :mod:`pipeline.faults`) the connector's write fires; the deltalake
    # writer carries its own in ``options``
    faults: Mapping[str, Any] = field(default_factory=dict)
    # the deltalake writer's one task run in the driver (:func:`pipeline.io.delta_writer.write_from_driver`):
    # small jobs on a local master (pipeline.small_jobs)
    in_driver: bool = False

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
    if is_object_store(str(location)):
        try:
            storage_options(str(location))  # an unsafe commit setting is refused before any work
        except StoreError as exc:
            raise SinkError(f"{key}: {exc}") from None
        return None, str(location)
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
    txn_app_id: str | None = None,
    key_columns: tuple[str, ...] = (),
    read_version: int | None = None,
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

    ``txn_app_id`` (the run key, :func:`pipeline.identity.run_key`) makes an append idempotent: the connector gets Delta's
    ``txnAppId``/``txnVersion`` options (it skips a write whose app id the table already holds),
    the deltalake writer records the same transaction and skips such an append itself:

    >>> p = plan_write(SinkConfig(path="s3://lake/scores", mode="append"), partition_values=None,
    ...                commit_metadata=None, connector=True, write_id="w1", txn_app_id="sbi-run-1")
    >>> p.options["txnAppId"], p.options["txnVersion"]
    ('sbi-run-1', '0')

    ``key_columns`` keys an append on its rows (``("id", "ds")``; an incremental run's
    ``("id", "content_hash", "task_fingerprint")``): only the keys the table lacks at commit time are
    written, so two overlapping runs write each key once. ``read_version`` is the table version the
    run left out the keys it already held at (None: there was no table). The connector runs an
    insert-only ``MERGE``; the deltalake writer drops the keys committed since ``read_version`` and
    commits with a conflict token (:mod:`pipeline.io.delta_keys`):

    >>> p = plan_write(SinkConfig(path="s3://lake/scores", mode="append"), partition_values={"ds": "2026-11-29"},
    ...                commit_metadata=None, connector=True, write_id="w1", key_columns=("id", "ds"))
    >>> p.key_columns, dict(p.key_scope), "txnAppId" in p.options
    (('id', 'ds'), {'ds': '2026-11-29'}, False)
    """
    keyed = tuple(key_columns) if config.mode == "append" else ()
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
        return _connector_plan(config, mode=mode, metadata=metadata, txn_app_id=txn_app_id, keyed=keyed,
                               replace=replace, partition_values=partition_values, table=table, location=location,
                               write_id=write_id, faults=faults)
    from pipeline.io.delta_writer import FORMAT_NAME

    options = {
        "path": str(location),
        "partition_by": ",".join(config.partition_by),
        "write_id": write_id,
        "commit_metadata": metadata,
        "faults": json.dumps(dict(faults or {})),
        "require_marker": "true",
        "leftover_grace_s": str(config.leftover_grace_s),
    }
    if txn_app_id:
        options["txn_app_id"] = txn_app_id
    if replace:
        options["replace_where"] = json.dumps(replace, default=str)
    if keyed:
        options.update(key_columns=json.dumps(list(keyed)), read_version="" if read_version is None else str(read_version))
    return WritePlan("deltalake", FORMAT_NAME, mode, options, tuple(config.partition_by), None, location, write_id)


def _connector_plan(config: SinkConfig, *, mode: Literal["append", "overwrite"], metadata: str,
                    txn_app_id: str | None, keyed: tuple[str, ...], replace: dict[str, Any],
                    partition_values: Mapping[str, Any] | None, table: str | None, location: str | None,
                    write_id: str, faults: Mapping[str, Any] | None) -> WritePlan:
    """:func:`plan_write` for the Delta connector: its write options, or a keyed MERGE's."""
    if txn_app_id:  # the history names the logical run for both writers (committed_run reads it)
        metadata = json.dumps({**json.loads(metadata), "sbi.app_id": txn_app_id}, default=str)
    # a column this version adds (task_fingerprint, say) joins an older table, and a column someone else added
    # stays, whole-table overwrites included (pipeline.io.delta_schema), as with the deltalake writer
    options = {"userMetadata": metadata, "mergeSchema": "true"}
    if txn_app_id and mode == "append" and not keyed:
        # overwrites stay clean replaces (as with the deltalake writer), so a deliberate rerun still replaces
        options.update(txnAppId=txn_app_id, txnVersion="0")
    if replace:
        options["replaceWhere"] = " AND ".join(f"{c} = {_sql_literal(v)}" for c, v in replace.items())
    scope = {c: v for c, v in (partition_values or {}).items() if c in keyed}
    return WritePlan("delta", "delta", mode, options, tuple(config.partition_by), table, location, write_id,
                     keyed, scope, dict(faults or {}))


def execute_write(df: "DataFrame", plan: WritePlan) -> WriteResult:
    """Carry out ``plan`` on ``df``: one Delta commit; returns where, which writer and the version made."""
    spark = df.sparkSession
    if plan.writer == "delta" and plan.key_columns:
        return _merge_keyed(df, plan)
    if plan.writer == "delta":
        w = _connector_source(df, plan).write.format(plan.format).mode(plan.mode).options(**plan.options)
        if plan.partition_by:
            w = w.partitionBy(*plan.partition_by)
        try:
            _before_connector_commit(plan)
            w.saveAsTable(plan.table) if plan.table else w.save(plan.path)
        except Exception as exc:  # noqa: BLE001
            raise SinkError(_connector_failure(spark, plan, exc)) from exc
        version = _connector_version(spark, plan.table, plan.target, "sbi.write_id", plan.write_id)
        app_id = plan.options.get("txnAppId")
        if version is None and app_id:
            # Delta skipped the write: the table already holds this transaction (an earlier try committed)
            found = _connector_version(spark, plan.table, plan.target, "sbi.app_id", app_id)
            return WriteResult(plan.target, plan.writer, found, plan.write_id, already_committed=True)
        return WriteResult(plan.target, plan.writer, version, plan.write_id)

    path = str(plan.path)
    store = table_store(path)
    if not store.remote:
        _check_writable(path)
    from pipeline.io import leftovers
    from pipeline.io.delta_writer import DeltaLakeDataSource, write_from_driver

    if not plan.in_driver:
        _register_once(spark, DeltaLakeDataSource)
    grace = float(plan.options.get("leftover_grace_s", "900"))
    marker = (leftovers.running_marker(store, plan.write_id, table_version=_table_version(path),
                                       heartbeat_s=min(30.0, grace / 4))
              if plan.options.get("require_marker") == "true" else nullcontext())
    # the S3 settings travel with the write, not the plan; Spark redacts option values whose key says "secret"
    secret = {"storage_options_secret": json.dumps(store.options)} if store.remote else {}
    try:
        with marker:
            if plan.in_driver:
                write_from_driver(df, {**plan.options, **secret}, overwrite=plan.mode == "overwrite")
            else:
                df.write.format(plan.format).mode(plan.mode).options(**plan.options, **secret).save()
    except Exception as exc:  # noqa: BLE001
        raise SinkError(f"writing Delta table {plan.target} failed: {_root_cause(exc)}") from exc
    facts = leftovers.finished_facts(store, plan.write_id)
    swept = dict(facts.get("swept") or {})
    if facts.get("already_committed"):
        found = committed_run(path, plan.options.get("txn_app_id", ""))
        return WriteResult(plan.target, plan.writer, found[0] if found else None, plan.write_id,
                           already_committed=True, swept=swept)
    return WriteResult(plan.target, plan.writer, _deltalake_version(path, plan.write_id), plan.write_id, swept=swept,
                       overlapped=int(facts.get("overlap_rows") or 0))


# Delta's error classes for a commit that lost to a concurrent one whose files it should have read
_CONCURRENT = ("ConcurrentAppend", "DELTA_CONCURRENT_APPEND", "ConcurrentWrite", "DELTA_CONCURRENT_WRITE",
               "ConcurrentTransaction", "DELTA_CONCURRENT_TRANSACTION", "ProtocolChanged", "DELTA_PROTOCOL_CHANGED")
_MERGE_ATTEMPTS = 5


def _merge_keyed(df: "DataFrame", plan: WritePlan) -> WriteResult:
    """A keyed append through the connector: ``MERGE ... WHEN NOT MATCHED THEN INSERT *`` on the key.

    The MERGE reads the target's rows for the key's partition, so Delta rejects its commit when an
    overlapping run's MERGE added rows there first (``ConcurrentAppendException``); it then runs again
    against the new version and inserts only the keys still missing. A table that does not exist yet
    is created by a plain append (a run that loses that race merges). ``df`` should be persisted: each
    try reads it again. The commit carries ``userMetadata`` through the session setting Delta reads
    for SQL commands.
    """
    spark = df.sparkSession
    name = plan.table or f"delta.`{plan.path}`"
    view = f"sbi_keyed_{plan.write_id}"
    source = _connector_source(df, plan)
    exists = _connector_table_exists(spark, name)
    _before_connector_commit(plan)
    if not exists:
        try:
            w = source.write.format("delta").mode("append").options(**plan.options)
            w = w.partitionBy(*plan.partition_by) if plan.partition_by else w
            w.saveAsTable(plan.table) if plan.table else w.save(plan.path)
            version = _connector_version(spark, plan.table, plan.target, "sbi.write_id", plan.write_id)
            return WriteResult(plan.target, plan.writer, version, plan.write_id)
        except Exception as exc:  # noqa: BLE001 - another run created it meanwhile: merge into it
            if not _connector_table_exists(spark, name):
                raise SinkError(_connector_failure(spark, plan, exc)) from exc
    on = " AND ".join([f"t.`{c}` <=> s.`{c}`" for c in plan.key_columns]
                      + [f"t.`{c}` = {_sql_literal(v)}" for c, v in plan.key_scope.items()])
    settings = {"spark.databricks.delta.commitInfo.userMetadata": plan.options.get("userMetadata", ""),
                "spark.databricks.delta.schema.autoMerge.enabled": "true"}
    before = {k: spark.conf.get(k, None) for k in settings}
    source.createOrReplaceTempView(view)
    try:
        for k, v in settings.items():
            spark.conf.set(k, v)
        for attempt in range(_MERGE_ATTEMPTS):
            try:
                spark.sql(f"MERGE INTO {name} t USING {view} s ON {on} WHEN NOT MATCHED THEN INSERT *").collect()
                break
            except Exception as exc:  # noqa: BLE001
                if attempt < _MERGE_ATTEMPTS - 1 and any(c in str(exc) for c in _CONCURRENT):
                    continue
                raise SinkError(_connector_failure(spark, plan, exc)) from exc
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
        spark.catalog.dropTempView(view)
    # the commit's version and its operation metrics from one bounded history read
    found = _connector_commit(spark, plan.table, plan.target, "sbi.write_id", plan.write_id)
    version, metrics = found if found else (None, {})
    return WriteResult(plan.target, plan.writer, version, plan.write_id, overlapped=_merge_left_out(metrics))


# task-side write drills: the connector's write has no write() of ours, so its rows pass through one
_CONNECTOR_WRITE_DRILLS = ("exit_write_partitions", "fail_write_partitions", "stall_write")


def _connector_source(df: "DataFrame", plan: WritePlan) -> "DataFrame":
    """``df`` as the connector writes it (:func:`_plain_string_types`). Under a write drill
    (``exit_write_partitions``, ``fail_write_partitions``, ``stall_write``) its rows first pass through
    :func:`_drill_write_stage` inside the write's own tasks, so the drill fires in the connector's write stage."""
    drills = {k: plan.faults[k] for k in _CONNECTOR_WRITE_DRILLS if plan.faults.get(k)}
    if drills:
        import functools

        df = df.mapInArrow(functools.partial(_drill_write_stage, drills=drills), df.schema)
    return _plain_string_types(df)


def _drill_write_stage(batches: Any, *, drills: Mapping[str, Any]) -> Any:
    """The write stage's rows, unchanged, in slices of 8 rows; the drill (:func:`pipeline.faults.on_write`)
    fires once half of a task's first chunk has gone on to the connector.

    Rows leave the worker in writes of ``spark.buffer.size`` (64 KiB): what it still buffers dies with it.
    An unpartitioned write streams the rows it got into the file it has open, so a worker that dies there
    leaves a file of the failed attempt behind; a partitioned one sorts its rows first and has no file open yet.
    """
    from pyspark import TaskContext

    from pipeline import faults

    ctx = TaskContext.get()
    fired = False
    for n, batch in enumerate(batches):
        for start in range(0, batch.num_rows, 8):
            yield batch.slice(start, 8)
            if not fired and n == 0 and ctx is not None and start + 8 >= batch.num_rows // 2:
                fired = True  # once a task: a stall waits once, however many slices follow
                faults.on_write(ctx.partitionId(), ctx.attemptNumber(), drills)


def _before_connector_commit(plan: WritePlan) -> None:
    """The driver-side drill (``commit_barrier``) right before the connector's ``save``/``MERGE``: the closest
    point to its commit, which the connector makes inside that call, after its tasks wrote their files."""
    if plan.faults:
        from pipeline import faults

        faults.on_commit(plan.write_id, plan.faults)


def _connector_table_exists(spark: Any, name: str) -> bool:
    try:
        spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()
        return True
    except Exception:  # noqa: BLE001 - no table there (or none readable)
        return False


def _merge_left_out(metrics: Mapping[str, Any]) -> int:
    """The source rows a MERGE did not insert because their key was there, from its operation metrics.

    >>> _merge_left_out({"numSourceRows": "12", "numTargetRowsInserted": "9"}), _merge_left_out({})
    (3, 0)
    """
    source = int(metrics.get("numSourceRows", 0) or 0)
    inserted = int(metrics.get("numTargetRowsInserted", source) or 0)
    return max(0, source - inserted)


def write_sink(
    df: "DataFrame",
    config: SinkConfig,
    *,
    partition_values: Mapping[str, Any] | None = None,
    commit_metadata: Mapping[str, Any] | None = None,
    faults: Mapping[str, Any] | None = None,
    path: str | None = None,
    txn_app_id: str | None = None,
    key_columns: tuple[str, ...] = (),
    read_version: int | None = None,
    in_driver: bool = False,
) -> WriteResult:
    """Write ``df`` as configured; returns where, with which writer, and the Delta version made.

    ``partition_values`` names the partition this run writes (e.g. ``{"ds": date}``);
    with ``mode: overwrite_partition`` exactly that partition is replaced.
    ``path`` writes to another folder with the same settings (the quarantine table).
    ``txn_app_id`` (the run key, :func:`pipeline.identity.run_key`): an append of a run the table already holds adds nothing
    and returns ``already_committed``. ``key_columns`` and ``read_version``: a keyed append
    (:func:`plan_write`); ``overlapped`` in the result counts the rows another run wrote first.
    ``in_driver``: the deltalake writer writes and commits from this process (a small job's few rows,
    :func:`pipeline.io.delta_writer.write_from_driver`); the connector ignores it.
    """
    plan = plan_write(
        config, partition_values=partition_values, commit_metadata=commit_metadata, path=path,
        connector=has_delta_connector(df.sparkSession), faults=faults, txn_app_id=txn_app_id,
        key_columns=key_columns, read_version=read_version,
    )
    if in_driver and plan.writer == "deltalake":
        plan = dataclasses.replace(plan, in_driver=True)
    return execute_write(df, plan)


def _register_once(spark: Any, source: type) -> None:
    """Register the data source once per session (:func:`pipeline.sessions.register_data_source`)."""
    from pipeline.sessions import register_data_source

    register_data_source(spark, source)


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
    for entry in consistent_history(path, limit=50):  # a local path or an S3 URI
        if commit_metadata(entry).get("sbi.write_id") == write_id:
            return int(entry["version"])
    return None


def consistent_history(path: str, *, limit: int | None = None, table: Any = None) -> list[dict[str, Any]]:
    """``DeltaTable(path).history(limit)`` with versions that are right while other jobs commit
    (``path``: a local folder or an S3 URI).

    deltalake labels the commit infos it lists by counting down from the version the table
    object was loaded at, but lists commits that landed after the load too: a commit made by
    another job in between shifts every label by one (measured on deltalake 1.6: a table loaded
    at version 1 reported versions 1, 0, -1 for the commits 2, 1, 0). A listing is kept only
    when a fresh load afterwards is at the version the listing starts from.
    """
    for _ in range(50):
        table = table or open_table(path)
        entries = table.history(limit)
        top = entries[0]["version"] if entries else table.version()
        if top == table.version() == open_table(path).version():
            return entries
        table = None
    raise RuntimeError(f"could not read a stable history of {path}: it kept changing during 50 reads")


def _table_identity(path: str) -> str | None:
    """``delta:<table id>:<version>`` of the Delta table at ``path``; None when there is none."""
    from deltalake.exceptions import TableNotFoundError

    try:
        table = open_table(path)
    except TableNotFoundError:
        return None
    return f"delta:{table.metadata().id}:{table.version()}"


def source_rebuilt(before: str | None, now: str | None) -> str | None:
    """What changed when a Delta source's table id changed between two snapshots, else None.

    >>> source_rebuilt("delta:aaaa1111:3", "delta:bbbb2222:0")
    'table id aaaa1111 -> bbbb2222 (version 3 -> 0)'
    >>> source_rebuilt("delta:aaaa1111:3", "delta:aaaa1111:4") is None
    True
    """
    parts = [str(x).split(":") for x in (before, now)]
    if any(len(p) != 3 or p[0] != "delta" for p in parts) or parts[0][1] == parts[1][1]:
        return None
    (_, old_id, old_v), (_, new_id, new_v) = parts
    return f"table id {old_id} -> {new_id} (version {old_v} -> {new_v})"


def _table_version(path: str) -> int | None:
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_table(path).version()
    except TableNotFoundError:
        return None


def source_snapshot(source: SourceConfig) -> str | None:
    """What identifies the source's content, where it can be known cheaply on the driver.

    A local Delta source: ``delta:<table id>:<version>`` (a table dropped and rebuilt starts at version 0
    again under a new id: a new input, never mistaken for the old one). A local file source (parquet, json, text,
    binary_file): ``files:<hash of names, sizes and mtimes>``. A Delta source on S3 whose keys or endpoint the environment names: its version too.
    A catalog table or another remote URI:
    None (unknown; the run key then rests on the config, the model revision and ``ds``).
    """
    from pipeline.io.paths import is_local, local_path

    if source.path and source.format == "delta" and is_object_store(source.path) and configured(source.path):
        try:
            return _table_identity(source.path)
        except Exception:  # noqa: BLE001 - unreachable: unknown, as for any other remote source
            return None
    if not source.path or not is_local(source.path):
        return None
    path = local_path(source.path)
    if source.format == "delta":
        return _table_identity(path) if os.path.isdir(path) else None
    listing = []
    if os.path.isfile(path):
        stat = os.stat(path)
        listing.append((os.path.basename(path), stat.st_size, stat.st_mtime_ns))
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        for name in sorted(files):
            if name.startswith((".", "_")):
                continue
            stat = os.stat(os.path.join(folder, name))
            listing.append((os.path.relpath(os.path.join(folder, name), path), stat.st_size, stat.st_mtime_ns))
    if not listing:
        return None
    return "files:" + hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:32]


def committed_run(path: str, app_id: str) -> tuple[int, str | None] | None:
    """``(version, run id)`` of the commit carrying transaction ``app_id`` in the local Delta table at ``path``.

    None when the table does not exist or holds no such transaction. A keyed connector append (an
    insert-only MERGE) records no transaction action, only ``sbi.app_id`` in its commit info: without
    the action the last 1,000 commits are searched for it.
    """
    from deltalake.exceptions import TableNotFoundError

    if not app_id or (not is_object_store(path) and not os.path.isdir(path)):
        return None
    try:
        table = open_table(path)
    except TableNotFoundError:
        return None
    recorded = table.transaction_version(app_id) is not None
    for entry in consistent_history(path, table=table, limit=None if recorded else 1000):
        meta = commit_metadata(entry)
        if meta.get("sbi.app_id") == app_id:
            return int(entry["version"]), meta.get("sbi.run_id")
    return (table.version(), None) if recorded else None


def _plain_string_types(df: "DataFrame") -> "DataFrame":
    """``df`` with its string-bearing columns cast to their own type, spelled plainly.

    On Spark Connect (4.2) the columns a ``mapInArrow`` returns carry an explicit default collation,
    which the connector records as ``"string collate UTF8_BINARY"`` in the table's schema: a type
    delta-rs (deltalake) and older readers refuse. A cast to ``string`` records ``"string"``; the
    values are unchanged (measured: ``tests/test_failures.py`` reads such tables with deltalake).
    """
    from pyspark.sql import functions as F

    columns = [F.col(f"`{name}`").cast(dtype).alias(name) if "string" in dtype else F.col(f"`{name}`")
               for name, dtype in df.dtypes]
    return df.select(*columns) if any("string" in dtype for _, dtype in df.dtypes) else df


def commit_metadata(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A commit's ``sbi.*`` keys from either writer: top-level commitInfo keys (deltalake) or the JSON
    ``userMetadata`` string the connector records (``option("userMetadata", ...)``)."""
    found = {k: v for k, v in entry.items() if str(k).startswith("sbi.")}
    raw = entry.get("userMetadata")
    if isinstance(raw, str) and raw.startswith("{"):
        try:
            found.update({k: v for k, v in json.loads(raw).items() if str(k).startswith("sbi.")})
        except ValueError:
            pass
    return found


def _connector_commits(spark: Any, name: str, needle: str, *,
                       limit: int) -> list[tuple[int, dict[str, Any], dict[str, str]]]:
    """``(version, sbi.* metadata, operation metrics)`` of the last ``limit`` commits of ``name`` whose
    userMetadata holds ``needle``, newest first, read through the connector; [] when there is no such table."""
    from pyspark.sql import functions as F

    try:
        rows = (spark.sql(f"DESCRIBE HISTORY {name} LIMIT {int(limit)}")
                .where(F.col("userMetadata").contains(needle))
                .select("version", "userMetadata", "operationMetrics").collect())
    except Exception:  # noqa: BLE001 - no table (nothing committed) or no history
        return []
    return sorted(((int(r["version"]), commit_metadata(r.asDict()), dict(r["operationMetrics"] or {}))
                   for r in rows), key=lambda c: -c[0])


def _connector_commit(spark: Any, table: str | None, target: str, key: str, value: str,
                      *, limit: int = 100) -> tuple[int, dict[str, str]] | None:
    """``(version, operation metrics)`` of the commit whose ``userMetadata`` carries ``key: value``, read
    through the connector (one history read); None when the last ``limit`` commits hold none."""
    name = table or f"delta.`{target}`"
    return next(((v, metrics) for v, meta, metrics in _connector_commits(spark, name, value, limit=limit)
                 if str(meta.get(key)) == value), None)


def _connector_version(spark: Any, table: str | None, target: str, key: str, value: str,
                       *, limit: int = 100) -> int | None:
    """The version of the commit whose ``userMetadata`` carries ``key: value``, read through the connector.

    Never the table's latest version: a concurrent commit (another job, the other day's run) may
    have landed on top of this write, and reading that version back would miss this run's rows.
    """
    found = _connector_commit(spark, table, target, key, value, limit=limit)
    return found[0] if found else None


def committed_run_via(spark: Any, location: str, app_id: str) -> tuple[int, str | None] | None:
    """:func:`committed_run` for any location the session reaches: local tables through deltalake,
    the rest (``s3a://``, a catalog table) through the connector's history."""
    if not app_id:
        return None
    if is_local(location):
        return committed_run(local_path(location), app_id)
    if is_object_store(location) and not has_delta_connector(spark):
        return committed_run(location, app_id)
    found = [(v, meta) for v, meta, _ in _connector_commits(spark, f"delta.`{location}`", app_id, limit=1000)
             if meta.get("sbi.app_id") == app_id]
    return (found[0][0], found[0][1].get("sbi.run_id")) if found else None


# the connector's error classes that mean what the deltalake writer says in its own words
_CONNECTOR_ERRORS = {
    "DELTA_REPLACE_WHERE_MISMATCH": "rows outside the replaced partition ({where}) were written; every row must "
                                    "belong to the replaced partition",
}


def _connector_failure(spark: Any, plan: WritePlan, exc: BaseException) -> str:
    """The error text for a failed connector write, in the words the deltalake writer uses where they mean
    the same (a partitioning mismatch, rows outside the replaced partition, a commit that lost to another)."""
    text = str(exc)
    cause = _root_cause(exc)
    lost = next((c for c in _CONCURRENT if c in text), None)
    if lost:
        return lost_commit_message(plan.target, f"Delta: {lost}", winner=_connector_winner(spark, plan))
    if "DELTA_REPLACE_WHERE_MISMATCH" in text:
        cause = _CONNECTOR_ERRORS["DELTA_REPLACE_WHERE_MISMATCH"].format(where=plan.options.get("replaceWhere"))
    elif "DELTA_METADATA_MISMATCH" in text and plan.path:
        try:
            detail = spark.sql(f"DESCRIBE DETAIL delta.`{plan.path}`").collect()[0]
            existing = list(detail["partitionColumns"] or [])
        except Exception:  # noqa: BLE001 - keep Delta's own words
            existing = None
        if existing is not None and existing != list(plan.partition_by):
            cause = (f"Delta table {plan.path} is partitioned by {existing or 'nothing'} but this write is "
                     f"partitioned by {list(plan.partition_by) or 'nothing'}; set sink.partition_by to {existing} "
                     "or write to a new path")
    return f"writing Delta table {plan.target} failed: {cause}"


def _connector_winner(spark: Any, plan: WritePlan) -> str | None:
    """The newest commit of another write in the connector's history (``run X, version N``), which won the race
    this write lost; None when it cannot be read."""
    name = plan.table or f"delta.`{plan.target}`"
    for version, meta, _ in _connector_commits(spark, name, "sbi.write_id", limit=5):
        if meta.get("sbi.write_id") != plan.write_id:
            run = meta.get("sbi.run_id")
            return f"run {run}, version {version}" if run else f"version {version}"
    return None


def _root_cause(exc: BaseException) -> str:
    """The Python error (``Class: message``) buried in a Spark exception, else its first real line."""
    from pipeline.error_text import error_line

    return error_line(exc)
