"""What a write does, decided apart from doing it: :func:`plan_write` is pure (no Spark) and returns a
:class:`WritePlan` (writer, format, save mode, options such as ``replaceWhere`` and ``userMetadata``,
partitioning, table or path); :func:`pipeline.io.delta.sink.execute_write` carries a plan out.

Either way one job makes one Delta commit, and ``overwrite_partition`` replaces only the run's
partition (a rerun of the same day replaces its rows). A write made for a run carries a Delta
transaction id derived from the LOGICAL run (its run key, :func:`pipeline.config.identity.run_key`): an
append of a run that already committed (its driver died after the commit, and the scheduler retried
it) adds nothing. The deltalake writer's plan is typed (:class:`~pipeline.io.delta.options.DeltaLakeOptions`);
its Spark options are that object's one translation to strings.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from pipeline.config import SinkConfig
from pipeline.errors import SinkError
from pipeline.io.delta.options import APP_ID_KEY, FORMAT_NAME, WRITE_ID_KEY, DeltaLakeOptions
from pipeline.io.delta.target import Writer, choose_writer, target_location

__all__ = ["CommitOptions", "WritePlan", "WriteResult", "plan_write", "sql_literal"]


@dataclass(frozen=True)
class CommitOptions:
    """What a run says about its commit beyond the sink's settings, typed once: the stages build it, and
    :func:`~pipeline.io.delta.sink.write_sink` hands it to :func:`plan_write` as it is.

    The defaults are a plain write: no transaction, not keyed, no tally.

    >>> CommitOptions(txn_app_id="sbi-run-1", key_columns=("id", "ds"), read_version=3).txn_version
    0
    """

    # the run key (pipeline.config.identity.run_key): an append of a run the table already holds adds nothing
    txn_app_id: str | None = None
    # a stream's micro-batches under one app id: the write is skipped when the table holds the app id at this
    # version or a later one
    txn_version: int = 0
    # a keyed append: only keys the table lacks at commit time are written (the connector: an insert-only MERGE)
    key_columns: tuple[str, ...] = ()
    # the table version the run left out the keys it already held at (None: there was no table)
    read_version: int | None = None
    # (id, content hash): the deltalake writer's commit records the KeyTally of its files' keys; (): none
    tally_columns: tuple[str, ...] = ()
    # the table's version the run read (-1: none yet; None: unknown), from which the connector finds its
    # commit's log entry
    base_version: int | None = None


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
    # what the commit added, from its own log entry: the rows of its add actions (the connector's: its operation
    # metrics; None: not recorded) and the key tally (pipeline.core.rows.KeyTally) its writer recorded there (the
    # deltalake writer; None: not tallied; the stages put the tally of the rows handed to the connector here)
    rows_added: int | None = None
    keys_added: Any = None


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
    # fault drills (tests only, :mod:`pipeline.core.faults`) the connector's write fires; the deltalake
    # writer carries its own in ``lake``
    faults: Mapping[str, Any] = field(default_factory=dict)
    # the deltalake writer's one task run in the driver (:func:`pipeline.io.delta.datasource.write_from_driver`):
    # small jobs on a local master (pipeline.stages.small_jobs)
    in_driver: bool = False
    # the deltalake writer's write, typed; ``options`` is its ``to_options()`` (the S3 settings join at execution)
    lake: DeltaLakeOptions | None = None
    # the table's version the run read before this write (-1: no table yet; None: unknown): the connector
    # finds its commit's log entry from there on instead of reading the table's history
    base_version: int | None = None

    @property
    def target(self) -> str:
        return self.table or str(self.path)


def sql_literal(value: Any) -> str:
    """``value`` as a SQL string literal (dates in ISO form).

    >>> sql_literal("it's"), sql_literal(__import__("datetime").date(2026, 11, 29))
    ("'it''s'", "'2026-11-29'")
    """
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
    commit: CommitOptions = CommitOptions(),
) -> WritePlan:
    """What writing to ``config`` (or to ``path`` with its settings) does; pure, no Spark.

    ``connector``: whether the session has the Delta Spark connector
    (:func:`~pipeline.io.sources.has_delta_connector`); ``commit``: the run's transaction, keys and tally
    (:class:`CommitOptions`; ``tally_columns``: the deltalake writer's commit records the
    :class:`~pipeline.core.rows.KeyTally` of its files' keys). Raises :class:`SinkError`
    for what cannot be written: a catalog table or a remote URI without the connector, ``sink.writer:
    delta`` without it, an ``overwrite_partition`` without the partition's values.

    >>> p = plan_write(SinkConfig(path="s3://lake/scores"), partition_values={"ds": "2026-11-29"},
    ...                commit_metadata={"sbi.job": "j"}, connector=True, write_id="w1")
    >>> p.writer, p.format, p.mode, p.path, p.partition_by, p.options["replaceWhere"]
    ('delta', 'delta', 'overwrite', 's3://lake/scores', ('ds',), "ds = '2026-11-29'")

    ``commit.txn_app_id`` (the run key, :func:`pipeline.config.identity.run_key`) makes an append idempotent: the
    connector gets Delta's ``txnAppId``/``txnVersion`` options (it skips a write whose app id the table already
    holds), the deltalake writer records the same transaction and skips such an append itself:

    >>> p = plan_write(SinkConfig(path="s3://lake/scores", mode="append"), partition_values=None,
    ...                commit_metadata=None, connector=True, write_id="w1",
    ...                commit=CommitOptions(txn_app_id="sbi-run-1"))
    >>> p.options["txnAppId"], p.options["txnVersion"]  # a stream's micro-batch: the batch id as txn_version
    ('sbi-run-1', '0')

    ``commit.key_columns`` keys an append on its rows (``("id", "ds")``; an incremental run's
    ``("id", "content_hash", "task_fingerprint")``): only the keys the table lacks at commit time are
    written, so two overlapping runs write each key once. ``commit.read_version`` is the table version the
    run left out the keys it already held at (None: there was no table). The connector runs an
    insert-only ``MERGE``; the deltalake writer drops the keys committed since that version and
    commits with a conflict token (:mod:`pipeline.io.delta.keys`):

    >>> p = plan_write(SinkConfig(path="s3://lake/scores", mode="append"), partition_values={"ds": "2026-11-29"},
    ...                commit_metadata=None, connector=True, write_id="w1",
    ...                commit=CommitOptions(key_columns=("id", "ds")))
    >>> p.key_columns, dict(p.key_scope), "txnAppId" in p.options
    (('id', 'ds'), {'ds': '2026-11-29'}, False)

    The deltalake writer's plan is typed, and its options are that object's strings:
    >>> p = plan_write(SinkConfig(path="/data/scores", mode="append"), partition_values=None,
    ...                commit_metadata=None, connector=False, write_id="w1",
    ...                commit=CommitOptions(txn_app_id="sbi-run-1"))
    >>> p.lake.txn_app_id, p.lake.require_marker, p.options == p.lake.to_options()
    ('sbi-run-1', True, True)
    """
    keyed = tuple(commit.key_columns) if config.mode == "append" else ()
    writer = choose_writer(config, connector=connector)
    table, location = target_location(config, path, writer)
    replace = dict(partition_values or {}) if config.mode == "overwrite_partition" else {}
    if config.mode == "overwrite_partition":
        missing = [c for c in config.partition_by if c not in replace]
        if missing:
            raise SinkError(f"mode overwrite_partition needs a value for partition column(s) {missing}")
    write_id = write_id or uuid.uuid4().hex
    metadata = {**(commit_metadata or {}), WRITE_ID_KEY: write_id}
    mode: Literal["append", "overwrite"] = "append" if config.mode == "append" else "overwrite"
    if writer == "delta":
        plan = _connector_plan(config, mode=mode, metadata=metadata, commit=commit, keyed=keyed, replace=replace,
                               partition_values=partition_values, table=table, location=location,
                               write_id=write_id, faults=faults)
        return dataclasses.replace(plan, base_version=commit.base_version)
    lake = DeltaLakeOptions(
        path=str(location), write_id=write_id, partition_by=tuple(config.partition_by), commit_metadata=metadata,
        faults=dict(faults or {}), require_marker=True, leftover_grace_s=config.leftover_grace_s,
        txn_app_id=commit.txn_app_id, txn_version=commit.txn_version, replace_where=replace, key_columns=keyed,
        read_version=commit.read_version if keyed else None, tally_columns=tuple(commit.tally_columns),
    )
    return WritePlan("deltalake", FORMAT_NAME, mode, lake.to_options(), tuple(config.partition_by), None, location,
                     write_id, lake=lake)


def _connector_plan(config: SinkConfig, *, mode: Literal["append", "overwrite"], metadata: Mapping[str, Any],
                    commit: CommitOptions, keyed: tuple[str, ...], replace: dict[str, Any],
                    partition_values: Mapping[str, Any] | None, table: str | None, location: str | None,
                    write_id: str, faults: Mapping[str, Any] | None) -> WritePlan:
    """:func:`plan_write` for the Delta connector: its write options, or a keyed MERGE's."""
    txn_app_id = commit.txn_app_id
    if txn_app_id:  # the history names the logical run for both writers (committed_run reads it)
        metadata = {**metadata, APP_ID_KEY: txn_app_id}
    # a column this version adds (task_fingerprint, say) joins an older table, and a column someone else added
    # stays, whole-table overwrites included (pipeline.io.delta.schema), as with the deltalake writer
    options = {"userMetadata": json.dumps(dict(metadata), default=str), "mergeSchema": "true"}
    if txn_app_id and mode == "append" and not keyed:
        # overwrites stay clean replaces (as with the deltalake writer), so a deliberate rerun still replaces
        options.update(txnAppId=txn_app_id, txnVersion=str(commit.txn_version))
    if replace:
        options["replaceWhere"] = " AND ".join(f"{c} = {sql_literal(v)}" for c, v in replace.items())
    scope = {c: v for c, v in (partition_values or {}).items() if c in keyed}
    return WritePlan("delta", "delta", mode, options, tuple(config.partition_by), table, location, write_id,
                     keyed, scope, dict(faults or {}))
