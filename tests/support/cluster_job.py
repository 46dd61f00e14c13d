"""Run on local-cluster[2,1,1024] (two executor JVMs) with a fake GPU per executor; print JSON results.

Invoked by tests/spark/test_cluster.py in a subprocess (one SparkContext per process):
    python tests/support/cluster_job.py <workdir> <model_dir>
"""

from __future__ import annotations

import io
import json
import os
import stat
import sys
from pathlib import Path


def main(workdir: Path, model: Path) -> dict:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    script = workdir / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name":"gpu","addresses":["0"]}\'\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)

    from pyspark.sql import SparkSession

    # Without the spark.worker.* settings (or on local[N]) a GPU-requesting job hangs unscheduled.
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]").appName("cluster-test")
        .config("spark.ui.enabled", "false")
        # the executor JVMs start like the driver (see FAST_START_JVM in tests/conftest.py)
        .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
        .config("spark.worker.resource.gpu.amount", "1")
        .config("spark.worker.resource.gpu.discoveryScript", str(script))
        .config("spark.executor.resource.gpu.amount", "1")
        .config("spark.executor.resource.gpu.discoveryScript", str(script))
        .config("spark.task.resource.gpu.amount", "1")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        def probe(frames):
            import pandas as pd
            from pyspark import TaskContext

            from pipeline.models.device import pick_device

            ctx = TaskContext.get()
            for _ in frames:
                gpu = ctx.resources().get("gpu")
                yield pd.DataFrame({
                    "partition": [ctx.partitionId()],
                    "assigned": [",".join(gpu.addresses) if gpu else ""],
                    "device": [pick_device(ctx.resources())],
                    "forced_cpu": [pick_device(ctx.resources(), prefer="cpu")],
                })

        devices = [r.asDict() for r in spark.range(0, 8, 1, 4).mapInPandas(
            probe, "partition int, assigned string, device string, forced_cpu string").collect()]

        import pyarrow as pa
        from deltalake import write_deltalake

        from pipeline.config import build_config
        from pipeline.runner import run_job

        ids = [f"c{i:04d}" for i in range(400)]
        write_deltalake(str(workdir / "docs"), pa.table({"doc_id": ids, "text": [f"good movie {i}" for i in range(400)]}))
        config = build_config({
            "job": "cluster_test",
            "source": {"format": "delta", "path": str(workdir / "docs"), "id_column": "doc_id", "repartition": 8},
            "model": {"path": str(model), "device": "cpu"},  # the fake GPU has no CUDA behind it
            "task": {"kind": "embed"},
            "batching": {"batch_size": 16, "max_length": 32},
            "sink": {"path": str(workdir / "scores"), "mode": "overwrite_partition"},
            "run": {"progress": False, "ds": "2026-11-29"},
        })
        summary = run_job(config, spark=spark, out=io.StringIO())
        return {"devices": devices, "summary": summary.to_dict()}
    finally:
        spark.stop()


if __name__ == "__main__":
    result = main(Path(sys.argv[1]), Path(sys.argv[2]))
    print("RESULT " + json.dumps(result, default=str))
