"""What the fallback readers and writers refuse, and how to put the Delta connector on a session.

Which locations are local is :mod:`pipeline.core.locations`. The deltalake-backed fallbacks (the
``sbi_delta`` writer, the Delta snapshot reader) run Python file I/O on the driver and executors,
so they take local (or mounted) paths, and S3 through delta-rs and pyarrow (``pipeline.io.stores``);
for anything else they refuse before any work and name the Delta connector. Pure functions (no
pyspark import); the check that asks the session is :func:`pipeline.io.preflight.check_locations`.
"""

from __future__ import annotations

from pipeline.core.locations import uri_scheme
from pipeline.core.sessions import delta_package

__all__ = ["DELTA_CONNECTOR_CONFS", "connector_hint", "remote_refusal"]

DELTA_CONNECTOR_CONFS = (
    "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
)


def connector_hint() -> str:
    """How to put the Delta connector on a session, for error messages."""
    package = delta_package()
    if package is None:
        from pipeline.core.compat import DELTA_CONNECTOR_LINES, DELTA_VERSION, installed_pyspark

        lines = ", ".join(f"{a}.{b}" for a, b in sorted(DELTA_CONNECTOR_LINES))
        return (f"no Delta connector release is built for Spark {installed_pyspark()} yet (Delta {DELTA_VERSION}: "
                f"Spark {lines}); use one of those Spark lines for the connector")
    confs = " ".join(f"--conf {c}" for c in DELTA_CONNECTOR_CONFS)
    return f"spark-submit --packages {package} {confs}"


def remote_refusal(location: str, *, what: str, key: str) -> str:
    """The error text for a remote ``location`` that only the Delta connector can handle."""
    return (
        f"{key} {location!r} is a {uri_scheme(location)}: URI, but this session has no Delta Spark connector and "
        f"the deltalake-backed {what} handles local or mounted paths and S3 (s3://, s3a://) only (it would not "
        f"reach this store). Run with the connector ({connector_hint()}; on Databricks it is built in), or set "
        f"{key} to a local path, a file: URI or an S3 location."
    )

