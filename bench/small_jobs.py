"""Where a small job's time goes: the driver's stages of ``run_job`` for 100 and 10,000 rows, cold and warm,
and the cold job against the hand-written equivalent (``bench/handwritten_job.py``) in the same run.

    make bench-small-jobs                                   # 100 and 10,000 rows, 3 repeats, auto and connector
    PYTHONPATH=. .venv/bin/python bench/small_jobs.py --rows 100 --repeats 3 --writers auto   # the ratio alone
    PYTHONPATH=. .venv/bin/python bench/small_jobs.py --rows 100 --repeats 1 --writers deltalake --no-baseline
    PYTHONPATH=. .venv/bin/python bench/small_jobs.py --rows 100 --writers deltalake \
        --jvm-options '' '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC' --out /tmp/jvm.json   # driver JVM options

Each repeat is a new Python process (``cold``: what ``python -m pipeline run`` or
``spark-submit`` pays: interpreter and imports, a new JVM, new Python workers that
load the model) that then runs the same job a second time in the same session
(``warm``: a notebook rerunning a cell; the workers and their cached model are
reused). The job is the demo's (``conf/score_documents.yaml``: MiniLM on the
demo corpus, a local Delta table) on ``--rows`` rows of it, each run into a
fresh output table.

Reported per row count, kind and writer (median of the repeats, with the range):
the wall seconds from the process start (cold) or from the call (warm) to the
returned summary, and the driver's stages from ``RunSummary.stage_seconds``:
session, model check, pre-flight, idempotency, planning, inference and check (the
first Spark job over the scored rows: inference and the identity check),
quarantine commit, commit, read-back, summary, runs table; ``imports`` is the
interpreter's start and imports before ``run_job`` (cold only), ``inference`` the
workers' own inference seconds (summed over workers, so it can exceed the stage)
and ``outside inference`` the wall minus the stage that runs inference.

Both sides read the same rows: the first ``--rows`` rows of the demo table, in its stored order, are
written once per row count to a Delta table of their own (a limit on the whole table would let each
side's Spark pick whichever rows its first partitions hold; both still apply their limit, which keeps
them all), and every run, cold, warm and hand-written, is checked to have written exactly those ids
(after its clock stopped).

The baseline: each repeat of each writer also runs ``bench/handwritten_job.py`` on the same rows in a
new process (a Spark session with the Delta connector, a pandas UDF with a module-level model cache, a
connector append; no checks), right after that writer's runs, so the machine's drift hits both alike.
The ratio printed per row count and writer is the pipeline's cold wall over the hand-written job's run
beside it, each from the process's start to its committed rows: the median of the per-repeat ratios
with their range (the bar: at most 0.6 at 100 rows). Results: ``bench/results_small_jobs.json``; the
reading in ``docs/benchmarks_small_jobs.md``.
"""

from __future__ import annotations

import time

_PROCESS_START = time.perf_counter()  # before the heavy imports: a cold run's clock starts here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results_small_jobs.json"
DEMO = REPO / "warehouse" / "demo" / "documents"
INFERENCE_STAGE = "inference and check"


def source_table(rows: int, root: str) -> str:
    """The first ``rows`` rows of the demo table (its stored order) as a Delta table at ``root``/source-``rows``:
    what the pipeline and the hand-written job both read."""
    from deltalake import DeltaTable, write_deltalake

    path = f"{root}/source-{rows}"
    first = DeltaTable(str(DEMO)).to_pyarrow_table().slice(0, rows)
    if first.num_rows != rows:
        raise RuntimeError(f"the demo table holds {first.num_rows:,} rows, fewer than --rows {rows:,}")
    write_deltalake(path, first)
    return path


def ids(*paths: str) -> list[str]:
    """The sorted ``doc_id`` s of the Delta tables at ``paths`` (those that exist), together."""
    from deltalake import DeltaTable

    found: list[str] = []
    for path in paths:
        if (Path(path) / "_delta_log").is_dir():
            found += DeltaTable(path).to_pyarrow_table(columns=["doc_id"])["doc_id"].to_pylist()
    return sorted(found)


def _child(rows: int, writer: str, root: str, source: str) -> dict[str, Any]:
    """One cold run then one warm run of the demo job on ``source`` in this process; their stages and walls."""
    import io

    from pipeline import load_config, run_job

    def config(name: str) -> Any:
        return load_config(REPO / "conf" / "score_documents.yaml", overrides=[
            f"source.path={source}", f"source.limit={rows}",
            f"sink.path={root}/{name}", f"sink.writer={writer}", "run.progress=false", "run.summary_path=",
            "spark.master=local[2]",
        ])

    runs = {}
    imported = time.perf_counter()
    for kind in ("cold", "warm"):
        started = time.perf_counter()
        summary = run_job(config(kind), out=io.StringIO())
        ended = time.perf_counter()
        assert summary.complete and summary.rows_out + summary.rows_quarantined == rows, summary.render()
        runs[kind] = {
            "wall_s": round(ended - (_PROCESS_START if kind == "cold" else started), 3),
            "stages": {k: round(v, 3) for k, v in summary.stage_seconds.items()},
            "imports_s": round(imported - _PROCESS_START, 3) if kind == "cold" else 0.0,
            "worker_inference_s": round(summary.infer_seconds, 3),
            "worker_load_s": round(summary.load_seconds, 3),
            "writer": summary.writer,
        }
    return runs


