"""What this library runs on: the Spark lines it supports, the features that need a newer one, the Delta
connector built for each line, and the versions every run records.

pyspark is the platform's (Databricks, EMR, a cluster's own Spark), never a dependency of the wheel, so the
library checks the Spark it finds instead: when a session is built or handed in (:func:`check_spark`), with a
message that names the version found, the supported range and what to do. The classic session's Spark is the
installed pyspark; a Spark Connect session's is the server's (``spark.version``), checked as well.

>>> spark_line("4.0.1"), spark_line("4.1.0.dev0"), spark_line("3.5.2-databricks")
((4, 0), (4, 1), (3, 5))
>>> supported("4.0.0"), supported("4.3.1"), supported("3.5.6"), supported("4.4.0")
(True, True, False, False)
>>> delta_connector_package("4.2.0", delta_spark=None)
'io.delta:delta-spark_4.2_2.13:4.4.0'
>>> delta_connector_package("4.0.1", delta_spark="4.0.1")
'io.delta:delta-spark_2.13:4.0.1'
>>> delta_connector_package("4.3.0", delta_spark=None) is None  # no Delta release is built for Spark 4.3 yet
True
"""

from __future__ import annotations

import os
import platform
import re
from typing import Any

from pipeline.errors import UnsupportedSparkError

__all__ = ["ALLOW_UNSUPPORTED_ENV", "DELTA_CONNECTOR_LINES", "DELTA_VERSION", "SUPPORTED_SPARK", "SUPPORTED_TEXT",
           "ARROW_UDF_SINCE", "COLUMN_FUNCTION_ENV", "STREAM_READ_LIMITS_SINCE", "arrow_column_function", "check_spark",
           "check_spark_feature", "delta_connector_package", "installed_pyspark", "library_version", "runtime_versions",
           "session_spark", "spark_line", "supported"]

# The first and the last supported Spark line; CI installs the built wheel beside both (make test-wheel).
SUPPORTED_SPARK = ((4, 0), (4, 3))
SUPPORTED_TEXT = "4.0 to 4.3"
# The Delta release whose connector is built for each Spark line (io.delta:delta-spark_<line>_2.13 on Maven
# Central); Spark 4.3 has none yet, so there the jar-free deltalake writer runs (sink.writer auto).
DELTA_VERSION = "4.4.0"
DELTA_CONNECTOR_LINES = frozenset({(4, 0), (4, 1), (4, 2)})
# Features a supported line lacks, and the line that brought each: a column function over Arrow batches
# (pyspark.sql.functions.arrow_udf; score(df) and the SQL function use a pandas UDF below it), and read limits
# handed to a Python streaming source (latestOffset(start, limit); below it the jar-free Delta stream reader
# applies them itself)
ARROW_UDF_SINCE = (4, 1)
STREAM_READ_LIMITS_SINCE = (4, 2)
# score(df)'s column function: "pandas" takes the pandas path on any line (a check of it on a line that has the
# Arrow one); unset: chosen by the session's Spark
COLUMN_FUNCTION_ENV = "SBI_COLUMN_FUNCTION"
# Set to 1 to run on a Spark outside the range anyway (a nightly build, a vendor's fork): a warning, not an error.
ALLOW_UNSUPPORTED_ENV = "SBI_ALLOW_UNSUPPORTED_SPARK"

_LINE = re.compile(r"^\s*(\d+)\.(\d+)")
_VERSION_PY = re.compile(r"""__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""")


