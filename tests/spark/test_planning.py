"""Parallelism planned from the row count: pure planning (doctests), cores on both kinds, a fair share per worker."""

from __future__ import annotations

import doctest
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, WriterProperties, write_deltalake

import pipeline.spark.planning as planning
from pipeline.runner import run_job

from tests.support.jobs import job_config, read_scores


def test_doctests():
    result = doctest.testmod(planning)
    assert result.attempted >= 8 and result.failed == 0


def test_cores_read_from_either_session_kind(any_spark):
    # both fixtures run local[2,3]: 2 cores, whatever the session kind
    assert planning.count_cores(any_spark) == 2


def test_a_single_file_single_row_group_table_keeps_every_worker_busy(spark, tmp_path, tiny_embed_model):
    """The layout that left one core idle: one Parquet file, one row group, read as 1-2 splits."""
    n = 40_000
    words = ["good", "bad", "film", "plot", "actor", "music", "story", "great", "awful", "long"]
    docs = pa.table({
        "doc_id": [f"d{i:06d}" for i in range(n)],
        "text": [f"{words[i % 10]} {words[(i // 10) % 10]} {words[(i // 100) % 10]}" for i in range(n)],
        "source": ["big"] * n,
    })
    write_deltalake(str(tmp_path / "docs"), docs, writer_properties=WriterProperties(max_row_group_size=n))
    files = DeltaTable(str(tmp_path / "docs")).file_uris()
    assert len(files) == 1 and pq.ParquetFile(files[0]).num_row_groups == 1

    config = job_config(tmp_path, tiny_embed_model, spark={"rows_per_task": 20_000},
                        task={"kind": "embed", "store_embedding": False}, batching={"batch_size": 64, "max_length": 16})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and summary.rows_out == n
    assert summary.tasks == 2, "40,000 rows at 20,000 per task on 2 cores: 2 tasks, whatever the splits"
    per_worker = summary.rows_per_worker
    assert len(per_worker) == 2 and sum(per_worker.values()) == n, per_worker
    assert max(per_worker.values()) - min(per_worker.values()) <= 2, f"rows are dealt, not hashed: {per_worker}"
    assert "rows per worker         : " in out.getvalue()
    assert read_scores(tmp_path).num_rows == n


def _shares(df, weight: str) -> list[tuple[int, int]]:
    from pyspark.sql import functions as F

    rows = (df.groupBy(F.spark_partition_id().alias("p"))
            .agg(F.count("*").alias("n"), F.sum(F.length(weight)).alias("w")).orderBy("p").collect())
    return [(r["n"], r["w"]) for r in rows]


def test_rows_are_dealt_evenly_by_count_and_length_on_either_session_kind(any_spark):
    """Hashing by id gave 4,066 and 3,934 of 8,000 real rows; dealing gives equal counts and equal work."""
    from pyspark.sql import functions as F

    n, tasks = 6_000, 4
    # skewed lengths, in 3 input splits, long rows bunched by id: a hash or a plain split would not even them out
    df = (any_spark.range(n).select(F.col("id").cast("string").alias("id"),
                                    F.expr("repeat('x', cast(pow(id % 97, 2) / 10 as int) + 1)").alias("text"))
          .repartition(3, "id"))
    dealt = planning.deal_rows(df, tasks, weight="text", order=("id",))
    shares = _shares(dealt, "text")
    assert len(shares) == tasks and sum(c for c, _ in shares) == n
    counts, weights = [c for c, _ in shares], [w for _, w in shares]
    assert max(counts) - min(counts) <= 1, f"splits start at different tasks: {shares}"
    assert max(weights) / min(weights) < 1.01, f"every task gets the same mix of lengths: {shares}"
    hashed = [w for _, w in _shares(df.repartition(tasks, "id"), "text")]
    assert max(hashed) / min(hashed) > max(weights) / min(weights), "the id hash this replaces is less even"
    # a retried split deals its rows to the same tasks: the assignment is a function of the rows
    assign = lambda: sorted(map(tuple, dealt.select("id", F.spark_partition_id()).collect()))  # noqa: E731
    assert assign() == assign()


def test_slot_keys_follow_sparks_own_hash(spark):
    from pyspark.sql import functions as F

    rows = spark.range(-300, 3000).select(F.col("id").cast("int").alias("v")).select("v", F.hash("v")).collect()
    assert [planning.spark_hash_int(v) for v, _ in rows] == [h for _, h in rows]
    for tasks in (2, 3, 7, 64):
        keys = planning.slot_keys(tasks)
        df = spark.createDataFrame([(k,) for k in keys], "k int").repartition(tasks, "k")
        got = dict(df.select("k", F.spark_partition_id()).collect())
        assert [got[k] for k in keys] == list(range(tasks))


class _Session:
    """Only what count_cores reads: ``conf.get``."""

    class conf:  # noqa: N801 - mirrors spark.conf
        @staticmethod
        def get(key, default=None):
            return {"spark.master": "local[2]"}.get(key, default)


def test_task_preference_applies_unless_rows_per_task_is_set(tmp_path, tiny_embed_model):
    from types import SimpleNamespace

    from pipeline.stages.scoring import plan_inference_tasks
    from pipeline.tasks.generate import GenerateTask

    generate = SimpleNamespace(rows_per_task=GenerateTask.rows_per_task)
    config = job_config(tmp_path, tiny_embed_model)
    assert plan_inference_tasks(_Session, config, 5_592, generate) == 12  # 11 tasks of 512 rows -> 12 on 2 cores
    assert plan_inference_tasks(_Session, config, 5_592) == 2
    explicit = job_config(tmp_path, tiny_embed_model, spark={"rows_per_task": 10_000})
    assert plan_inference_tasks(_Session, explicit, 5_592, generate) == 2
    fixed = job_config(tmp_path, tiny_embed_model, source={"repartition": 7})
    assert plan_inference_tasks(_Session, fixed, 5_592, generate) == 7
