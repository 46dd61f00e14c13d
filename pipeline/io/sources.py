"""Read the rows to score: Delta by path, catalog tables, Parquet, JSON-lines logs, text files.

Paths are URIs: a path with a scheme (``s3://``, ``abfss://``, ``dbfs:/``) goes to
Spark untouched; plain paths are made absolute. A Delta table is read through
the Delta Spark connector when the session has it (Databricks,
``--packages io.delta:delta-spark_4.2_2.13:4.4.0``); otherwise its current
snapshot's files are resolved with ``deltalake`` and read as Parquet by Spark.
That fallback refuses tables whose features it cannot honour (deletion
vectors, column mapping) instead of returning wrong rows. JSON lines, binary files and text
files have readers of their own (:mod:`pipeline.io.file_readers`).
"""

from __future__ import annotations

import contextvars
import os
import tempfile
import uuid
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from pipeline.config import DELTA_CONNECTOR_CONF, SourceConfig
from pipeline.errors import SourceError
from pipeline.core.rows import MALFORMED_COLUMN
from pipeline.io.file_readers import CORRUPT_RECORD_COLUMN, read_binary_files, read_json, read_text
from pipeline.io.paths import remote_refusal
from pipeline.io.stores import Where, is_table, open_table
from pipeline.core.locations import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SourceError", "check_source", "has_delta_connector", "is_delta_table", "pinned_versions", "read_delta",
    "read_source", "select_input",
]

# the versions the run in this context reads its Delta tables at, by resolved location (pinned_versions)
_PINNED: "contextvars.ContextVar[Mapping[str, int]]" = contextvars.ContextVar("sbi_pinned_versions", default={})


@contextmanager
def pinned_versions(versions: Mapping[str, int | None]) -> Iterator[None]:
    """Within the block, a read of one of these Delta tables (``{location: version}``) without a version reads
    that version, not the latest: a run reads each table at the version its plan read from the log, so what
    the log counted is what is scored. Pin only a table whose log ``deltalake`` read and can honour: a pinned
    table's files are read from that log, with the connector too (no Spark job to rebuild its snapshot).
    Per context (thread), so runs side by side in one process do not mix."""
    pinned = {Location.of(k).spark: int(v) for k, v in versions.items() if v is not None}
    token = _PINNED.set({**_PINNED.get(), **pinned})
    try:
        yield
    finally:
        _PINNED.reset(token)


_connector_cache: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def has_delta_connector(spark: "SparkSession") -> bool:
    """Whether ``format("delta")`` resolves in this session (Delta jars on the classpath).

    Asked through the DataFrame API only, so it answers on a classic and a Spark
    Connect session alike: analysing a read of a path that does not exist costs
    no job, and only a missing connector fails it with ``DATA_SOURCE_NOT_FOUND``.
    Databricks runtimes always have the connector, and a session this library built says whether it
    added the connector's jars (:data:`~pipeline.config.DELTA_CONNECTOR_CONF`). Cached per session.
    """
    if os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        return True
    try:
        return _connector_cache[spark]
    except (KeyError, TypeError):
        pass
    try:
        said = spark.conf.get(DELTA_CONNECTOR_CONF, None)
    except Exception:  # noqa: BLE001 - a managed session may refuse to read a setting: probe instead
        said = None
    if said in ("true", "false"):
        found = said == "true"
    else:
        probe = os.path.join(tempfile.gettempdir(), f"sbi-delta-probe-{uuid.uuid4().hex}")
        try:
            spark.read.format("delta").load(probe).schema  # noqa: B018 - analysis only
            found = True
        except Exception as exc:  # noqa: BLE001 - py4j, AnalysisException or a Connect error, by session kind
            found = "DATA_SOURCE_NOT_FOUND" not in str(exc)
    try:
        _connector_cache[spark] = found
    except TypeError:  # not weakly referenceable: ask again next time
        pass
    return found


def check_source(config: SourceConfig, *, connector: bool, location: Location | None = None) -> None:
    """Refuse, before any work, a source the readers of this session cannot honour.

    Without the Delta connector a ``delta`` source is read through deltalake,
    which reads local or mounted paths and S3 (``s3://``/``s3a://``): any other
    remote URI is refused with the connector to add. Parquet, JSON and text paths go to Spark untouched
    (Spark's file systems decide). ``location``: ``config.path`` parsed already.
    """
    if config.format != "delta" or connector or not config.path:
        return
    loc = location or Location.of(config.path)
    if not loc.reachable:
        raise SourceError(remote_refusal(loc.raw, what="Delta reader", key="source.path"))


def read_delta(spark: "SparkSession", path: Where, *, version: int | None = None) -> "DataFrame":
    """A Delta table's current snapshot (or the snapshot at ``version``) as a DataFrame.

    ``path`` is a local path or any URI: the connector gets it untouched; the
    deltalake fallback takes local paths, ``file:`` URIs and S3 URIs and refuses the rest.

    Either way the DataFrame is one snapshot, pinned when it is made: a connector read without
    ``versionAsOf`` would resolve the table's latest version again at every action, so a job that
    reads its own output (an incremental run's anti-join, evaluated again after its commit) would
    see its own new rows. No table at ``path`` raises :class:`SourceError`. Without ``version``, a table
    pinned for this context (:func:`pinned_versions`) is read at its pinned version, through deltalake.
    """
    loc = Location.of(path)
    pinned = version is None and loc.spark in _PINNED.get()
    if pinned:
        version = _PINNED.get()[loc.spark]
    if has_delta_connector(spark) and not pinned:
        if version is None:
            version = latest_version(spark, loc.spark)
            if version is None:
                raise SourceError(f"no Delta table at {loc}")
        return spark.read.format("delta").option("versionAsOf", int(version)).load(loc.spark)
    if not loc.reachable:
        raise SourceError(remote_refusal(loc.raw, what="Delta reader", key="path"))
    from pipeline.io.delta.reader import read_with_deltalake

    return read_with_deltalake(spark, loc, version=version)


