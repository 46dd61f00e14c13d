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

from .test_runner import job_config, read_scores


def test_doctests():
    result = doctest.testmod(planning)
    assert result.attempted >= 8 and result.failed == 0


def test_cores_read_from_either_session_kind(any_spark):
    # both fixtures run local[2,3]: 2 cores, whatever the session kind
    assert planning.count_cores(any_spark) == 2


def test_a_single_file_single_row_group_table_keeps_every_worker_busy(spark, tmp_path, tiny_embed_model):
    """The layout that left one core idle (issue 10): one Parquet file, one row group, read as 1-2 splits."""
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
    assert min(per_worker.values()) >= 0.75 * max(per_worker.values()), f"unfair shares: {per_worker}"
    assert "rows per worker         : " in out.getvalue()
    assert read_scores(tmp_path).num_rows == n


class _Session:
    """Only what count_cores reads: ``conf.get``."""

    class conf:  # noqa: N801 - mirrors spark.conf
        @staticmethod
        def get(key, default=None):
            return {"spark.master": "local[2]"}.get(key, default)


def test_task_preference_applies_unless_rows_per_task_is_set(tmp_path, tiny_embed_model):
    from types import SimpleNamespace

    from pipeline.runner import plan_inference_tasks
    from pipeline.tasks.generate import GenerateTask

    generate = SimpleNamespace(rows_per_task=GenerateTask.rows_per_task)
    config = job_config(tmp_path, tiny_embed_model)
    assert plan_inference_tasks(_Session, config, 5_592, generate) == 12  # 11 tasks of 512 rows -> 12 on 2 cores
    assert plan_inference_tasks(_Session, config, 5_592) == 2
    explicit = job_config(tmp_path, tiny_embed_model, spark={"rows_per_task": 10_000})
    assert plan_inference_tasks(_Session, explicit, 5_592, generate) == 2
    fixed = job_config(tmp_path, tiny_embed_model, source={"repartition": 7})
    assert plan_inference_tasks(_Session, fixed, 5_592, generate) == 7
