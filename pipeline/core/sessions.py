"""What the library asks of a session object, whichever kind it is, without importing pyspark.

Both the Spark glue (``pipeline.spark``) and the table code (``pipeline.io``) need to know whether a
session is a Spark Connect one, which underlying session a Python wrapper stands for, to register a
Python data source on it once, and which Delta connector matches the installed pyspark (the jars a
session gets, the hint an error about a missing connector gives). These answers read only the object's
attributes or the installed packages' versions, so they live on the ground floor, where neither
platform package has to import the other.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

__all__ = ["JobsSince", "activate_for_this_thread", "delta_package", "is_connect", "register_data_source",
           "session_key"]

def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no ``sparkContext``, JVM or RDD API on the driver)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_key(spark: Any) -> Any:
    """One key per underlying session: the server-side session id on Spark Connect, the JVM session on classic
    (several Python wrappers may share one)."""
    if is_connect(spark):
        return ("connect", spark.session_id)
    return id(spark._jsparkSession)


class JobsSince:
    """The Spark jobs this thread's job group starts from now on, on a classic session's ``SparkContext``
    (its status tracker keeps finished jobs and stages too): the progress lines' stages, a failed write's tasks."""

    def __init__(self, sc: Any) -> None:
        self.tracker = sc.statusTracker()
        self.group = sc.getLocalProperty("spark.jobGroup.id")  # the caller's thread; None when ungrouped
        self.before = set(self.tracker.getJobIdsForGroup(self.group))

    def stages(self) -> Iterator[Any]:
        """The status tracker's stage info of each stage of those jobs, job by job in their order."""
        for job in sorted(set(self.tracker.getJobIdsForGroup(self.group)) - self.before):
            info = self.tracker.getJobInfo(job)
            for stage_id in info.stageIds if info is not None else ():
                stage = self.tracker.getStageInfo(stage_id)
                if stage is not None:
                    yield stage


_data_sources: set[tuple[Any, str]] = set()
_data_sources_lock = threading.Lock()


def register_data_source(spark: Any, source: type) -> None:
    """Register the Python data source ``source`` on ``spark`` once per session and source name
    (re-registering races with writes in other threads), with ``spark`` active for this thread."""
    activate_for_this_thread(spark)
    key = (session_key(spark), source.name())
    with _data_sources_lock:
        if key not in _data_sources:
            spark.dataSource.register(source)
            _data_sources.add(key)


def activate_for_this_thread(spark: Any) -> None:
    """Make ``spark`` the JVM thread's active session (classic); nothing to do on Spark Connect.

    Python data sources are looked up in the JVM thread's active session, and a
    write from another Python thread runs on a JVM thread that has none.
    """
    jsession = getattr(spark, "_jsparkSession", None)
    if jsession is None:
        return
    try:
        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - best effort: the default session is used instead
        pass


def delta_package() -> str | None:
    """The Maven coordinate of the Delta connector matching the installed pyspark (and delta-spark, when
    installed); None on a Spark line no Delta release is built for
    (:func:`pipeline.core.compat.delta_connector_package`)."""
    from pipeline.core.compat import delta_connector_package

    return delta_connector_package()