def _env(*, file_cache: bool = True, jvm_options: str | None = None, pythonpath: str = str(REPO)) -> dict[str, str]:
    env = {**({} if file_cache else {"SBI_FILE_CACHE": "0"}), **os.environ, "PYTHONPATH": pythonpath,
           "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
           "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if jvm_options is not None:  # the driver JVM's options, read by spark-submit's launcher
        env["SPARK_SUBMIT_OPTS"] = jvm_options
    return env


def handwritten(rows: int, source: str, output: str, timeout: float) -> dict[str, float]:
    """One cold run of the hand-written job on ``source`` in a new process: its wall to the committed append,
    and to exit."""
    env = _env(pythonpath=f"{REPO / 'bench'}{os.pathsep}{REPO}")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "handwritten_job.py"), source, output,
                           "--rows", str(rows)],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    process_s = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the hand-written job failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if out["rows"] != rows:
        raise RuntimeError(f"the hand-written job wrote {out['rows']} rows, not {rows}")
    return {"wall_s": out["wall_s"], "process_s": round(process_s, 3)}


def _subprocess(args: list[str], timeout: float, *, file_cache: bool = True, jvm_options: str | None = None
                ) -> dict[str, Any]:
    env = _env(file_cache=file_cache, jvm_options=jvm_options)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)
    process_s = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {args} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1])
    out["cold"]["process_s"] = round(process_s, 3)  # to the process's exit (JVM shutdown included)
    return out


def ratio(runs: list[dict[str, Any]], hand: list[dict[str, float]]) -> dict[str, float]:
    """The pipeline's cold wall over the hand-written job's, repeat by repeat (run i beside baseline i)."""
    return _spread([r["wall_s"] / h["wall_s"] for r, h in zip(runs, hand)])


def machine() -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "bench"))
    from bench_scaling import machine as scaling_machine

    return scaling_machine()


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of the walls and of every stage over repeats of one (rows, kind, writer)."""
    stages: list[str] = []
    for run in runs:
        stages += [s for s in run["stages"] if s not in stages]
    out = {"wall_s": _spread([r["wall_s"] for r in runs]),
           "imports_s": _spread([r["imports_s"] for r in runs]),
           "stages": {s: _spread([r["stages"].get(s, 0.0) for r in runs]) for s in stages},
           "worker_inference_s": _spread([r["worker_inference_s"] for r in runs]),
           "worker_load_s": _spread([r["worker_load_s"] for r in runs]),
           "outside_inference_s": _spread([r["wall_s"] - r["stages"].get(INFERENCE_STAGE, 0.0) for r in runs])}
    if "process_s" in runs[0]:
        out["process_s"] = _spread([r["process_s"] for r in runs])
    return out


def table(results: dict[str, Any]) -> str:
    """A markdown table: one column per (rows, kind, writer), one row per stage (median seconds)."""
    cols = [(key, entry) for key, entry in results["runs"].items()]
    stages: list[str] = []
    for _, entry in cols:
        stages += [s for s in entry["stages"] if s not in stages]
    head = "| stage | " + " | ".join(k for k, _ in cols) + " |"
    lines = [head, "|---|" + "---:|" * len(cols)]

    def cell(v: dict[str, float]) -> str:
        return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"

    lines.append("| **wall** | " + " | ".join(cell(e["wall_s"]) for _, e in cols) + " |")
    lines.append("| process to exit | " + " | ".join(cell(e["process_s"]) if "process_s" in e else "-"
                                                  for _, e in cols) + " |")
    lines.append("| imports | " + " | ".join(cell(e["imports_s"]) for _, e in cols) + " |")
    for s in stages:
        lines.append(f"| {s} | " + " | ".join(cell(e["stages"][s]) if s in e["stages"] else "-"
                                             for _, e in cols) + " |")
    lines.append("| workers: model load (sum) | " + " | ".join(cell(e["worker_load_s"]) for _, e in cols) + " |")
    lines.append("| workers: inference (sum) | " + " | ".join(cell(e["worker_inference_s"]) for _, e in cols) + " |")
    lines.append("| outside inference | " + " | ".join(cell(e["outside_inference_s"]) for _, e in cols) + " |")
    return "\n".join(lines)


def _writer_runs(rows: int, writer: str, source: str, root: str, args: argparse.Namespace, *, baseline: bool
                 ) -> tuple[dict[str | None, dict[str, list[dict[str, Any]]]], list[dict[str, float]]]:
    """``writer``'s repeats on ``source``, each running every JVM variant and then, beside them, the hand-written
    job (with ``baseline``): ``({variant: {"cold": [...], "warm": [...]}}, [hand-written run per repeat])``.
    Each run is checked to have written exactly ``source``'s ids (output and quarantine together)."""
    variants = args.jvm_options if args.jvm_options is not None else [None]
    raw: dict[str | None, dict[str, list[dict[str, Any]]]] = {v: {"cold": [], "warm": []} for v in variants}
    hand: list[dict[str, float]] = []
    expected = ids(source)
    for i in range(args.repeats):
        for j, variant in enumerate(variants):  # interleaved: the machine's drift hits each alike
            run_root = f"{root}/{rows}-{writer}-{i}-{j}"
            out = _subprocess(["--child", str(rows), writer, run_root, source], args.timeout,
                              file_cache=not args.no_file_cache, jvm_options=variant)
            for kind in raw[variant]:
                raw[variant][kind].append(out[kind])
                _same_rows(expected, f"{run_root}/{kind}", f"{run_root}/{kind}_quarantine")
            label = "" if variant is None else f" jvm '{variant}'"
            print(f"rows {rows:,} {writer}{label} #{i + 1}: cold {out['cold']['wall_s']:.1f} s, "
                  f"warm {out['warm']['wall_s']:.1f} s", flush=True)
        if baseline:  # every repeat of every writer: its ratio is to the hand-written run beside it
            output = f"{root}/{rows}-{writer}-handwritten-{i}"
            hand.append(handwritten(rows, source, output, args.timeout))
            _same_rows(expected, output)
            print(f"rows {rows:,} hand-written beside {writer} #{i + 1}: {hand[-1]['wall_s']:.1f} s", flush=True)
    return raw, hand


