"""What a committed Delta table says after the fact: whether a run's rows are still the latest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.io.sources import has_delta_connector, latest_version, read_delta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["log_rows", "replaced_by", "rows_held"]


def replaced_by(spark: "SparkSession", path: str, *, run_id: str, partition: dict[str, Any],
                version: int) -> str | None:
    """None while the latest snapshot of ``path`` still holds rows of ``run_id``; else who replaced them.

    Called after this run's own commit (``version``) checked out: a concurrent
    run that overwrote the same partition later leaves a table without this
    run's rows, which is not a loss but a replacement, e.g.
    ``"replaced by run b7 (version 3)"``.
    """
    from pyspark.sql import functions as F

    if _nothing_after(path, version):
        return None  # no commit after this run's (its log has no next entry): its rows are the latest
    now = _latest_version(spark, path)
    if now is not None and now == version:
        return None  # nothing committed since this run: its rows are the latest
    latest = read_delta(spark, path)
    for column, value in partition.items():
        latest = latest.where(F.col(column) == F.lit(value).cast(latest.schema[column].dataType))
    if latest.where(F.col("run_id") == F.lit(run_id)).limit(1).count():
        return None
    others = [r[0] for r in latest.select("run_id").distinct().limit(3).collect()]
    at = f" (version {now})" if now is not None and now != version else ""
    if not others:
        return f"removed from the table after version {version}{at}"
    return f"replaced by run {', '.join(str(o) for o in others)}{at}"


def log_rows(table: Any, partition: dict[str, Any] | None = None) -> int | None:
    """The rows of a ``deltalake.DeltaTable`` (in ``partition``) by its log's per-file counts; None when a
    file's count is missing (a writer that records no statistics)."""
    import pyarrow as pa

    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    wanted = {f"partition.{c}": str(v) for c, v in (partition or {}).items()}
    files = [a for a in adds if all(str(a.get(k)) == v for k, v in wanted.items())]
    if any(a.get("num_records") is None for a in files):
        return None
    return int(sum(a["num_records"] for a in files))


def _nothing_after(path: str, version: int) -> bool:
    """Whether the log of the table at ``path`` (where deltalake reads it) has no entry after ``version``: one
    file looked up, whatever the table's size. False when it cannot tell."""
    from pipeline.io.delta.log import entry_name
    from pipeline.io.delta.state import log_reachable
    from pipeline.io.stores import table_store

    if not log_reachable(path):
        return False
    try:
        return not table_store(path).exists(entry_name(int(version) + 1))
    except Exception:  # noqa: BLE001 - unknown: the caller asks the table
        return False


def _latest_version(spark: "SparkSession", path: str) -> int | None:
    try:
        if has_delta_connector(spark):
            return latest_version(spark, path)
        from pipeline.io.stores import open_table

        return open_table(path).version()
    except Exception:  # noqa: BLE001 - the version is informative only
        return None


def rows_held(spark: "SparkSession", *, path: str | None, table: str | None,
              partition: dict[str, Any] | None) -> int:
    """How many rows the output holds now (in ``partition``, or in all), 0 when there is no table yet.

    From the Delta log's per-file row counts where deltalake reads the table; else a Spark count.
    """
    from pyspark.sql import functions as F

    from pipeline.io.stores import is_table, open_table, reachable

    if path and not table and not has_delta_connector(spark):
        if not (reachable(path) and is_table(path)):
            return 0
        counted = log_rows(open_table(path), partition)
        if counted is not None:
            return counted
    try:
        frame = spark.table(table) if table else read_delta(spark, path)
    except Exception:  # noqa: BLE001 - no table yet: nothing to shrink
        return 0
    for column, value in (partition or {}).items():
        frame = frame.where(F.col(column) == F.lit(value).cast(frame.schema[column].dataType))
    return frame.count()