def latest_version(spark: "SparkSession", location: str) -> int | None:
    """The latest version of the Delta table at ``location`` through the connector; None if there is none."""
    try:
        rows = spark.sql(f"DESCRIBE HISTORY delta.`{location}` LIMIT 1").select("version").collect()
    except Exception:  # noqa: BLE001 - not a Delta table (or unreachable)
        return None
    return int(rows[0]["version"]) if rows else None


def table_version(spark: "SparkSession", path: Where) -> int | None:
    """The current version of the Delta table at ``path`` for whichever reader the session uses;
    None when there is no table. Reading at this version then sees exactly that snapshot."""
    loc = Location.of(path)
    if has_delta_connector(spark):
        return latest_version(spark, loc.spark)
    if not loc.reachable:
        return None
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_table(loc).version()
    except TableNotFoundError:
        return None


def is_delta_table(spark: "SparkSession", path: Where) -> bool:
    """Whether ``path`` holds a Delta table; no local path is made from a URI.

    With the connector Spark answers (object stores included); without it
    deltalake looks at local paths and S3; another remote URI is never a table it can use.
    """
    loc = Location.of(path)
    if has_delta_connector(spark):
        try:
            spark.read.format("delta").load(loc.spark).schema  # noqa: B018 - analysis only
            return True
        except Exception:  # noqa: BLE001 - not a Delta table (or unreachable): nothing to append to
            return False
    if not loc.reachable:
        return False
    return is_table(loc)


def read_source(spark: "SparkSession", config: SourceConfig, *, location: Location | None = None) -> "DataFrame":
    """The configured source as a DataFrame, filtered and limited, not yet validated (``location``:
    ``config.path`` parsed already)."""
    fmt = config.format
    loc = location or (Location.of(config.path) if config.path else None)
    check_source(config, connector=fmt == "delta" and has_delta_connector(spark), location=loc)
    location = loc.spark if loc is not None else None
    try:
        if fmt == "delta":
            df = read_delta(spark, loc or str(config.path))
        elif fmt == "table":
            df = spark.read.table(str(config.table))
        elif fmt == "parquet":
            df = spark.read.parquet(location)
        elif fmt == "json":
            df = read_json(spark, location)
        elif fmt == "text":
            df = read_text(spark, location)
        elif fmt == "binary_file":
            df = read_binary_files(spark, location)
        else:  # pragma: no cover - config validation forbids it
            raise SourceError(f"unknown source.format {fmt!r}")
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - Spark raises many kinds; name the source in all of them
        where = config.table if fmt == "table" else config.path
        raise SourceError(f"could not read source {where!r} (format {fmt}): {_first_line(exc)}") from exc
    if config.where:
        df = df.where(config.where)
    if config.limit:
        df = df.limit(config.limit)
    if config.repartition:
        df = df.repartition(config.repartition)
    return df


def select_input(df: "DataFrame", config: SourceConfig, input_columns: tuple[str, ...]) -> "DataFrame":
    """Check the configured columns exist and project to ``id``, the task inputs and kept columns.

    The task sees its inputs under canonical names (``text`` for text tasks);
    the id column is carried as ``id``. A source read with a corrupt-record
    column (JSON lines, :func:`~pipeline.io.file_readers.read_json`) also carries it as ``_malformed``:
    the raw text of a line that did not parse, null on every good row.
    """
    from pyspark.sql import functions as F

    available = df.columns
    wanted = {"id": config.id_column}
    if input_columns == ("text",):
        wanted["text"] = config.text_column
    else:
        wanted.update({c: c for c in input_columns})
    missing = [src for src in [*wanted.values(), *config.keep_columns] if src not in available]
    if missing:
        raise SourceError(
            f"source is missing column(s) {missing}; it has {available}. "
            "Set source.id_column / source.text_column / source.keep_columns to existing columns."
        )
    clash = [c for c in config.keep_columns if c in wanted]
    if clash:
        raise SourceError(f"source.keep_columns {clash} clash with the input columns {sorted(wanted)}; rename them")
    cols = [F.col(src).alias(dst) for dst, src in wanted.items()]
    if "text" in wanted:
        text_type = df.schema[config.text_column].dataType.typeName()
        if text_type not in ("string", "binary"):
            raise SourceError(
                f"source.text_column {config.text_column!r} has type {text_type}; it must be a string column"
            )
        # binary text stays binary here: the task decodes it leniently (invalid UTF-8 -> U+FFFD)
    if CORRUPT_RECORD_COLUMN in available and CORRUPT_RECORD_COLUMN not in [*wanted.values(), *config.keep_columns]:
        cols.append(F.col(CORRUPT_RECORD_COLUMN).alias(MALFORMED_COLUMN))
    return df.select(*cols, *[F.col(c) for c in config.keep_columns])


def _first_line(exc: BaseException) -> Any:
    """The first informative line of a Spark error (py4j puts "An error occurred while calling ..." first)."""
    lines = [line.strip(" :") for line in str(exc).strip().splitlines() if line.strip(" :")]
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        return lines[1]
    return lines[0] if lines else type(exc).__name__
