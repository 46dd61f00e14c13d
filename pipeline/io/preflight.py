"""Pre-flight: refuse a source or sink this session cannot reach before Spark reads or scores anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from pipeline.io.delta.target import check_sink
from pipeline.io.outputs import check_output
from pipeline.io.sources import check_source, has_delta_connector

if TYPE_CHECKING:
    from pipeline.config import SinkConfig, SourceConfig

__all__ = ["check_locations"]


def check_locations(spark: Any, *, source: "SourceConfig", sink: "SinkConfig",
                    files: Mapping[str, str | None] | None = None) -> None:
    """Refuse, before Spark reads or scores anything, a job's source or sink this session cannot reach, and
    any of ``files`` (``{setting: location}``: the summary, the report) that cannot be written.

    The runner calls this first: without it a remote sink would only be
    refused after the source was read and counted.
    """
    connector = has_delta_connector(spark)
    check_source(source, connector=connector)
    check_sink(sink, connector=connector)
    if not connector:  # the jar-free writer is a Python data source (pyspark.sql.datasource, Spark 4.0)
        from pipeline.core.compat import check_spark_feature

        check_spark_feature("the jar-free deltalake writer (sink.writer deltalake, or auto without the Delta "
                            "connector) is a Python data source, which", (4, 0), spark.version,
                            fix="run where the Delta connector is (Databricks, or spark-submit --packages)")
    for key, location in (files or {}).items():
        if location:
            check_output(location, key=key)
