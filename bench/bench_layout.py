"""Every core busy whatever the file layout: a one-file, one-row-group table vs a 20,000-row subset of it.

A table written by pandas/deltalake as one Parquet file with one row group is
read by Spark as splits of which all but one are empty; before parallelism was
planned from the row count, one worker scored every row. This bench builds such
a table of ``--rows`` rows from the demo corpus (ids made unique per copy), and
a one-file table of its first ``--subset`` rows, scores both with ``run_job``
and the demo config, and reports rows/s (inference + Delta write), rows per
worker and the ratio. Usage (numbers in docs/benchmarks_encoders.md)::

    PYTHONPATH=. .venv/bin/python bench/bench_layout.py --rows 100000 --subset 20000
    PYTHONPATH=. .venv/bin/python bench/bench_layout.py --remote sc://127.0.0.1:15002   # on a Connect server
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa


def build_tables(root: Path, rows: int, subset: int, source: str) -> tuple[str, str]:
    """``(big, small)``: one-file, one-row-group Delta tables of ``rows`` and ``subset`` demo rows."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    corpus = DeltaTable(source).to_pyarrow_table(columns=["doc_id", "text"])
    copies = -(-rows // corpus.num_rows)
    ids, texts = [], []
    for copy in range(copies):
        ids += [f"{i}#{copy}" for i in corpus["doc_id"].to_pylist()]
        texts += corpus["text"].to_pylist()
    table = pa.table({"doc_id": ids[:rows], "text": texts[:rows]})
    big, small = root / "big", root / "small"
    for path, data in ((big, table), (small, table.slice(0, subset))):
        write_deltalake(str(path), data, mode="overwrite", writer_properties=WriterProperties(max_row_group_size=rows))
        files = DeltaTable(str(path)).file_uris()
        assert len(files) == 1 and pq.ParquetFile(files[0]).num_row_groups == 1, f"{path}: not one file, one row group"
    return str(big), str(small)


def score(path: str, out: Path, *, spark: object, overrides: list[str]) -> dict:
    from pipeline import load_config, run_job

    config = load_config("conf/score_documents.yaml", overrides=[
        f"source.path={path}", "source.id_column=doc_id", "source.keep_columns=[]", f"sink.path={out}",
        "run.progress=false", "run.sample_rows=0", *overrides])
    summary = run_job(config, spark=spark, out=open(os.devnull, "w"))
    per_worker = sorted(summary.rows_per_worker.values())
    return {"rows": summary.rows_in, "seconds": round(summary.seconds, 1), "rows_per_s": round(summary.docs_per_s, 1),
            "tasks": summary.tasks, "rows_per_worker": per_worker,
            "worker_balance": round(per_worker[0] / per_worker[-1], 3) if per_worker else None,
            "padding_efficiency": round(summary.padding_efficiency, 3), "complete": summary.complete}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--subset", type=int, default=20_000)
    parser.add_argument("--source", default="warehouse/demo/documents")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each table (medians reported)")
    parser.add_argument("--remote", help="a Spark Connect URL; default: a classic local[2] session")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="bench/results_layout.json")
    args = parser.parse_args(argv)

    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    spark = get_session(SparkConfig(master="local[2]", remote=args.remote))
    root = Path(tempfile.mkdtemp(prefix="sbi-layout-"))
    try:
        big, small = build_tables(root, args.rows, args.subset, args.source)
        runs: dict[str, list[dict]] = {"subset": [], "single_file": []}
        for i in range(args.repeats):  # alternate the order: the machine is shared and noisy
            order = [("subset", small), ("single_file", big)]
            for name, path in (order if i % 2 == 0 else order[::-1]):
                result = score(path, root / f"out-{name}-{i}", spark=spark, overrides=args.overrides)
                runs[name].append(result)
                print(name, json.dumps(result), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def median(name: str) -> float:
        rates = sorted(r["rows_per_s"] for r in runs[name])
        return rates[len(rates) // 2]

    report = {
        "rows": args.rows, "subset": args.subset, "session": "connect" if args.remote else "classic local[2]",
        "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg(),
        "overrides": args.overrides, "runs": runs,
        "ratio_single_file_vs_subset": round(median("single_file") / median("subset"), 3),
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"single-file {args.rows:,} rows: {median('single_file')} rows/s; subset {args.subset:,}: "
          f"{median('subset')} rows/s; ratio {report['ratio_single_file_vs_subset']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
