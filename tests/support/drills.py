"""The write drills several test modules share: frames of ids for a day, a worker killed mid-write, a driver killed
at its commit, overwrites of one day racing, Delta's VACUUM now, a table's rows read back.

``tests/run/test_commits.py`` and ``tests/run/test_overwrites.py`` run them on local tables,
``tests/io/test_object_store.py`` on S3.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from pipeline.errors import SinkError
from pipeline.io.delta.sink import write_sink
from tests.support.data import sink_config
from tests.support.drivers import at_once, kill_when, start_driver

__all__ = ["D0", "D1", "SIZES", "failed_tasks", "ids_frame", "kill_driver_at_its_commit", "overwrite_race",
           "table_rows", "vacuum_now", "write_with_a_worker_killed"]

D0, D1 = dt.date(2026, 11, 27), dt.date(2026, 11, 28)
SIZES = {"a": 30, "b": 20, "c": 25}


def overwrite_race(spark, path, sink, names, barrier):
    faults = {"commit_barrier": {"dir": str(barrier), "parties": len(names), "timeout_s": 120}}
    return at_once({
        name: (lambda name=name: write_sink(ids_frame(spark, range(100, 100 + SIZES[name]), D1, writer=name), sink,
                                            partition_values={"ds": D1}, faults=faults,
                                            commit_metadata={"sbi.run_id": f"run-{name}"}))
        for name in names
    }, expected=(SinkError,), timeout_s=400)


def ids_frame(spark, ids, ds, *, writer="x", parts=3):
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i,) for i in ids], "id long")
    return df.withColumn("writer", F.lit(writer)).withColumn("ds", F.lit(ds)).repartition(parts)


def failed_tasks(spark, group: str) -> int:
    tracker = spark.sparkContext.statusTracker()
    return sum(tracker.getStageInfo(stage).numFailedTasks for job in tracker.getJobIdsForGroup(group)
               for stage in tracker.getJobInfo(job).stageIds if tracker.getStageInfo(stage))


def write_with_a_worker_killed(spark, path: str, writer: str, group: str):
    """``write_sink`` of 300 ids (4 kB of text each) to ``path`` on ``writer``, with partition 1's Python worker
    killed (``os._exit``) in the middle of its write; asserts Spark retried that one task. Returns the result."""
    from pyspark.sql import functions as F

    # the connector sorts a partitioned write's rows before it opens a file, so a worker dying before then
    # leaves none; unpartitioned, the rows stream into the file the dead attempt had open
    sink = sink_config(path=path, mode="append", partition_by=["ds"] if writer == "deltalake" else [])
    # 4 kB a row: a Python worker sends its rows on in 64 KiB writes, so half a task's rows reach the connector
    frame = ids_frame(spark, range(300), D1).withColumn("text", F.lit("x" * 4000))
    spark.sparkContext.setJobGroup(group, "worker killed mid-write")
    try:
        result = write_sink(frame, sink, faults={"exit_write_partitions": [1]})
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert failed_tasks(spark, group) == 1, "the killed attempt failed once and was retried"
    return result


def vacuum_now(spark, path: Path | str) -> None:
    """Delta's ``VACUUM`` through the connector of every file no version references, however new (retention 0,
    its check off), listing the folder in 2 tasks (10,000 by default: 210 s instead of 7 s on 2 loaded cores)."""
    confs = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
             "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2"}
    before = {k: spark.conf.get(k, None) for k in confs}
    try:
        for k, v in confs.items():
            spark.conf.set(k, v)
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)


def kill_driver_at_its_commit(config, tmp_path: Path, barrier: Path, **env: str) -> float:
    """Run ``config`` as ``tests/support/commit_job.py`` in a process group of its own and SIGKILL it with everything
    below it once the commit waits at its barrier (``run.faults.commit_barrier``: the deltalake writer's
    executors wrote their files; the connector's driver is about to write and commit). Returns when the
    barrier's 15 s timeout would release a surviving commit worker."""
    config_file = tmp_path / "job.json"
    config_file.write_text(config.model_dump_json())
    log = tmp_path / "driver.log"
    driver = start_driver(config_file, log, env=env)
    kill_when(driver, lambda: bool(list(barrier.glob("*.ready"))), log, timeout_s=400)
    return time.time() + 15


def table_rows(spark, path: Path) -> list[dict]:
    from pipeline.io.sources import read_delta

    return [r.asDict() for r in read_delta(spark, str(path)).collect()]
