"""The child process of tests/run/test_volume_mount.py: it runs with ``volume_mount.so`` preloaded, so its links
and renames under ``SBI_VOLUME_ROOT`` fail as a Unity Catalog Volume's FUSE's do (tests/support/volume.py).

``python tests/support/volume_job.py <spec.json>`` prints one ``RESULT <json>`` line. The spec's ``what``:

- ``probe``: what the folder refuses (links, renames, a deltalake write) and what it allows (reads);
- ``staging``: a plan folder, a staged task and its reuse, written there;
- ``jobs``: ``run_job`` of each config in ``jobs`` on one session, then the runs table ``runs_path`` read back
  with deltalake from this process. The JVM starts without the shim (Spark reaches a Volume through the cloud
  store); with ``executors_on_volume`` the executors' Python workers get it (they write staging through the FUSE).
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

# read when run as the child process, not when pytest imports this module for its doctests: the shim is loaded in
# this process, and what it starts from here on goes without it
SHIM = os.environ.pop("LD_PRELOAD", "") if __name__ == "__main__" else ""
ROOT = Path(os.environ.get("SBI_VOLUME_ROOT", "."))


def _errno(call) -> int | str:
    try:
        call()
        return "ok"
    except OSError as exc:
        return exc.errno


def probe(spec: dict) -> dict:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    (ROOT / "a").write_text("x")
    found = {"link": _errno(lambda: os.link(ROOT / "a", ROOT / "b")),
             "rename": _errno(lambda: os.rename(ROOT / "a", ROOT / "c")),
             "replace": _errno(lambda: os.replace(ROOT / "a", ROOT / "c")),
             "outside": _errno(lambda: os.replace(spec["outside"] + "/x", spec["outside"] + "/y"))}
    try:
        write_deltalake(str(ROOT / "t"), pa.table({"x": [1]}))
        found["deltalake_write"] = "ok"
    except Exception as exc:  # noqa: BLE001 - what delta-rs says there is the point
        found["deltalake_write"] = str(exc)
    found["deltalake_read"] = DeltaTable(spec["table"]).to_pyarrow_table().num_rows
    return found


def staging(spec: dict) -> dict:
    import pyarrow as pa

    from pipeline.journal.layout import read_json, write_atomic
    from pipeline.journal.plans import StagePlan, open_plan, staged_tasks
    from pipeline.journal.tasks import InputDigest, TaskStage

    folder = open_plan(str(ROOT / "staging"), StagePlan("sbi-j-1", "delta:1", "fp", rows=3, tasks=1, job="j", ds="d"))
    rows = pa.record_batch({"id": ["a", "b", "c"], "content_hash": ["1", "2", "3"]})
    digest = InputDigest()
    digest.update(rows)
    stage = TaskStage(folder, 0)
    stage.add(rows)
    stage.finish(digest=digest.value(), counts={"status": {"ok": 3}})
    reused = TaskStage(folder, 0).reusable(digest.value())
    torn = Path(folder) / "task-1.done.json"
    torn.write_text('{"task": 1, "plan": "')  # a writer killed half-way through a marker written in place
    write_atomic(Path(folder) / "again.json", b'{"v": 2}')
    write_atomic(Path(folder) / "again.json", b'{"v": 3}')
    return {"failed": stage.failed, "staged": staged_tasks(folder), "reused_rows": reused[0].num_rows if reused else None,
            "counts": reused[1] if reused else None, "torn": read_json(torn), "again": read_json(Path(folder) / "again.json"),
            "files": sorted(p.name for p in Path(folder).iterdir())}


def jobs(spec: dict) -> dict:
    from pipeline.config import SparkConfig, build_config
    from pipeline.errors import PipelineError
    from pipeline.runner import run_job
    from pipeline.records.runs import read_runs
    from pipeline.spark.session import get_session

    conf = {"spark.default.parallelism": "2", "spark.databricks.delta.snapshotPartitions": "2"}
    if spec.get("executors_on_volume"):
        conf["spark.executorEnv.LD_PRELOAD"] = SHIM
    spark = get_session(SparkConfig(master="local[2]", app_name="volume-test", shuffle_partitions=2,
                                    arrow_max_records_per_batch=100, conf=conf))
    results = []
    for data in spec["jobs"]:
        out = io.StringIO()
        config = build_config(data)
        try:
            summary = run_job(config, spark=spark, out=out)
            result = {"ok": True, "run_id": summary.run_id, "rows_out": summary.rows_out,
                      "resumed_tasks": summary.resumed_tasks,
                      "drift": summary.quality.get("drift") if summary.quality else None}
        except PipelineError as exc:
            result = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        staging = Path(config.run.staging_path or "/nonexistent")
        results.append({**result, "log": out.getvalue(),
                        "staged": sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())})
    try:
        runs = [{"run_id": r["run_id"], "outcome": r["outcome"], "ds": str(r["ds"])}
                for r in read_runs(spec["runs_path"])]
    except Exception as exc:  # noqa: BLE001
        runs = f"{type(exc).__name__}: {exc}"
    spark.stop()
    return {"results": results, "runs": runs}


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    result = {"probe": probe, "staging": staging, "jobs": jobs}[spec["what"]](spec)
    print("RESULT " + json.dumps(result, default=str), flush=True)
    # the result is out: no exit-time teardown may change the exit status (deltalake's Rust runtime, after a
    # refused write, has panicked at shutdown with "Already shut down" and aborted the process)
    sys.stderr.flush()
    os._exit(0)
