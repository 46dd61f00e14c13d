"""Table locations are URIs: what is local, what is remote, and what the fallback readers/writers refuse.

A location with a URI scheme (``s3://``, ``s3a://``, ``abfss://``, ``gs://``,
``dbfs:/`` ...) is handed to Spark (or the Delta connector) exactly as written:
turning ``s3://lake/scores`` into an absolute local path would write a folder
named ``s3:`` and report success. Plain paths and ``file:`` URIs are local.

The deltalake-backed fallbacks (the ``sbi_delta`` writer, the Delta snapshot
reader) run Python file I/O on the driver and executors, so they take local
(or mounted) paths, and S3 through delta-rs and pyarrow (``pipeline.io.stores``);
for anything else they refuse before any work and name the Delta connector. Pure functions (no pyspark import); the check that
asks the session is :func:`pipeline.io.preflight.check_locations`.

>>> uri_scheme("s3://lake/scores"), uri_scheme("dbfs:/mnt/x"), uri_scheme("/data/x"), uri_scheme("C:\\\\data")
('s3', 'dbfs', None, None)
>>> is_local("file:///data/scores"), is_local("warehouse/scores"), is_local("abfss://c@a.dfs.core.windows.net/t")
(True, True, False)
>>> local_path("file:///data/My%20Scores")
'/data/My Scores'
"""

from __future__ import annotations

import os
import re

__all__ = [
    "DELTA_CONNECTOR_CONFS", "connector_hint", "delta_package", "is_local", "local_path",
    "remote_refusal", "resolve_location", "uri_scheme",
]

# RFC 3986 scheme; two letters at least, so a Windows drive ("C:\\data") is not a scheme.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")

DELTA_CONNECTOR_CONFS = (
    "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
)
# What delta-spark's configure_spark_with_delta_pip builds for the pinned pyspark / delta-spark.
_DEFAULT_PACKAGE = "io.delta:delta-spark_4.2_2.13:4.4.0"


def uri_scheme(location: str) -> str | None:
    """The lower-cased URI scheme of ``location``, or None for a plain path."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None


def is_local(location: str) -> bool:
    """Whether ``location`` is on the local (or a mounted) file system: a plain path or a ``file:`` URI."""
    return uri_scheme(location) in (None, "file")


def local_path(location: str) -> str:
    """The absolute local path of a plain path or a ``file:`` URI (``file:/x``, ``file:///x``).

    Raises ValueError for a remote URI: callers check :func:`is_local` first.
    """
    from urllib.parse import unquote, urlparse

    scheme = uri_scheme(location)
    if scheme is None:
        return os.path.abspath(location)
    if scheme != "file":
        raise ValueError(f"{location!r} is not a local path (scheme {scheme!r})")
    parsed = urlparse(location)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{location!r} names host {parsed.netloc!r}; a file: URI must be file:/path or file:///path")
    return os.path.abspath(unquote(parsed.path))


def resolve_location(location: str) -> str:
    """What to hand Spark: a plain path made absolute (executors may run elsewhere), any URI untouched."""
    return os.path.abspath(location) if uri_scheme(location) is None else location


def delta_package() -> str:
    """The Maven coordinate of the Delta connector matching the installed pyspark and delta-spark."""
    try:
        from importlib.metadata import version

        spark_mm = ".".join(version("pyspark").split(".")[:2])
        return f"io.delta:delta-spark_{spark_mm}_2.13:{version('delta-spark')}"
    except Exception:  # noqa: BLE001 - not installed: the versions the lock pins
        return _DEFAULT_PACKAGE


def connector_hint() -> str:
    """How to put the Delta connector on a session, for error messages."""
    confs = " ".join(f"--conf {c}" for c in DELTA_CONNECTOR_CONFS)
    return f"spark-submit --packages {delta_package()} {confs}"


def remote_refusal(location: str, *, what: str, key: str) -> str:
    """The error text for a remote ``location`` that only the Delta connector can handle."""
    return (
        f"{key} {location!r} is a {uri_scheme(location)}: URI, but this session has no Delta Spark connector and "
        f"the deltalake-backed {what} handles local or mounted paths and S3 (s3://, s3a://) only (it would not "
        f"reach this store). Run with the connector ({connector_hint()}; on Databricks it is built in), or set "
        f"{key} to a local path, a file: URI or an S3 location."
    )

