"""Write results to Delta: the Delta Spark connector when present, else the deltalake-backed source.

Either way one job makes one Delta commit, and ``overwrite_partition``
replaces only the run's partition (a rerun of the same day replaces its rows).

A write made for a run carries a Delta transaction id derived from the
LOGICAL run (its run key, :func:`pipeline.config.identity.run_key`): an append of a run that already committed
(its driver died after the commit, and the scheduler retried it) adds nothing.

What a write does is decided apart from doing it: :func:`~pipeline.io.delta.plan.plan_write` is pure
(no Spark) and returns a :class:`~pipeline.io.delta.plan.WritePlan` (writer, format, save mode,
options such as ``replaceWhere`` and ``userMetadata``, partitioning, table or
path); :func:`execute_write` carries a plan out. Where a write goes is
:mod:`pipeline.io.delta.target`; the connector's write :mod:`pipeline.io.delta.connector`; which commit a
write made :mod:`pipeline.io.delta.history`. Both writers run in the tests
(the connector from the jars ``make jars`` caches; see ``docs/object_stores.md``
for what the connector path does differently). Paths are URIs: a path with a
scheme reaches the connector untouched; the deltalake writer handles local or
mounted paths and ``s3://``/``s3a://`` (delta-rs's own object store, settings from
the environment: :mod:`pipeline.io.stores`) and refuses any other scheme before any work.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import nullcontext, suppress
from typing import TYPE_CHECKING, Any, Mapping

from pipeline.config import SinkConfig
from pipeline.errors import SinkError
from pipeline.io.delta.connector import write_with_connector
from pipeline.io.delta.history import commit_entry, committed_run, deltalake_version
from pipeline.io.delta.plan import CommitOptions, WritePlan, WriteResult, plan_write
from pipeline.io.delta.stragglers import WriteJobs, take_back_after_failure
from pipeline.io.sources import has_delta_connector
from pipeline.io.stores import table_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["execute_write", "write_sink"]


def execute_write(df: "DataFrame", plan: WritePlan) -> WriteResult:
    """Carry out ``plan`` on ``df``: one Delta commit; returns where, which writer and the version made."""
    if plan.writer == "delta":
        return write_with_connector(df, plan)
    return _write_with_deltalake(df, plan)


def _write_with_deltalake(df: "DataFrame", plan: WritePlan) -> WriteResult:
    """A ``deltalake`` plan through the ``sbi_delta`` data source, under the running marker a sweep reads."""
    from pipeline.core.error_text import error_line
    from pipeline.io.delta import markers
    from pipeline.io.delta.datasource import DeltaLakeDataSource, write_from_driver

    lake = plan.lake
    if lake is None:
        raise ValueError(f"a deltalake write plan carries its DeltaLakeOptions (plan_write makes it): {plan!r}")
    path = str(plan.path)
    store = table_store(path)
    if not store.remote:
        _check_writable(path)
    if not plan.in_driver:
        _register_once(df.sparkSession, DeltaLakeDataSource)
    # the version the marker names is the one the run read (a keyed append's), not looked up again
    marker = (markers.running_marker(store, plan.write_id, table_version=lake.read_version,
                                     heartbeat_s=min(30.0, lake.leftover_grace_s / 4))
              if lake.require_marker else nullcontext())
    # the S3 settings travel with the write, not the plan (under the key Spark redacts)
    options = lake.with_storage(store.options if store.remote else None).to_options()
    jobs = None if plan.in_driver else WriteJobs(df.sparkSession)
    try:
        with marker:
            if plan.in_driver:
                write_from_driver(df, options, overwrite=plan.mode == "overwrite")
            else:
                df.write.format(plan.format).mode(plan.mode).options(**options).save()
    except Exception as exc:  # noqa: BLE001
        if jobs is not None:  # a task killed late may have left a file after the abort deleted the others
            with suppress(Exception):  # the write's own error is the one to report; a sweep retries this
                take_back_after_failure(jobs, store, plan.write_id)
        raise SinkError(f"writing Delta table {plan.target} failed: {error_line(exc)}") from exc
    facts = markers.finished_facts(store, plan.write_id)
    swept = dict(facts.get("swept") or {})
    if facts.get("already_committed"):
        found = committed_run(path, lake.txn_app_id or "")
        return WriteResult(plan.target, plan.writer, found[0] if found else None, plan.write_id,
                           already_committed=True, swept=swept)
    # the commit's own log entry, from the version it read the table at: what it added, and its version
    entry = commit_entry(store, plan.write_id, after=facts["base_version"]) if "base_version" in facts else None
    if entry is None:
        return WriteResult(plan.target, plan.writer, deltalake_version(path, plan.write_id), plan.write_id,
                           swept=swept, overlapped=int(facts.get("overlap_rows") or 0))
    return WriteResult(plan.target, plan.writer, entry.version, plan.write_id, swept=swept,
                       overlapped=int(facts.get("overlap_rows") or 0), rows_added=entry.rows_added,
                       keys_added=entry.keys_added)


def write_sink(
    df: "DataFrame",
    config: SinkConfig,
    *,
    partition_values: Mapping[str, Any] | None = None,
    commit_metadata: Mapping[str, Any] | None = None,
    faults: Mapping[str, Any] | None = None,
    path: str | None = None,
    commit: CommitOptions = CommitOptions(),
    in_driver: bool = False,
) -> WriteResult:
    """Write ``df`` as configured; returns where, with which writer, and the Delta version made.

    ``partition_values`` names the partition this run writes (e.g. ``{"ds": date}``);
    with ``mode: overwrite_partition`` exactly that partition is replaced.
    ``path`` writes to another folder with the same settings (the quarantine table).
    ``commit``: the run's transaction, keys and tally (:class:`~pipeline.io.delta.plan.CommitOptions`, handed
    to :func:`~pipeline.io.delta.plan.plan_write` as it is). With ``commit.txn_app_id`` (the run key,
    :func:`pipeline.config.identity.run_key`) an append of a run the table already holds adds nothing and returns
    ``already_committed``; with ``commit.key_columns`` an append is keyed, and ``overlapped`` in the result
    counts the rows another run wrote first; with ``commit.tally_columns`` (id, content hash) the deltalake
    writer tallies the keys it writes (``keys_added`` in the result).
    ``in_driver``: the deltalake writer writes and commits from this process (a small job's few rows,
    :func:`pipeline.io.delta.datasource.write_from_driver`); the connector ignores it.
    """
    plan = plan_write(config, partition_values=partition_values, commit_metadata=commit_metadata, path=path,
                      connector=has_delta_connector(df.sparkSession), faults=faults, commit=commit)
    if in_driver and plan.writer == "deltalake":
        plan = dataclasses.replace(plan, in_driver=True)
    return execute_write(df, plan)


def _register_once(spark: Any, source: type) -> None:
    """Register the data source once per session (:func:`pipeline.core.sessions.register_data_source`)."""
    from pipeline.core.sessions import register_data_source

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
