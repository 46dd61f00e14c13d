"""How many inference tasks a job runs: planned from the row count and the cores, never inherited.

A source's split count says nothing about the work: a 135,915-row Delta table
written as one Parquet file with one row group is read as 2 splits, one of
them empty, and one worker scored every row (352 docs/s against 536 docs/s on
a 20,000-row subset). So the runner counts the rows, asks :func:`plan_tasks`
for a task count, and :func:`deal_rows` deals the rows out to the tasks.

Dealing, not hashing: a hash of the id gives each task a binomial share of the
rows (4,066 and 3,934 of 8,000) and of the work (130,336 and 127,394 tokens),
and with one task per core the job waits for the bigger one. Within each input
split, rows are ordered by the length of their input (then id) and dealt round
robin, so every task gets the same count and the same mix of short and long rows,
and a retried split deals its rows to the same tasks again (the order is a
function of the rows, not of timing).

Why the numbers: length sorting happens within an Arrow chunk, and a full
10,000-row chunk pads best (padding efficiency 0.975 against 0.95 at 5,000
rows, docs/benchmarks_precision.md), so a task should hold about one full chunk; the
count is rounded up to a multiple of the cores so that the last wave of tasks
keeps every core busy too.

:func:`plan_tasks` is pure; :func:`count_cores` reads the session's settings
and works on classic and Spark Connect sessions alike (no ``sparkContext``).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

__all__ = ["DEFAULT_CORES", "count_cores", "cores_from_settings", "deal_rows", "plan_tasks", "slot_keys"]

# When the session says nothing usable about its cores (e.g. a serverless pool
# that hides its master): enough tasks to keep a small cluster busy.
DEFAULT_CORES = 8

_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")
_LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]$")


def plan_tasks(rows: int, *, cores: int, rows_per_task: int) -> int:
    """Inference tasks for ``rows`` rows on ``cores`` task slots, about ``rows_per_task`` rows each.

    At least one task per core (while there are rows for it), and a multiple
    of the cores, so no core idles in the last wave; never more tasks than rows.

    >>> plan_tasks(135_915, cores=2, rows_per_task=10_000)   # 14 tasks of ~9,700 rows
    14
    >>> plan_tasks(40_000, cores=2, rows_per_task=10_000), plan_tasks(45_000, cores=2, rows_per_task=10_000)
    (4, 6)
    >>> plan_tasks(5_000, cores=2, rows_per_task=10_000)     # small input: one task per core
    2
    >>> plan_tasks(3, cores=8, rows_per_task=10_000), plan_tasks(0, cores=8, rows_per_task=10_000)
    (3, 1)
    """
    if cores < 1 or rows_per_task < 1:
        raise ValueError(f"cores ({cores}) and rows_per_task ({rows_per_task}) must be at least 1")
    if rows <= 0:
        return 1
    tasks = max(math.ceil(rows / rows_per_task), cores)
    tasks = math.ceil(tasks / cores) * cores
    return max(1, min(tasks, rows))


def cores_from_settings(settings: dict[str, str], *, local_cpus: int | None = None) -> int | None:
    """Task slots described by Spark settings (``spark.master``, executor confs), or None if they don't say.

    ``local_cpus`` stands in for ``local[*]`` (the machine's cores).

    >>> cores_from_settings({"spark.master": "local[2,3]"}), cores_from_settings({"spark.master": "local"})
    (2, 1)
    >>> cores_from_settings({"spark.master": "local[*]"}, local_cpus=16)
    16
    >>> cores_from_settings({"spark.master": "local-cluster[2, 3, 1024]", "spark.task.cpus": "1"})
    6
    >>> cores_from_settings({"spark.master": "yarn", "spark.executor.instances": "10", "spark.executor.cores": "4",
    ...                      "spark.task.cpus": "2"})
    20
    >>> cores_from_settings({"spark.master": "k8s://x", "spark.default.parallelism": "64"})
    64
    >>> cores_from_settings({"spark.master": "yarn"}) is None
    True
    """
    master = settings.get("spark.master", "").strip()
    task_cpus = max(1, _int(settings.get("spark.task.cpus")) or 1)
    cores: int | None = None
    local = _LOCAL.match(master)
    cluster = _LOCAL_CLUSTER.match(master)
    if local:
        n = local.group(1)
        cores = 1 if n is None else (local_cpus or os.cpu_count() or 1) if n == "*" else int(n)
    elif cluster:
        cores = int(cluster.group(1)) * int(cluster.group(2))
    else:
        instances = _int(settings.get("spark.executor.instances")) or _int(
            settings.get("spark.dynamicAllocation.maxExecutors"))
        per_executor = _int(settings.get("spark.executor.cores"))
        if instances and per_executor:
            cores = instances * per_executor
    if cores is not None:
        return max(1, cores // task_cpus)
    parallelism = _int(settings.get("spark.default.parallelism"))
    return parallelism if parallelism and parallelism > 0 else None


_SETTINGS = ("spark.master", "spark.task.cpus", "spark.executor.instances", "spark.dynamicAllocation.maxExecutors",
             "spark.executor.cores", "spark.default.parallelism")


def count_cores(spark: Any, *, default: int = DEFAULT_CORES) -> int:
    """Task slots of ``spark`` (classic or Connect), read from its settings; ``default`` when they don't say.

    Uses only ``spark.conf``: a Connect session has no ``sparkContext`` and
    serverless sessions refuse some keys, so each key is read on its own.
    """
    settings: dict[str, str] = {}
    for key in _SETTINGS:
        try:
            value = spark.conf.get(key, None)
        except Exception:  # noqa: BLE001 - a key this session refuses to show says nothing
            value = None
        if value is not None:
            settings[key] = str(value)
    return cores_from_settings(settings) or default


def deal_rows(df: Any, tasks: int, *, weight: str | None = None, order: tuple[str, ...] = ("id",)) -> Any:
    """``df`` in ``tasks`` partitions of equal row counts (within one row per input split) and mixed weights.

    Each input split is sorted by ``length(weight)`` (when given; a string or binary
    column) and ``order``, then row ``i`` of the split goes to task ``(i + split) % tasks``:
    every task receives the same share of each split's short and long rows. The slot is
    turned into a value that Spark's hash partitioner sends to exactly that task
    (:func:`slot_keys`), so ``repartition`` is exact, not a second hash lottery.
    Works on classic and Connect DataFrames (no RDD API).
    """
    from pyspark.sql import functions as F

    if tasks <= 1:
        return df.repartition(1)
    keys = slot_keys(tasks)
    sort = ([F.length(F.col(weight))] if weight else []) + [F.col(c) for c in order]
    slot = F.pmod(F.monotonically_increasing_id() + F.spark_partition_id(), F.lit(tasks)).cast("int") + F.lit(1)
    key = F.element_at(F.array(*[F.lit(k) for k in keys]), slot)
    return (df.sortWithinPartitions(*sort).withColumn("_sbi_slot", key)
            .repartition(tasks, "_sbi_slot").drop("_sbi_slot"))


def slot_keys(tasks: int) -> list[int]:
    """For each partition ``p < tasks``, the smallest int that ``repartition(tasks, col)`` sends to ``p``.

    Spark's hash partitioner is ``pmod(murmur3_x86_32(value, seed 42), tasks)``;
    :func:`spark_hash_int` is that hash, checked against ``F.hash`` in the tests.

    >>> slot_keys(1), slot_keys(2), len(set(slot_keys(64)))
    ([0], [2, 0], 64)
    """
    found: dict[int, int] = {}
    value = 0
    while len(found) < tasks:
        found.setdefault(spark_hash_int(value) % tasks, value)  # Python's % is pmod
        value += 1
    return [found[p] for p in range(tasks)]


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a 32-bit int (``Murmur3_x86_32.hashInt``), as a signed int.

    >>> spark_hash_int(0), spark_hash_int(1), spark_hash_int(-7)
    (933211791, -559580957, -1618159745)
    """
    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k1 = rotl(k1, 15) * 0x1B873593 & 0xFFFFFFFF
    h1 = (seed & 0xFFFFFFFF) ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def _int(value: str | None) -> int | None:
    try:
        return int(str(value).strip()) if value is not None else None
    except ValueError:
        return None
