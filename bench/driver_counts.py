"""What a run's driver does, counted: Spark jobs per driver stage, Delta log and table reads.

Used by ``bench/bench_driver.py``; robust counts, not seconds, so a shared machine compares before and after:

- **Spark jobs** by the tags every job of a run carries (:mod:`pipeline.spark.job_labels`: ``sbi-run-<run id>``
  and one per stage), read from the classic session's status tracker after its listener bus drained. A job
  with the run's tag but no stage's (none today) shows as ``(no stage)``.
- **Reads in this process**: deltalake snapshot loads (``DeltaTable(...)``), history reads
  (``DeltaTable.history``), add-action listings (``DeltaTable.get_add_actions``), the connector's
  ``DESCRIBE HISTORY``/``DESCRIBE DETAIL`` statements and its snapshot loads (``spark.read.format("delta")``);
  a wrapper around each counts the calls.
- **Log entries the commit's sweep read**: the deltalake writer commits in a Python worker of Spark's driver,
  out of this process's sight; its finished markers (``_sbi_jobs/<write id>.finished``) record what its sweep
  did, ``log_entries`` included.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Reads", "counting_reads", "job_names", "spark_jobs", "sweep_log_entries"]


class Reads:
    """Counts of the reads made in this process while :func:`counting_reads` is on (thread-safe)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


@contextmanager
def counting_reads() -> Iterator[Reads]:
    """Count the Delta reads of this process until the block ends (the wrapped functions are put back)."""
    import deltalake
    from pyspark.sql import DataFrameReader, SparkSession

    reads = Reads()
    table, reader = deltalake.DeltaTable, DataFrameReader
    saved = {(table, "__init__"): table.__init__, (table, "history"): table.history,
             (table, "get_add_actions"): table.get_add_actions, (SparkSession, "sql"): SparkSession.sql,
             (reader, "format"): reader.format, (reader, "load"): reader.load}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            reads.add(name)
            return fn(*args, **kwargs)
        return wrapper

    def sql(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        head = " ".join(str(query).split()[:2]).upper()
        if head in ("DESCRIBE HISTORY", "DESCRIBE DETAIL"):
            reads.add(f"connector {head.lower()}")
        return saved[(SparkSession, "sql")](self, query, *args, **kwargs)

    def fmt(self: Any, source: str) -> Any:
        self._sbi_format = source
        return saved[(reader, "format")](self, source)

    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_sbi_format", None) == "delta":
            reads.add("connector snapshot load")
        return saved[(reader, "load")](self, *args, **kwargs)

    def table_init(self: Any, table_uri: Any, *args: Any, **kwargs: Any) -> Any:
        reads.add("deltalake table load")
        reads.add(f"deltalake table load: {str(table_uri).rstrip('/').rsplit('/', 1)[-1]}")
        return saved[(table, "__init__")](self, table_uri, *args, **kwargs)

    table.__init__ = table_init
    table.history = counted("deltalake history read", saved[(table, "history")])
    table.get_add_actions = counted("deltalake add-action listing", saved[(table, "get_add_actions")])
    SparkSession.sql, reader.format, reader.load = sql, fmt, load
    try:
        yield reads
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)


def spark_jobs(spark: Any, *, job: str, run_id: str, stages: list[str]) -> dict[str, int]:
    """Spark jobs run ``run_id`` of ``job`` started, by stage (a classic session; {} on Spark Connect)."""
    from pipeline.core.sessions import is_connect
    from pipeline.spark.job_labels import describe_tag, run_tag

    if is_connect(spark):
        return {}
    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty()
    tracker = sc.statusTracker()
    every = set(tracker.getJobIdsForTag(run_tag(run_id)))
    by_stage: dict[str, int] = {}
    staged: set[int] = set()
    for stage in stages:
        ids = set(tracker.getJobIdsForTag(describe_tag(job, run_id, stage)))
        if ids:
            by_stage[stage] = len(ids)
            staged |= ids
    if every - staged:
        by_stage["(no stage)"] = len(every - staged)
    return by_stage


def job_names(spark: Any, *, run_id: str) -> list[tuple[int, str, str]]:
    """``(job id, description, call site)`` of every Spark job of run ``run_id``, oldest first (a classic session)."""
    from pipeline.spark.job_labels import run_tag

    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty()
    wanted = set(sc.statusTracker().getJobIdsForTag(run_tag(run_id)))
    jobs = sc.statusStore().jobsList(None)
    found = []
    for i in range(jobs.size()):
        job = jobs.apply(i)
        if job.jobId() in wanted:
            description = job.description()
            found.append((job.jobId(), description.get() if description.isDefined() else "", job.name()))
    return sorted(found)


def sweep_log_entries(*tables: str | Path) -> dict[str, int]:
    """What the commits' sweeps in ``tables`` recorded in their finished markers: sweeps run, log entries read."""
    found = {"sweeps": 0, "log_entries": 0, "commits": 0}
    for table in tables:
        folder = Path(table) / "_sbi_jobs"
        for marker in sorted(folder.glob("*.finished")) if folder.is_dir() else []:
            try:
                facts = json.loads(marker.read_text() or "{}")
            except ValueError:
                continue
            found["commits"] += 1
            swept = facts.get("swept") or {}
            if swept and not swept.get("skipped"):
                found["sweeps"] += 1
                found["log_entries"] += int(swept.get("log_entries", 0) or 0)
    return found
