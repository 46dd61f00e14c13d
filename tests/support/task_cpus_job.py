"""Run a tiny embed job on ``local[2]`` with ``spark.task.cpus=2``; print the summary as JSON.

Invoked by tests/spark/test_threads.py in a subprocess (``spark.task.cpus`` is fixed when a SparkContext starts,
and the test session's context is already running):
    python tests/support/task_cpus_job.py <workdir> <model_dir>
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path


def main(workdir: Path, model: Path) -> dict:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pipeline.config import build_config
    from pipeline.runner import run_job
    from tests.support.data import make_documents, write_delta

    write_delta(workdir / "docs", make_documents(120))
    config = build_config({
        "job": "threads_test",
        "spark": {"master": "local[2]", "arrow_max_records_per_batch": 50, "conf": {"spark.task.cpus": "2"}},
        "source": {"format": "delta", "path": str(workdir / "docs"), "id_column": "doc_id"},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed"},
        "batching": {"batch_size": 16},
        "sink": {"path": str(workdir / "scores"), "mode": "append"},
        "run": {"progress": False, "ds": "2026-11-28", "sample_rows": 0},
    })
    summary = run_job(config, out=io.StringIO())
    return {"rows_in": summary.rows_in, "rows_out": summary.rows_out, "complete": summary.complete,
            "tasks": summary.tasks, "details": summary.details, "model_loads": summary.model_loads}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))), flush=True)
