"""Run a small embed job on ``local[2]`` with ``spark.task.cpus=2``, Spark's event log on and the run's lines as
JSON (``run.log_format: json``); print ``RESULT <json>`` with the summary, the event log's folder and the output's
path.

Invoked once a test session, in a process of its own, by the ``own_process_run`` fixture (tests/conftest.py) that
tests/run/test_logging.py (the JSON lines, the event log) and tests/spark/test_threads.py (one task on two torch
threads) share: ``spark.task.cpus`` and the event log are fixed when a SparkContext starts, and this process
configures no logging, so the run's JSON lines go to stdout by themselves:
    python tests/support/event_log_job.py <workdir> <model_dir>
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(workdir: Path, model: Path) -> dict:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from pipeline.config import build_config
    from pipeline.runner import run_job
    from tests.support.data import make_documents, write_delta

    events = workdir / "events"
    events.mkdir()
    write_delta(workdir / "docs", make_documents(120))
    config = build_config({
        "job": "labelled",
        "spark": {"master": "local[2]", "arrow_max_records_per_batch": 20,
                  "conf": {"spark.task.cpus": "2",  # one task slot: the job is planned as one task
                           "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
                           "spark.eventLog.compress": "false"}},  # Spark 4 compresses it with zstd by default
        "source": {"format": "delta", "path": str(workdir / "docs"), "id_column": "doc_id"},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed"},
        "batching": {"batch_size": 8},
        "sink": {"path": str(workdir / "scores"), "mode": "append"},
        # a run id YAML would read as a number: the events carry it as text
        "run": {"ds": "2026-11-29", "run_id": "20261129", "log_format": "json", "progress_interval_s": 0.5},
    })
    summary = run_job(config)
    SparkSession.getActiveSession().stop()  # the event log is whole once its context stops
    return {"run_id": summary.run_id, "events": str(events), "stage_seconds": summary.stage_seconds,
            "rows_in": summary.rows_in, "rows_out": summary.rows_out, "complete": summary.complete,
            "tasks": summary.tasks, "details": summary.details, "scores": str(workdir / "scores")}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]), Path(sys.argv[2]))), flush=True)
