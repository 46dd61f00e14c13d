"""Where a write goes, resolved once: which writer (the Delta Spark connector or the deltalake-backed
data source) and which catalog table or location, refused before any work when this session cannot write it.

Paths are URIs: a path with a scheme reaches the connector untouched; the deltalake writer handles
local or mounted paths and ``s3://``/``s3a://`` (delta-rs's own object store, settings from the
environment: :mod:`pipeline.io.stores`) and refuses any other scheme.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pipeline.config import SinkConfig
from pipeline.errors import SinkError
from pipeline.io.paths import connector_hint, remote_refusal
from pipeline.io.sources import has_delta_connector
from pipeline.io.stores import StoreError, storage_options
from pipeline.core.locations import Location

__all__ = ["Writer", "check_folder", "check_sink", "choose_writer", "resolve_writer", "target_location"]

Writer = Literal["delta", "deltalake"]


def choose_writer(config: SinkConfig, *, connector: bool) -> Writer:
    """The writer ``sink.writer`` asks for on a session with (``connector``) or without the Delta connector."""
    if config.writer == "delta" and not connector:
        raise SinkError(
            "sink.writer is 'delta' but the Delta Spark connector is not on this session; add it "
            f"({connector_hint()}), or set sink.writer: auto"
        )
    if config.writer != "auto":
        return config.writer
    return "delta" if connector else "deltalake"


def target_location(config: SinkConfig, path: "str | Location | None", writer: Writer) -> tuple[str | None, str | None]:
    """``(table, path)`` the writer gets; refuses what the deltalake writer cannot reach."""
    table = None if path else config.table
    key = "sink.quarantine_path" if path else "sink.path"
    if table:
        if writer == "delta":
            return table, None
        raise SinkError(
            f"sink.table {config.table!r} needs the Delta Spark connector (catalog tables; "
            f"{connector_hint()}); without it set sink.path to a folder instead"
        )
    location = Location.of(path) if path else config.location
    assert location is not None  # the sink's validation: a path or a table
    if writer == "delta":
        return None, location.spark
    if location.object_store:
        try:
            storage_options(location)  # an unsafe commit setting is refused before any work
        except StoreError as exc:
            raise SinkError(f"{key}: {exc}") from None
        return None, location.raw
    if not location.local:
        raise SinkError(remote_refusal(location.raw, what="Delta writer", key=key))
    return None, location.path


def check_sink(config: SinkConfig, *, connector: bool) -> None:
    """Refuse, before any work, an output or quarantine table this session cannot write."""
    writer = choose_writer(config, connector=connector)
    target_location(config, None, writer)
    if config.table and not config.quarantine_path:
        raise SinkError(
            f"sink.table {config.table!r} needs sink.quarantine_path (where rows whose scoring failed go)"
        )
    quarantine = config.quarantine_location
    target_location(config, quarantine, writer)
    for key, location in (("sink.path", config.location), ("sink.quarantine_path", quarantine)):
        if location and location.local:
            check_folder(location, key=key)


def check_folder(location: "str | Location", *, key: str) -> None:
    """Refuse a local table location that is a file, or lies below one: every writer would fail there
    late, with the file system's ``Not a directory``. The file is never touched."""
    loc = Location.of(location)
    location = loc.raw
    path = Path(loc.path or "")
    what = ("a Delta table is a folder (its _delta_log and Parquet files): point it at a folder (a missing one is "
            "created), or move the file away")
    if path.exists() and not path.is_dir():
        raise SinkError(f"{key} {location!r} is a file, not a folder; {what}")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise SinkError(f"{key} {location!r} is inside {str(above)!r}, a file; {what}")


def resolve_writer(spark: Any, config: SinkConfig) -> str:
    """``delta`` (the connector) or ``deltalake`` (the Python data source), per ``sink.writer``."""
    return choose_writer(config, connector=has_delta_connector(spark))
