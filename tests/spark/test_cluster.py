"""Separate executor JVMs (local-cluster) with a fake GPU resource: device choice, one load per worker, exactly once."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.support.drivers import run_job_script

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.beside, pytest.mark.drills]


def test_local_cluster_with_fake_gpus(tmp_path, tiny_embed_model):
    # a scheduling mistake with GPU resources hangs silently: bound it
    result = run_job_script("cluster_job.py", tmp_path, tiny_embed_model, timeout_s=420)

    devices = result["devices"]
    assert len(devices) == 4
    for row in devices:
        # each task's device follows the GPU address Spark assigned it, CUDA or not
        assert row["assigned"] == "0" and row["device"] == "cuda:0" and row["forced_cpu"] == "cpu"

    summary = result["summary"]
    assert summary["rows_in"] == summary["rows_out"] == 400 and summary["complete"]
    loads = summary["model_loads"]
    # one task at a time per executor (1 GPU each): one Python worker per executor, one load each
    assert len(loads) == 2 and set(loads.values()) == {1}, loads
    table = pa.table(DeltaTable(str(tmp_path / "scores")).to_pyarrow_table())
    ids = table["doc_id"].to_pylist()
    assert len(ids) == 400 and len(set(ids)) == 400
    assert DeltaTable(str(tmp_path / "scores")).version() == 0
