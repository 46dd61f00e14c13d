"""Pre-flight: refuse a source or sink this session cannot reach before Spark reads or scores anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.io.delta.target import check_sink
from pipeline.io.sources import check_source, has_delta_connector

if TYPE_CHECKING:
    from pipeline.config import SinkConfig, SourceConfig

__all__ = ["check_locations"]


def check_locations(spark: Any, *, source: "SourceConfig", sink: "SinkConfig") -> None:
    """Refuse, before Spark reads or scores anything, a job's source or sink this session cannot reach.

    The runner calls this first: without it a remote sink would only be
    refused after the source was read and counted.
    """
    connector = has_delta_connector(spark)
    check_source(source, connector=connector)
    check_sink(sink, connector=connector)
