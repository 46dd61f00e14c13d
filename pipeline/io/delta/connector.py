"""Writing through the Delta Spark connector (``df.write.format("delta")``): a save, or a keyed append's
insert-only ``MERGE`` with its retries, and a failure told in the words the deltalake writer uses.

Both writers run in the tests (the connector from the jars ``make jars`` caches; see
``docs/object_stores.md`` for what the connector path does differently). The connector's write has
no ``write()`` of ours, so the fault drills of :mod:`pipeline.core.faults` fire in a pass-through stage
inside its write tasks and right before its ``save``/``MERGE`` on the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pipeline.errors import SinkError, lost_commit_message
from pipeline.io.delta.history import connector_commit, connector_commits, connector_version
from pipeline.io.delta.options import APP_ID_KEY, WRITE_ID_KEY
from pipeline.io.delta.plan import WritePlan, WriteResult, sql_literal

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["plain_string_types", "write_with_connector"]

# Delta's error classes for a commit that lost to a concurrent one whose files it should have read
_CONCURRENT = ("ConcurrentAppend", "DELTA_CONCURRENT_APPEND", "ConcurrentWrite", "DELTA_CONCURRENT_WRITE",
               "ConcurrentTransaction", "DELTA_CONCURRENT_TRANSACTION", "ProtocolChanged", "DELTA_PROTOCOL_CHANGED")
_MERGE_ATTEMPTS = 5
# task-side write drills: the connector's write has no write() of ours, so its rows pass through one
_CONNECTOR_WRITE_DRILLS = ("exit_write_partitions", "fail_write_partitions", "stall_write")
# the connector's error classes that mean what the deltalake writer says in its own words
_CONNECTOR_ERRORS = {
    "DELTA_REPLACE_WHERE_MISMATCH": "rows outside the replaced partition ({where}) were written; every row must "
                                    "belong to the replaced partition",
}


def write_with_connector(df: "DataFrame", plan: WritePlan) -> WriteResult:
    """Carry out a ``delta`` ``plan`` on ``df``: one Delta commit (a keyed plan: a MERGE); returns the version made."""
    spark = df.sparkSession
    if plan.key_columns:
        return _merge_keyed(df, plan)
    w = _connector_source(df, plan).write.format(plan.format).mode(plan.mode).options(**plan.options)
    if plan.partition_by:
        w = w.partitionBy(*plan.partition_by)
    try:
        _before_connector_commit(plan)
        w.saveAsTable(plan.table) if plan.table else w.save(plan.path)
    except Exception as exc:  # noqa: BLE001
        raise SinkError(_connector_failure(spark, plan, exc)) from exc
    committed = _found_commit(spark, plan)
    app_id = plan.options.get("txnAppId")
    if committed is None and app_id:
        # Delta skipped the write: the table already holds this transaction (an earlier try committed)
        found = connector_version(spark, plan.table, plan.target, APP_ID_KEY, app_id)
        return WriteResult(plan.target, plan.writer, found, plan.write_id, already_committed=True)
    version, rows, _ = committed if committed else (None, None, {})
    return WriteResult(plan.target, plan.writer, version, plan.write_id, rows_added=rows)


def _found_commit(spark: Any, plan: WritePlan, *, rows_metric: str = "numOutputRows") -> tuple[int, int | None,
                                                                                                  dict[str, Any]] | None:
    """``(version, rows it added, its operation metrics)`` of this write's commit: from its own log entry, looked
    up from the version the run read (where deltalake reads the log: one file, no Spark job), else from one
    bounded read of the table's history through the connector. None when no commit carries the write's id."""
    from pipeline.io.delta.history import commit_entry
    from pipeline.io.delta.state import log_reachable
    from pipeline.io.stores import table_store

    if plan.base_version is not None and not plan.table and log_reachable(plan.path):
        entry = commit_entry(table_store(str(plan.path)), plan.write_id,
                             after=None if plan.base_version < 0 else plan.base_version)
        if entry is not None:
            return entry.version, entry.rows_added, dict(entry.metrics or {})
    found = connector_commit(spark, plan.table, plan.target, WRITE_ID_KEY, plan.write_id)
    if found is None:
        return None
    return found[0], _metric(found[1], rows_metric), dict(found[1])


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
            created = _found_commit(spark, plan)
            version, rows, _ = created if created else (None, None, {})
            return WriteResult(plan.target, plan.writer, version, plan.write_id, rows_added=rows)
        except Exception as exc:  # noqa: BLE001 - another run created it meanwhile: merge into it
            if not _connector_table_exists(spark, name):
                raise SinkError(_connector_failure(spark, plan, exc)) from exc
    on = " AND ".join([f"t.`{c}` <=> s.`{c}`" for c in plan.key_columns]
                      + [f"t.`{c}` = {sql_literal(v)}" for c, v in plan.key_scope.items()])
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
    found = _found_commit(spark, plan, rows_metric="numTargetRowsInserted")
    version, rows, metrics = found if found else (None, None, {})
    return WriteResult(plan.target, plan.writer, version, plan.write_id, overlapped=_merge_left_out(metrics),
                       rows_added=rows)


def _connector_source(df: "DataFrame", plan: WritePlan) -> "DataFrame":
    """``df`` as the connector writes it (:func:`plain_string_types`). Under a write drill
    (``exit_write_partitions``, ``fail_write_partitions``, ``stall_write``) its rows first pass through
    :func:`_drill_write_stage` inside the write's own tasks, so the drill fires in the connector's write stage."""
    drills = {k: plan.faults[k] for k in _CONNECTOR_WRITE_DRILLS if plan.faults.get(k)}
    if drills:
        import functools

        df = df.mapInArrow(functools.partial(_drill_write_stage, drills=drills), df.schema)
    return plain_string_types(df)


def _drill_write_stage(batches: Any, *, drills: Mapping[str, Any]) -> Any:
    """The write stage's rows, unchanged, in slices of 8 rows; the drill (:func:`pipeline.core.faults.on_write`)
    fires once half of a task's first chunk has gone on to the connector.

    Rows leave the worker in writes of ``spark.buffer.size`` (64 KiB): what it still buffers dies with it.
    An unpartitioned write streams the rows it got into the file it has open, so a worker that dies there
    leaves a file of the failed attempt behind; a partitioned one sorts its rows first and has no file open yet.
    """
    from pyspark import TaskContext

    from pipeline.core import faults

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
        from pipeline.core import faults

        faults.on_commit(plan.write_id, plan.faults)


def _connector_table_exists(spark: Any, name: str) -> bool:
    try:
        spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()
        return True
    except Exception:  # noqa: BLE001 - no table there (or none readable)
        return False


def _metric(metrics: Mapping[str, Any], name: str) -> int | None:
    """An operation metric of a commit as an int (None when the commit info has none).

    >>> _metric({"numOutputRows": "12"}, "numOutputRows"), _metric({}, "numOutputRows")
    (12, None)
    """
    value = metrics.get(name)
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _merge_left_out(metrics: Mapping[str, Any]) -> int:
    """The source rows a MERGE did not insert because their key was there, from its operation metrics.

    >>> _merge_left_out({"numSourceRows": "12", "numTargetRowsInserted": "9"}), _merge_left_out({})
    (3, 0)
    """
    source = int(metrics.get("numSourceRows", 0) or 0)
    inserted = int(metrics.get("numTargetRowsInserted", source) or 0)
    return max(0, source - inserted)


def plain_string_types(df: "DataFrame") -> "DataFrame":
    """``df`` with its string-bearing columns cast to their own type, spelled plainly.

    On Spark Connect (4.2) the columns a ``mapInArrow`` returns carry an explicit default collation,
    which the connector records as ``"string collate UTF8_BINARY"`` in the table's schema: a type
    delta-rs (deltalake) and older readers refuse. A cast to ``string`` records ``"string"``; the
    values are unchanged (measured: ``tests/run/test_failures.py`` reads such tables with deltalake).
    """
    from pyspark.sql import functions as F

    columns = [F.col(f"`{name}`").cast(dtype).alias(name) if "string" in dtype else F.col(f"`{name}`")
               for name, dtype in df.dtypes]
    return df.select(*columns) if any("string" in dtype for _, dtype in df.dtypes) else df


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
    for version, meta, _ in connector_commits(spark, name, WRITE_ID_KEY, limit=5):
        if meta.get(WRITE_ID_KEY) != plan.write_id:
            run = meta.get("sbi.run_id")
            return f"run {run}, version {version}" if run else f"version {version}"
    return None


def _root_cause(exc: BaseException) -> str:
    """The Python error (``Class: message``) buried in a Spark exception, else its first real line."""
    from pipeline.core.error_text import error_line

    return error_line(exc)