def spark_line(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a Spark version string, whatever follows it (``.dev0``, ``-databricks``)."""
    match = _LINE.match(version)
    if match is None:
        raise UnsupportedSparkError(f"cannot read a Spark version from {version!r}")
    return int(match.group(1)), int(match.group(2))


def supported(version: str) -> bool:
    """Whether ``version`` lies on a supported Spark line."""
    first, last = SUPPORTED_SPARK
    return first <= spark_line(version) <= last


def installed_pyspark() -> str | None:
    """The importable pyspark's version, read from its ``version.py`` without importing it (so Databricks' and
    databricks-connect's pyspark count too, whatever their distribution is called); None without pyspark."""
    import importlib.util
    import sys
    from pathlib import Path

    loaded = sys.modules.get("pyspark")
    if loaded is not None and getattr(loaded, "__version__", None):
        return str(loaded.__version__)
    try:
        spec = importlib.util.find_spec("pyspark")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:  # a folder, or a zip on the path (spark-submit puts $SPARK_HOME/python/lib/pyspark.zip there)
            text = spec.loader.get_data(str(Path(folder) / "version.py")).decode()  # type: ignore[union-attr]
        except (OSError, AttributeError):
            continue
        match = _VERSION_PY.search(text)
        if match:
            return match.group(1)
    return None


def check_spark(version: str | None = None, *, where: str = "the installed pyspark") -> str:
    """Refuse a Spark outside the supported range before any work; returns the version checked.

    ``version``: a Spark Connect server's ``spark.version`` (``where`` says whose); the installed pyspark's
    when not given. ``$SBI_ALLOW_UNSUPPORTED_SPARK=1`` turns the refusal into a warning on stderr.
    """
    found = version if version is not None else installed_pyspark()
    if found is None:
        from pipeline.core.extras import install_line

        raise UnsupportedSparkError(
            "pyspark is not installed. On a cluster (Databricks, EMR, spark-submit) the platform provides it: run "
            f"there; on a machine without Spark: {install_line(('spark',))} (Spark {SUPPORTED_TEXT})")
    if supported(found):
        return found
    message = (f"{where} is Spark {found}; spark-batch-inference {library_version()} supports Spark "
               f"{SUPPORTED_TEXT}. Use a runtime on one of those lines (Databricks 17.3 LTS and later run "
               f"Spark 4.0+), or pip install 'pyspark>={SUPPORTED_SPARK[0][0]}.{SUPPORTED_SPARK[0][1]},"
               f"<{SUPPORTED_SPARK[1][0]}.{SUPPORTED_SPARK[1][1] + 1}' where you manage your own Spark "
               f"(set {ALLOW_UNSUPPORTED_ENV}=1 to try anyway)")
    if os.environ.get(ALLOW_UNSUPPORTED_ENV) == "1":
        import sys

        print(f"warning: {message}", file=sys.stderr, flush=True)
        return found
    raise UnsupportedSparkError(message)


def check_spark_feature(feature: str, needs: tuple[int, int], version: str | None = None, *, fix: str = "") -> None:
    """Refuse before any work when ``feature`` needs a newer Spark than ``version`` (the installed pyspark's).

    >>> check_spark_feature("the x writer", (4, 0), "3.5.1", fix="use the connector")
    Traceback (most recent call last):
    ...
    pipeline.errors.UnsupportedSparkError: the x writer needs Spark 4.0 or later; this is Spark 3.5.1: use the connector
    """
    found = version if version is not None else installed_pyspark()
    if found is not None and spark_line(found) < needs:
        raise UnsupportedSparkError(
            f"{feature} needs Spark {needs[0]}.{needs[1]} or later; this is Spark {found}" + (f": {fix}" if fix else ""))


def session_spark(spark: Any) -> str:
    """The Spark line a session's Python functions run on: the lower of the installed pyspark (the client that
    builds them) and the session's Spark (a Spark Connect server's ``spark.version``; a classic session's JVM).

    >>> class Session: version = "4.0.1"
    >>> session_spark(Session()) if installed_pyspark() else "4.0.1"
    '4.0.1'
    """
    found = [v for v in (installed_pyspark(), str(spark.version)) if v]
    return min(found, key=spark_line)


def arrow_column_function(spark_version: str) -> bool:
    """Whether ``score(df)`` builds its column function as an Arrow UDF on ``spark_version`` (else a pandas UDF
    over the same worker, :mod:`pipeline.spark.pandas_edges`); ``$SBI_COLUMN_FUNCTION=pandas`` says no anywhere.

    >>> arrow_column_function("4.2.0"), arrow_column_function("4.0.1")
    (True, False)
    """
    if os.environ.get(COLUMN_FUNCTION_ENV) == "pandas":
        return False
    return spark_line(spark_version) >= ARROW_UDF_SINCE


def delta_connector_package(spark_version: str | None = None, *, delta_spark: Any = "installed") -> str | None:
    """The Maven coordinate of the Delta connector for ``spark_version`` (the installed pyspark's), as
    delta-spark's ``configure_spark_with_delta_pip`` builds it; None for a Spark line no Delta release is
    built for. ``delta_spark``: the delta-spark package's version (``"installed"``: read it; None: absent,
    so :data:`DELTA_VERSION`).
    """
    version = spark_version if spark_version is not None else (installed_pyspark() or "4.2.0")
    line = spark_line(version)
    if delta_spark == "installed":
        delta_spark = _distribution_version("delta-spark")
    if delta_spark is None:
        if line not in DELTA_CONNECTOR_LINES:
            return None
        delta_spark = DELTA_VERSION
    if spark_line(delta_spark) >= (4, 1):  # Delta 4.1 and later name the Spark line they were built for
        return f"io.delta:delta-spark_{line[0]}.{line[1]}_2.13:{delta_spark}"
    return f"io.delta:delta-spark_2.13:{delta_spark}"


def _distribution_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def library_version() -> str:
    """This library's version, from the installed package's metadata (``pip install``, ``pip install -e``); a
    source tree that was never installed says ``0+unknown``."""
    return _distribution_version("spark-batch-inference") or "0+unknown"


def runtime_versions() -> dict[str, str]:
    """What a run ran with, for the runs table and the summary: this library, Python, pyspark, and the model
    libraries that are installed (``torch``, ``transformers``; absent ones are left out)."""
    versions = {"spark_batch_inference": library_version(), "python": platform.python_version()}
    pyspark = installed_pyspark()
    if pyspark is not None:
        versions["pyspark"] = pyspark
    for name in ("torch", "transformers"):
        found = _distribution_version(name)
        if found is not None:
            versions[name] = found
    return versions
