"""The driver's fixed work, counted and timed: per batch run (by driver stage) and per micro-batch of a stream.

    make bench-driver                                   # all three below, at the sizes of the goals
    SBI_NO_JARS=1 PYTHONPATH=. .venv/bin/python bench/bench_driver.py batch --rows 5000 --runs 2 --writer deltalake
    PYTHONPATH=. .venv/bin/python bench/bench_driver.py batch --rows 5000 --runs 2 --launcher spark-submit
    SBI_NO_JARS=1 PYTHONPATH=. .venv/bin/python bench/bench_driver.py stream --micro-batches 200 --batch-rows 100

``batch``: the demo job (``conf/score_documents.yaml``: all-MiniLM-L6-v2, embeddings and two zero-shot labels,
``overwrite_partition`` by ds) on the first ``--rows`` demo documents, ``--runs`` times, each in a process of its
own as ``make demo`` runs it again (``--launcher spark-submit``: through spark-submit with the Delta jars, the
connector writing; ``python``: ``python`` as ``python -m pipeline run`` does). For each run: the seconds of every
driver stage (``summary.stage_seconds``), the driver's total (every stage but ``inference and check``), the
Spark jobs each stage started and the Delta log and table reads (``bench/driver_counts.py``). The goal: the
second run's driver stages at most 8 s in all, on a quiet 2-core machine, on both.

``stream``: a ``processing_time`` stream (``max_files_per_trigger: 1``) over a Delta table of
``--micro-batches`` appends of ``--batch-rows`` rows each, so each micro-batch reads one append; stopped
(SIGTERM, as a scheduler would) once every append was committed. For each micro-batch: its wall seconds, its
tasks' inference seconds, the fixed cost (wall less inference spread over the workers), its Spark jobs and
reads. Reported: the medians of the first and the last ``--window`` micro-batches. The goals: fixed cost at most
1 s a micro-batch, and the last window no slower than the first (nothing grows with the table).

Results: ``--json`` (e.g. ``bench/results_driver.json``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_profile import REPO, cpu_info, demo_table  # noqa: E402
from driver_counts import counting_reads, job_names, spark_jobs, sweep_log_entries  # noqa: E402

BATCH_STAGES = ["pre-flight", "idempotency", "planning", "inference and check", "quality gate", "quarantine commit",
                "commit", "read-back", "summary"]
JOB = "score_documents"


def _config(overrides: list[str]) -> Any:
    from pipeline.config import load_config

    return load_config(REPO / "conf" / "score_documents.yaml", overrides=overrides)


def _documents(work: Path, rows: int, parts: int, name: str) -> str:
    """The first ``rows`` demo documents as a Delta table of ``parts`` appends (ids made unique past the corpus)."""
    from bench_streaming import arrivals

    return arrivals(work, rows=rows, parts=parts, name=name)


def one_run(args: argparse.Namespace) -> dict[str, Any]:
    """One run of the demo job in this process (``one``): its stages, Spark jobs and reads."""
    from pyspark.sql import SparkSession

    from pipeline.runner import run_job

    cfg = _config([f"source.path={args.source}", f"sink.path={args.sink}", f"run.run_id={args.run_id}",
                   "run.ds=2026-11-29", "run.progress=false", "run.summary_path=null",
                   *([f"spark.master={args.master}"] if args.master else []),
                   *(["sink.writer=" + args.writer] if args.writer else []), *args.set])
    with counting_reads() as reads:
        started = time.perf_counter()
        summary = run_job(cfg, out=io.StringIO())
        wall = time.perf_counter() - started
    spark = SparkSession.getActiveSession()
    assert summary.complete, summary.incomplete
    stages = {k: round(v, 3) for k, v in summary.stage_seconds.items()}
    result = {"run_id": args.run_id, "wall_s": round(wall, 3), "rows": summary.rows_in, "writer": summary.writer,
              "stage_seconds": stages,
              "driver_s": round(sum(v for k, v in stages.items() if k != "inference and check"), 3),
              "spark_jobs": spark_jobs(spark, job=JOB, run_id=args.run_id, stages=BATCH_STAGES),
              "reads": reads.snapshot(), "sweeps": sweep_log_entries(args.sink, f"{args.sink}_quarantine")}
    result["spark_jobs_total"] = sum(result["spark_jobs"].values())
    if args.list_jobs:
        result["jobs"] = [f"{i} {d.split(': ', 1)[-1]} <- {name}" for i, d, name in
                          job_names(spark, run_id=args.run_id)]
    return result


def batch(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``--runs`` runs of the demo job over the same rows and ds, each in a process of its own (as ``make demo``
    run again): each one's stages, Spark jobs and reads."""
    import shlex
    import subprocess

    source = _documents(work, args.rows, 1, "documents")
    sink = work / "document_scores"
    launcher = [sys.executable]
    if args.launcher == "spark-submit":
        # the Delta jars on the driver's class path and that class path's archive, as make demo passes them
        # (--spark-jars: in spark.jars as before 2026-12-07; no archive under --set spark.class_archive=false)
        jar_args = [] if args.spark_jars else ["--local", "delta"]  # before: every cached group, S3A's too
        jars = subprocess.run([sys.executable, "-m", "pipeline.spark.jars", "submit-args", *jar_args],
                              capture_output=True, text=True, check=True).stdout
        archive = "" if "spark.class_archive=false" in args.set else subprocess.run(
            [sys.executable, "-m", "pipeline.spark.class_archive", "submit-args", *([] if args.spark_jars else
                                                                                    ["delta"])],
            capture_output=True, text=True, check=True).stdout
        launcher = [str(Path(sys.executable).parent / "spark-submit"), *shlex.split(jars), *shlex.split(archive),
                    "--master",
                    args.master or "local[*,4]", "--driver-memory", "2g", "--conf", "spark.ui.enabled=false",
                    "--conf", "spark.ui.showConsoleProgress=false", "--conf", "spark.log.level=WARN",
                    "--conf", f"spark.databricks.delta.snapshotPartitions={os.cpu_count() or 2}"]
    runs = []
    for n in range(args.runs):
        command = [*launcher, str(Path(__file__).resolve()), "one", "--source", source, "--sink", str(sink),
                   "--run-id", f"bench-driver-{n}", *(["--writer", args.writer] if args.writer else []),
                   *(["--master", args.master] if args.master and args.launcher == "python" else []),
                   *(["--list-jobs"] if args.list_jobs else []), *[f"--set={x}" for x in args.set]]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0 or "RESULT " not in done.stdout:
            raise SystemExit(f"run {n} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        result = {"run": n, **json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])}
        runs.append(result)
        print(json.dumps(result), flush=True)
    for r in runs:
        print(f"run {r['run']} ({r['writer']}): driver stages {r['driver_s']:.1f} s of {r['wall_s']:.1f} s wall; "
              f"{r['spark_jobs_total']} Spark jobs {r['spark_jobs']}; reads {r['reads']}; sweeps {r['sweeps']}")
    return {"runs": runs}


class _Lines(io.TextIOBase):
    """The run's output, each micro-batch line kept with the Spark jobs and reads counted so far."""

    def __init__(self, on_batch: Any) -> None:
        self.on_batch, self.buffer = on_batch, ""

    def write(self, text: str) -> int:
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            # (a line without the inference seconds, as older versions print it, counts them as 0)
            if (m := re.search(r"micro-batch (\d+): ([\d,]+) rows in.* in ([\d.,]+) s \((?:([\d.,]+) s inference)?",
                               line)):
                self.on_batch(int(m[1]), int(m[2].replace(",", "")), float(m[3].replace(",", "")),
                              float((m[4] or "0").replace(",", "")))
        return len(text)


def stream(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A ``processing_time`` stream of ``--micro-batches`` micro-batches of ``--batch-rows`` rows."""
    from pipeline.runner import run_job

    source = _documents(work, args.micro_batches * args.batch_rows, args.micro_batches, "arrivals")
    run_id = "bench-driver-stream"
    cfg = _config([f"source.path={source}", f"sink.path={work / 'scores'}", "sink.mode=append",
                   f"run.run_id={run_id}", "run.ds=2026-11-29", "run.progress=false", "run.summary_path=null",
                   *([f"spark.master={args.master}"] if args.master else []),
                   f"source.stream.checkpoint_path={work / 'checkpoint'}",
                   "source.stream.trigger=processing_time", f"source.stream.interval_s={args.interval_s}",
                   "source.stream.starting_version=0", "source.stream.max_files_per_trigger=1",
                   "source.stream.record_every_s=100000", *(["sink.writer=" + args.writer] if args.writer else []),
                   *args.set])
    batches: list[dict[str, Any]] = []
    before = {"jobs": 0, "reads": {}}

    def on_batch(batch_id: int, rows: int, seconds: float, infer: float) -> None:
        from pyspark import SparkContext

        from pipeline.spark.job_labels import run_tag

        sc = SparkContext._active_spark_context._jsc.sc()  # this runs in the foreachBatch thread
        sc.listenerBus().waitUntilEmpty()
        jobs = len(sc.statusTracker().getJobIdsForTag(run_tag(run_id)))
        now = reads.snapshot()
        batches.append({"batch_id": batch_id, "rows": rows, "seconds": seconds, "infer_s": infer,
                        "fixed_s": round(seconds - infer / args.workers, 3), "spark_jobs": jobs - before["jobs"],
                        "reads": {k: v - before["reads"].get(k, 0) for k, v in now.items()
                                  if v - before["reads"].get(k, 0)}})
        before.update(jobs=jobs, reads=now)
        if batch_id % 20 == 0:
            print(json.dumps(batches[-1]), flush=True)
        if len([b for b in batches if b["rows"]]) >= args.micro_batches:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()

    from pipeline.errors import RunStopped

    with counting_reads() as reads:
        try:
            run_job(cfg, out=_Lines(on_batch))
        except RunStopped:
            pass
    full = [b for b in batches if b["rows"]]
    w = min(args.window, len(full) // 2 or 1)
    first, last = full[:w], full[-w:]
    med = lambda rows, key: round(statistics.median(b[key] for b in rows), 3)  # noqa: E731
    report = {"micro_batches": len(full), "window": w,
              "first": {k: med(first, k) for k in ("seconds", "fixed_s", "spark_jobs")},
              "last": {k: med(last, k) for k in ("seconds", "fixed_s", "spark_jobs")},
              "sweeps": sweep_log_entries(work / "scores", work / "scores_quarantine"), "batches": full}
    print(f"{len(full)} micro-batches of {args.batch_rows} rows: first {w} {report['first']}, last {w} "
          f"{report['last']} (medians: seconds, fixed seconds, Spark jobs); sweeps {report['sweeps']}")
    print(f"reads, first micro-batch: {full[0]['reads']}; last: {full[-1]['reads']}")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("batch", "stream", "one"), help="one: a single run, what batch starts")
    parser.add_argument("--spark-jars", action="store_true",
                        help="spark-submit: the Delta jars in spark.jars (--jars) and the jar-free class archive, "
                        "as make demo passed them before the jars went on the driver's class path")
    parser.add_argument("--launcher", choices=("python", "spark-submit"), default="python",
                        help="batch: each run as `python` or as `spark-submit` with the Delta jars (as make demo)")
    parser.add_argument("--source", help="one: the source table")
    parser.add_argument("--sink", help="one: the output table")
    parser.add_argument("--run-id", help="one: the run id")
    parser.add_argument("--rows", type=int, default=5000, help="batch: demo documents (5,000, as make demo)")
    parser.add_argument("--runs", type=int, default=2, help="batch: runs over the same rows and ds (2)")
    parser.add_argument("--micro-batches", type=int, default=200, help="stream: appends, a micro-batch each (200)")
    parser.add_argument("--batch-rows", type=int, default=100, help="stream: rows per append (100)")
    parser.add_argument("--interval-s", type=float, default=0.1, help="stream: processing_time interval (0.1 s)")
    parser.add_argument("--window", type=int, default=20, help="stream: first and last micro-batches compared (20)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                        help="stream: inference seconds are spread over this many workers (the cores)")
    parser.add_argument("--master", default=None, help="the session's master (default: the config's local[*]; "
                        "spark-submit: local[*,4])")
    parser.add_argument("--writer", choices=("delta", "deltalake"), default=None,
                        help="sink.writer (default: the connector when the session has it)")
    parser.add_argument("--set", action="append", default=[], help="more config overrides, key=value")
    parser.add_argument("--list-jobs", action="store_true", help="batch: each Spark job's stage and call site")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    if args.what == "one":
        print("RESULT " + json.dumps(one_run(args)), flush=True)
        return 0
    demo_table()
    info = cpu_info()
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    print(f"# driver bench {dt.date.today()} ({args.what}): {info['model']}, {info['cores']} cores ({flags}); load "
          f"average {info['load_average']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-driver-") as tmp:
        results = (batch if args.what == "batch" else stream)(args, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps({"date": dt.date.today().isoformat(), "machine": info,
                                               "what": args.what, "args": vars(args), **results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
