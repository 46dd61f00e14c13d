"""Torch threads in the workers follow the task's cores (``spark.task.cpus``), checked on real Spark workers."""

from __future__ import annotations

import io

from deltalake import DeltaTable
import pytest

from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import job_config


def test_one_torch_thread_per_task_by_default(spark, tmp_path, tiny_embed_model):
    """local[2] with spark.task.cpus=1: two tasks, each worker runs torch with one thread (no oversubscription)."""
    write_delta(tmp_path / "docs", make_documents(60))
    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model), spark=spark, out=out)
    assert summary.complete and summary.tasks == 2
    assert summary.details["torch threads"] == "1 (2 tasks)"
    assert "torch threads           : 1 (2 tasks)" in out.getvalue()


def test_model_torch_threads_overrides_task_cpus(spark, tmp_path, tiny_embed_model):
    write_delta(tmp_path / "docs", make_documents(60))
    config = job_config(tmp_path, tiny_embed_model)
    config = config.model_copy(update={"model": config.model.model_copy(update={"torch_threads": 3})})
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.details["torch threads"] == "3 (2 tasks)"


@pytest.mark.beside  # a Spark of its own in a subprocess
def test_task_cpus_two_runs_one_task_with_two_torch_threads(own_process_run):
    """spark.task.cpus=2 on local[2]: one task at a time, planned as one task, its worker on two torch threads."""
    result, _ = own_process_run  # the run tests/run/test_logging.py reads the event log of (tests/conftest.py)
    assert result["complete"] and result["rows_in"] == result["rows_out"] == 120
    assert result["tasks"] == 1  # planned from the task slots: 2 cores / 2 cpus per task
    assert result["details"]["torch threads"] == "2 (1 tasks)"
    ids = DeltaTable(result["scores"]).to_pyarrow_table()["doc_id"].to_pylist()
    assert sorted(ids) == [f"d{i:05d}" for i in range(120)]
