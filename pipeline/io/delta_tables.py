"""What a committed Delta table says after the fact: whether a run's rows are still the latest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.io.sources import has_delta_connector, latest_version, read_delta

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["replaced_by"]


def replaced_by(spark: "SparkSession", path: str, *, run_id: str, partition: dict[str, Any],
                version: int) -> str | None:
    """None while the latest snapshot of ``path`` still holds rows of ``run_id``; else who replaced them.

    Called after this run's own commit (``version``) checked out: a concurrent
    run that overwrote the same partition later leaves a table without this
    run's rows, which is not a loss but a replacement, e.g.
    ``"replaced by run b7 (version 3)"``.
    """
    from pyspark.sql import functions as F

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


def _latest_version(spark: "SparkSession", path: str) -> int | None:
    try:
        if has_delta_connector(spark):
            return latest_version(spark, path)
        from pipeline.io.stores import open_table

        return open_table(path).version()
    except Exception:  # noqa: BLE001 - the version is informative only
        return None
