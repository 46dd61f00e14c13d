"""One whole ``run_job`` in a process of its own, timed from the call to the returned summary (what a user's
scheduler sees: the session's start, the model check, planning, inference, the commits, the read-back and the
summary), for ``bench/bench_limit.py``'s ``job`` unit. Prints one line ``RESULT <json>``.

    PYTHONPATH=. .venv/bin/python bench/whole_job.py --input /tmp/in --out /tmp/out --cores 2 --precision fp32
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="a Delta table of doc_id, source, text")
    parser.add_argument("--out", required=True, help="the output Delta table (replaced)")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--set", action="append", default=[], help="more config overrides")
    args = parser.parse_args()
    from pipeline.config import load_config
    from pipeline.runner import run_job

    config = load_config(REPO / "conf/score_documents.yaml", overrides=[
        f"source.path={args.input}", f"sink.path={args.out}", "sink.mode=overwrite", "run.progress=false",
        f"spark.master=local[{args.cores}]", "spark.small_job_rows=0", f"batching.batch_size={args.batch}",
        f"batching.max_length={args.max_length}", f"model.precision={args.precision}", "model.device=cpu",
        "model.accuracy_gate.enabled=false", "run.summary_path=null", *args.set])
    started = time.perf_counter()
    summary = run_job(config, out=io.StringIO())
    wall = time.perf_counter() - started
    if not summary.complete:
        raise SystemExit(f"incomplete: {summary.incomplete}")
    stages = {k: round(v, 3) for k, v in summary.stage_seconds.items()}
    print("RESULT " + json.dumps({
        "wall": wall, "rows": summary.rows_out, "seconds": summary.seconds, "infer_seconds": summary.infer_seconds,
        "load_seconds": summary.load_seconds, "stage_seconds": stages,
        "driver_seconds": sum(v for k, v in stages.items() if k != "inference and check")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