def _same_rows(expected: list[str], *tables: str) -> None:
    """Fail the bench when ``tables`` together hold other ids than ``expected`` (each once)."""
    from collections import Counter

    found = ids(*tables)
    if found != expected:
        missing, extra = Counter(expected) - Counter(found), Counter(found) - Counter(expected)
        raise RuntimeError(f"{' + '.join(tables)} hold {len(found):,} rows, not the source's {len(expected):,}: "
                           f"missing {sorted(missing)[:5]}, extra or repeated {sorted(extra)[:5]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--writers", nargs="+", default=["auto", "delta"],
                        help="sink.writer values (auto: what a job runs by default, a small job light; delta: the "
                             "connector, when `make jars` fetched it)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="leave out the hand-written job (it needs the Delta jars `make jars` caches)")
    parser.add_argument("--no-file-cache", action="store_true",
                        help="SBI_FILE_CACHE=0: the model check and the weights' sha256 computed in every process, "
                             "as on a machine that never ran the model (the figures before the cache)")
    parser.add_argument("--jvm-options", nargs="+", default=None, metavar="OPTS",
                        help="compare driver JVM options (SPARK_SUBMIT_OPTS), each repeat running every one in "
                             "turn; '' is Spark's defaults, e.g. --jvm-options '' '-XX:TieredStopAtLevel=1'")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    if not (DEMO / "_delta_log").is_dir():
        print("the demo corpus is missing: run `make demo-data` first", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"machine": machine(), "command": "bench/small_jobs.py " + " ".join(argv or sys.argv[1:]),
                               "runs": {}, "raw": {}}
    print(json.dumps(results["machine"]), flush=True)
    baseline = not args.no_baseline
    if baseline:
        from pipeline.spark.jars import session_jar_confs

        if not session_jar_confs(("delta",)):
            print("no cached Delta jars for the hand-written baseline: run `make jars`, or pass --no-baseline",
                  file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="sbi-small-jobs-") as root:
        for rows in args.rows:
            source = source_table(rows, root)
            for writer in args.writers:
                raw, hand = _writer_runs(rows, writer, source, root, args, baseline=baseline)
                extra_base = ", no file cache" if args.no_file_cache else ""
                for variant, kinds in raw.items():
                    for kind, runs in kinds.items():
                        extra = extra_base + ("" if variant is None else f", jvm '{variant or 'defaults'}'")
                        key = f"{rows:,} rows {kind} ({runs[0]['writer']}{extra})"
                        results["runs"][key] = summarise(runs)
                        results["raw"][key] = runs
                        if kind == "cold" and hand:
                            results.setdefault("ratios", {})[f"{rows:,} rows ({writer}{extra})"] = ratio(runs, hand)
                if hand:
                    results.setdefault("handwritten", {})[f"{rows:,} rows, beside {writer}{extra_base}"] = {
                        "wall_s": _spread([h["wall_s"] for h in hand]),
                        "process_s": _spread([h["process_s"] for h in hand]),
                        "raw": hand}
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    for key, entry in results.get("handwritten", {}).items():
        print(f"hand-written job, {key}: {entry['wall_s']['median']:.1f} s "
              f"({entry['wall_s']['min']:.1f}-{entry['wall_s']['max']:.1f})")
    for key, r in results.get("ratios", {}).items():
        print(f"small-job ratio, {key}, cold pipeline / hand-written: "
              f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})")
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        rows_, writer_, root_, source_ = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
        print(json.dumps(_child(rows_, writer_, root_, source_)), flush=True)
        sys.exit(0)
    sys.exit(main())
