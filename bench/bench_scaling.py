"""The cost of everything but the model: ``run_job`` over 100k..10M rows with a task that does no model work.

    make bench-scaling                       # 100k and 1M rows (3 runs each), the task sweep, commit sizes
    make bench-scaling BENCH_ARGS=--full     # adds 10M rows (one run; ~1.3 GB of source text)
    PYTHONPATH=. .venv/bin/python bench/bench_scaling.py --sizes 20000 --repeats 1 --commit-scale 1000

The task kind ``bench_hash_score`` (registered by :func:`register` through
:func:`pipeline.registry.register_task`, so nothing bench-only ships in
``pipeline/tasks`` or the docs' config reference) scores each row with a CRC-32 of its text: microseconds per
row, so what is left is the pipeline's own path: read the Delta source, count
and plan, hash-repartition by id, Arrow to and from the Python workers, the
content hash, persist, the Parquet files, the driver's one Delta commit, and
the read-back checks. Each run is a fresh ``local[2]`` Spark session in a
subprocess, so the driver's memory peaks (JVM and Python) are that run's own.

Reported per run: wall seconds split into before the write (session, source
listing, count, plan), the write (scoring + files + commit) and after it
(read-back checks, summary); the task's own seconds; tasks, files and bytes of
the commit, the commit's ``_delta_log`` JSON bytes, the pickled size of the
commit messages the driver receives (one per write task, rebuilt from the
committed add actions), the time from the last data file to the commit, and
peak RSS of the driver JVM, the driver Python and the Python workers.

``--task-sweep`` runs one size at several ``spark.rows_per_task`` values: the
slope of wall time over tasks is the cost of one task. ``--commit-scale``
commits N synthetic add actions (copies of a real one) into a fresh table and
then replaces them (the nightly ``overwrite_partition``: N removes + N adds),
in a subprocess each, to measure the driver's commit at 1 billion rows without
writing 1 billion rows. Results: ``bench/results_scaling.json``; the reading
in ``docs/scaling.md``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.config import TaskConfig
from pipeline.registry import ModelInfo, register_task
from pipeline.core.rows import STATUS_FIELDS
from pipeline.tasks.job import TaskJob

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = "warehouse/demo/documents"


# ----------------------------------------------------------------------------------- the task kind
class HashScoreConfig(TaskConfig):
    """A benchmark task without a model: each row's score is a CRC-32 of its text (bench/bench_scaling.py)."""

    kind: Literal["bench_hash_score"] = "bench_hash_score"
    salt: int = Field(0, description="mixed into every score (a different salt, different scores)")


class HashScoreTask:
    """``score`` = crc32(salt, text) / 2**32 in [0, 1); null and blank texts flagged like the text tasks do."""

    kind = "bench_hash_score"
    input_columns = ("text",)

    def __init__(self, config: HashScoreConfig, *, model: Any, batching: Any) -> None:
        self.config = config

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field("score", pa.float64()), *STATUS_FIELDS])

    def cache_key(self) -> Any:
        return (self.kind, self.config.salt)

    def resolve_model_dir(self, spec: str) -> Path:
        return Path(spec)  # there is no model: nothing to resolve or check

    def load(self, model_dir: Path, device: str) -> dict[str, Any]:
        return {"salt": self.config.salt.to_bytes(8, "little", signed=True)}

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: Any) -> pa.RecordBatch:
        texts = chunk.column(0).to_pylist()
        salt = zlib.crc32(loaded["salt"])
        n = len(texts)
        score = np.full(n, np.nan)
        status = ["ok"] * n
        for i, text in enumerate(texts):
            if text is None:
                status[i] = "skipped_null"
            elif not text.strip():
                status[i] = "skipped_empty"
            else:
                score[i] = zlib.crc32(text.encode(), salt) / 2**32
        counts.add("rows", n)
        counts.add("chunks")
        counts.add_status({s: status.count(s) for s in set(status)})
        return pa.RecordBatch.from_arrays(
            [pa.array(score, pa.float64(), mask=np.isnan(score)), pa.array(np.zeros(n, np.int32)),
             pa.array(np.zeros(n, bool)), pa.array(status, pa.string()), pa.nulls(n, pa.string())],
            schema=self.output_schema())


class HashScoreJob(TaskJob):
    def model_info(self, config: Any, task: Any) -> ModelInfo:
        return ModelInfo(config.model.path, "crc32", "v1")


def register() -> None:
    """Register ``bench_hash_score`` (idempotent). Not at import: a bench kind stays out of the product's docs.

    Called from this module's importable name (``bench.bench_scaling``), never from ``__main__``:
    Spark's workers import the task class by reference.
    """
    register_task(HashScoreConfig, HashScoreTask, job=HashScoreJob())


def expected_score(text: str, salt: int = 0) -> float:
    """The score :class:`HashScoreTask` gives ``text`` (for checks)."""
    return zlib.crc32(text.encode(), zlib.crc32(salt.to_bytes(8, "little", signed=True))) / 2**32


# ----------------------------------------------------------------------------------- the source
def corpus_texts(corpus: str | None) -> pa.Array:
    """The demo corpus's texts (``make demo-data``), else deterministic synthetic sentences of similar length."""
    if corpus and Path(corpus, "_delta_log").is_dir():
        from deltalake import DeltaTable

        texts = DeltaTable(corpus).to_pyarrow_table(columns=["text"])["text"].combine_chunks()
        return texts.filter(texts.is_valid())
    rng = np.random.default_rng(0)
    words = np.array("the a film review plot cast scene slow sharp warm dull bright story ends".split())
    return pa.array([" ".join(rng.choice(words, size=int(n))) for n in rng.integers(5, 40, size=20_000)])


def build_source(path: Path, rows: int, *, files: int, corpus: pa.Array) -> dict[str, Any]:
    """A Delta table of ``rows`` rows (``doc_id``, ``text``) in ``files`` Parquet files, one append each."""
    from deltalake import write_deltalake

    started = time.perf_counter()
    per_file = -(-rows // files)
    for start in range(0, rows, per_file):
        stop = min(rows, start + per_file)
        ids = pa.array([f"d{i:010d}" for i in range(start, stop)], pa.string())
        texts = corpus.take(pa.array(np.arange(start, stop) % len(corpus)))
        write_deltalake(str(path), pa.table({"doc_id": ids, "text": texts}), mode="append")
    size = sum(os.path.getsize(f) for f in glob.glob(str(path / "*.parquet")))
    return {"rows": rows, "files": files, "bytes": size, "seconds": round(time.perf_counter() - started, 1)}


# ----------------------------------------------------------------------------------- one run
class _Stamped:
    """A text sink that remembers when the runner announced the write (its "scoring N rows" line)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.write_started: float | None = None

    def write(self, text: str) -> int:
        if self.write_started is None and "] run " in text and ": scoring " in text:
            self.write_started = time.perf_counter()
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def commit_facts(table: str, version: int) -> dict[str, Any]:
    """What commit ``version`` of ``table`` holds: files, bytes, rows, JSON bytes, pickled messages, latency."""
    from pipeline.io.delta.writer import DeltaWriteMessage

    log = Path(table, "_delta_log", f"{version:020d}.json")
    adds, removes, info = [], 0, {}
    for line in log.read_text().splitlines():
        action = json.loads(line)
        if "add" in action:
            adds.append(action["add"])
        elif "remove" in action:
            removes += 1
        elif "commitInfo" in action:
            info = action["commitInfo"]
    # the messages the driver received: one per write task (files named part-<task>-a<attempt>-...)
    by_task: dict[str, list[dict[str, Any]]] = {}
    for add in adds:
        tag = re.search(r"part-(\d+-a\d+)-", add["path"])
        by_task.setdefault(tag.group(1) if tag else add["path"], []).append({
            "path": add["path"], "size": add["size"], "partition_values": add["partitionValues"],
            "modification_time": add["modificationTime"], "data_change": add["dataChange"], "stats": add["stats"],
        })
    messages = [DeltaWriteMessage(adds=a, rows=sum(json.loads(x["stats"])["numRecords"] for x in a))
                for a in by_task.values()]
    last_file = max((a["modificationTime"] for a in adds), default=None)
    return {
        "files": len(adds), "removes": removes, "write_tasks": len(messages),
        "data_bytes": sum(a["size"] for a in adds),
        "rows": sum(m.rows for m in messages),
        "log_json_bytes": log.stat().st_size,
        "messages_pickled_bytes": sum(len(pickle.dumps(m)) for m in messages),
        "last_file_to_commit_s": (info.get("timestamp", 0) - last_file) / 1000 if last_file else None,
    }


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.split("/")[2]))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _peak_rss_mb(pid: int | str) -> float:
    """VmHWM: the process's peak resident memory, in MiB (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    found = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(found.group(1)) / 1024 if found else 0.0


def memory_peaks() -> dict[str, float]:
    """Peak RSS in MiB of this driver's Python, its JVM (driver and, on local[N], the executors) and Python workers."""
    jvm = workers = 0.0
    for pid in _descendants(os.getpid()):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if os.path.basename(exe).startswith("java"):
            jvm = max(jvm, _peak_rss_mb(pid))
        elif "python" in os.path.basename(exe):
            workers = max(workers, _peak_rss_mb(pid))
    return {"driver_python_mb": round(_peak_rss_mb("self"), 1), "jvm_mb": round(jvm, 1),
            "python_worker_max_mb": round(workers, 1)}


def job_config(source: str, out: str, *, rows_per_task: int | None = None, master: str = "local[2]") -> Any:
    """The hash task's job: the Delta table ``source`` (``doc_id``, ``text``) into the Delta table ``out``."""
    from pipeline.config import build_config

    spark_conf: dict[str, Any] = {"master": master}
    if rows_per_task:
        spark_conf["rows_per_task"] = rows_per_task
    return build_config({
        "job": "bench_scaling", "spark": spark_conf,
        "source": {"format": "delta", "path": str(source), "id_column": "doc_id"},
        "model": {"path": "none"}, "task": {"kind": "bench_hash_score"},
        "sink": {"path": str(out), "mode": "overwrite_partition", "partition_by": ["ds"]},
        "run": {"progress": False, "sample_rows": 0, "ds": "2026-12-01", "run_id": "bench-scaling",
                "runs_path": str(Path(out).parent / "runs")},
    })


def run_once(source: str, out: str, *, rows_per_task: int | None, master: str, driver_memory: str) -> dict[str, Any]:
    """One ``run_job`` of the hash task from ``source`` into ``out``, in a fresh Spark session (this process)."""
    from pipeline.config import SparkConfig
    from pipeline.runner import run_job
    from pipeline.spark.session import get_session

    started = time.perf_counter()
    spark = get_session(SparkConfig(master=master, app_name="bench_scaling", conf={
        "spark.driver.memory": driver_memory}))
    session_s = time.perf_counter() - started
    config = job_config(source, out, rows_per_task=rows_per_task, master=master)
    stamped = _Stamped()
    job_started = time.perf_counter()
    summary = run_job(config, spark=spark, out=stamped)
    wall = time.perf_counter() - job_started
    memory = memory_peaks()
    spark.stop()
    before = (stamped.write_started or job_started) - job_started
    result = {
        "rows": summary.rows_in, "rows_out": summary.rows_out, "complete": summary.complete, "tasks": summary.tasks,
        "session_s": round(session_s, 2), "wall_s": round(wall, 2), "before_write_s": round(before, 2),
        "write_s": round(summary.seconds, 2), "after_write_s": round(wall - before - summary.seconds, 2),
        "task_process_s": round(summary.infer_seconds, 2), "load_s": round(summary.load_seconds, 3),
        "rows_per_s": round(summary.rows_in / wall, 1),
        "commit": commit_facts(out, summary.delta_version or 0), "memory": memory,
    }
    return result


def commit_scale_once(adds: int, template: dict[str, Any], root: str) -> dict[str, Any]:
    """Commit ``adds`` copies of the add action ``template`` to a fresh table, then replace them all (this process)."""
    from deltalake import CommitProperties, DeltaTable
    from deltalake import Schema as DeltaSchema
    from deltalake.transaction import AddAction, create_table_with_add_actions

    from pipeline.io.delta.writer import DeltaWriteMessage

    schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(template.pop("schema_hex"))))
    path = Path(root, f"commit-{adds}")
    shutil.rmtree(path, ignore_errors=True)

    def actions(round_: int) -> list[dict[str, Any]]:
        return [{**template, "path": f"ds=2026-12-01/part-{i:06d}-a0-{round_:02d}{'0' * 30}.snappy.parquet"}
                for i in range(adds)]

    first = actions(0)
    messages = [DeltaWriteMessage(adds=[a], rows=1) for a in first]
    pickled = sum(len(pickle.dumps(m)) for m in messages)
    t0 = time.perf_counter()
    create_table_with_add_actions(str(path), DeltaSchema.from_arrow(schema), [AddAction(**a) for a in first],
                                  mode="append", partition_by=["ds"], commit_properties=CommitProperties())
    create_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    table = DeltaTable(str(path))
    load_s = time.perf_counter() - t0
    second = [AddAction(**a) for a in actions(1)]
    t0 = time.perf_counter()
    table.create_write_transaction(second, "overwrite", schema, partition_by=["ds"],
                                   partition_filters=[("ds", "=", "2026-12-01")], commit_properties=CommitProperties())
    replace_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    listed = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).num_rows
    list_s = time.perf_counter() - t0
    logs = sorted(Path(path, "_delta_log").glob("*.json"))
    result = {
        "adds": adds, "messages_pickled_bytes": pickled, "commit_s": round(create_s, 3),
        "log_json_bytes": logs[0].stat().st_size, "open_table_s": round(load_s, 3),
        "replace_commit_s": round(replace_s, 3), "replace_log_json_bytes": logs[-1].stat().st_size,
        "list_files_s": round(list_s, 3), "files_listed": listed,
        "driver_python_peak_mb": round(_peak_rss_mb("self"), 1),
    }
    shutil.rmtree(path, ignore_errors=True)
    return result


def _subprocess(args: list[str], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
           "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable)}
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{args[0]} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------------- reporting
def summarise(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [_dig(r, key) for r in runs]
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def _dig(run: dict[str, Any], key: str) -> Any:
    value: Any = run
    for part in key.split("."):
        value = value[part]
    return value


def fit_costs(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """Least squares of wall = fixed + per_row x rows + per_task x tasks over every run (seconds)."""
    if len({(r["rows"], r["tasks"]) for r in runs}) < 3:
        return None
    a = np.array([[1.0, r["rows"], r["tasks"]] for r in runs])
    b = np.array([r["wall_s"] for r in runs])
    (fixed, per_row, per_task), *_ = np.linalg.lstsq(a, b, rcond=None)
    return {"fixed_s": round(float(fixed), 2), "per_row_us": round(float(per_row) * 1e6, 3),
            "per_task_ms": round(float(per_task) * 1e3, 1)}


def machine() -> dict[str, Any]:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        flags = set(next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), []))
    except OSError:
        flags = set()
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "python": platform.python_version(),
            "flags": [f for f in wanted if f in flags]}


def _table(results: dict[str, Any]) -> str:
    head = ("| rows | tasks | runs | wall s (median, min-max) | before write | write | after | task's own s "
            "| rows/s | us/row | files | data MB | log JSON KB | messages KB | file->commit s | JVM MB | driver py MB |")
    lines = [head, "|" + "|".join("---:" for _ in range(head.count("|") - 1)) + "|"]
    for size in results["sizes"]:
        runs = size["runs"]
        wall = summarise(runs, "wall_s")
        med = {k: summarise(runs, k)["median"] for k in (
            "before_write_s", "write_s", "after_write_s", "task_process_s", "rows_per_s", "commit.files",
            "commit.data_bytes", "commit.log_json_bytes", "commit.messages_pickled_bytes",
            "commit.last_file_to_commit_s", "memory.jvm_mb", "memory.driver_python_mb")}
        lines.append(
            f"| {size['rows']:,} | {runs[0]['tasks']} | {len(runs)} | {wall['median']:.1f} ({wall['min']:.1f}-{wall['max']:.1f}) "
            f"| {med['before_write_s']:.1f} | {med['write_s']:.1f} | {med['after_write_s']:.1f} | {med['task_process_s']:.1f} "
            f"| {med['rows_per_s']:,.0f} | {wall['median'] / size['rows'] * 1e6:.1f} | {med['commit.files']:.0f} "
            f"| {med['commit.data_bytes'] / 2**20:.1f} | {med['commit.log_json_bytes'] / 1024:.1f} "
            f"| {med['commit.messages_pickled_bytes'] / 1024:.1f} | {med['commit.last_file_to_commit_s']:.2f} "
            f"| {med['memory.jvm_mb']:.0f} | {med['memory.driver_python_mb']:.0f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma list of row counts")
    parser.add_argument("--full", action="store_true", help="add 10,000,000 rows (one run)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size below 10M rows (medians reported)")
    parser.add_argument("--task-sweep", default="100000:1000,10000,100000",
                        help="ROWS:RPT,RPT,...: one run per spark.rows_per_task value at ROWS rows ('' to skip)")
    parser.add_argument("--commit-scale", default="1000,10000,100000",
                        help="comma list of synthetic add-action counts to commit ('' to skip)")
    parser.add_argument("--rows-per-file", type=int, default=500_000, help="source table: rows per Parquet file")
    parser.add_argument("--corpus", default=DEFAULT_CORPUS, help="Delta table whose texts fill the source")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--work", default=None, help="folder for the tables (default: a temp folder, removed)")
    parser.add_argument("--out", default="bench/results_scaling.json")
    args = parser.parse_args(argv)

    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.full and 10_000_000 not in sizes:
        sizes.append(10_000_000)
    work = Path(args.work or tempfile.mkdtemp(prefix="sbi-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = corpus_texts(args.corpus)
    results: dict[str, Any] = {"machine": machine(), "master": args.master, "driver_memory": args.driver_memory,
                               "corpus": args.corpus if Path(args.corpus, "_delta_log").is_dir() else "synthetic",
                               "mean_text_chars": round(float(np.mean([len(t) for t in corpus.to_pylist()])), 1),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "load_average_start": os.getloadavg(), "sizes": [], "task_sweep": [], "commit_scale": []}

    def source_for(rows: int) -> tuple[Path, dict[str, Any]]:
        path = work / f"source-{rows}"
        if not Path(path, "_delta_log").is_dir():
            files = max(2, -(-rows // args.rows_per_file))
            built = build_source(path, rows, files=files, corpus=corpus)
            print(f"source {rows:,} rows: {built}", flush=True)
        else:
            built = {"rows": rows, "reused": True}
        return path, built

    template: dict[str, Any] = {}
    progress: list[dict[str, Any]] = []

    def one(rows: int, rows_per_task: int | None, label: str) -> dict[str, Any]:
        path, _ = source_for(rows)
        out = work / f"out-{label}"
        shutil.rmtree(out, ignore_errors=True)
        load_before = os.getloadavg()
        run = _subprocess(["_run", str(path), str(out), str(rows_per_task or 0), args.master, args.driver_memory],
                          timeout=3600)
        run["load_average"] = [round(x, 2) for x in (load_before[0], os.getloadavg()[0])]
        run["label"] = label
        progress.append(run)
        Path(args.out).write_text(json.dumps({**results, "partial": progress}, indent=1))  # a cut-short run keeps its data
        if not template:
            template.update(add_template(out))
        shutil.rmtree(out, ignore_errors=True)
        print(f"{label}: {json.dumps(run)}", flush=True)
        return run

    try:
        for rows in sizes:
            _, built = source_for(rows)
            repeats = 1 if rows >= 10_000_000 else args.repeats
            runs = [one(rows, None, f"{rows}-{i}") for i in range(repeats)]
            results["sizes"].append({"rows": rows, "source": built, "runs": runs})
        if args.task_sweep:
            rows_s, _, rpts = args.task_sweep.partition(":")
            for rpt in [int(x) for x in rpts.split(",") if x]:
                results["task_sweep"].append(one(int(rows_s), rpt, f"sweep-{rows_s}-{rpt}"))
        if args.commit_scale and template:
            for n in [int(x) for x in args.commit_scale.split(",") if x]:
                scaled = _subprocess(["_commit", str(n), json.dumps(template), str(work)], timeout=3600)
                print(f"commit of {n:,} adds: {json.dumps(scaled)}", flush=True)
                results["commit_scale"].append(scaled)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)

    every = [r for s in results["sizes"] for r in s["runs"]] + results["task_sweep"]
    results["fit"] = fit_costs(every)
    results["load_average_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(results, indent=1))
    print()
    print(_table(results))
    if results["fit"]:
        print(f"\nfit over {len(every)} runs: wall = {results['fit']['fixed_s']} s + {results['fit']['per_row_us']} us "
              f"x rows + {results['fit']['per_task_ms']} ms x tasks")
    for c in results["commit_scale"]:
        print(f"commit {c['adds']:>7,} adds: {c['commit_s']:.2f} s, log {c['log_json_bytes'] / 2**20:.1f} MiB, "
              f"messages {c['messages_pickled_bytes'] / 2**20:.1f} MiB; replace {c['replace_commit_s']:.2f} s; "
              f"open {c['open_table_s']:.2f} s; list {c['list_files_s']:.2f} s; peak {c['driver_python_peak_mb']:.0f} MiB")
    print(f"\nresults: {args.out}")
    return 0


def add_template(table: Path) -> dict[str, Any]:
    """One real add action of ``table``'s last commit, and the table's schema (for the synthetic commits)."""
    from deltalake import DeltaTable

    log = sorted(Path(table, "_delta_log").glob("*.json"))[-1]
    add = next(a["add"] for a in map(json.loads, log.read_text().splitlines()) if "add" in a)
    schema = pa.schema(DeltaTable(str(table)).schema().to_arrow())
    return {"size": add["size"], "partition_values": add["partitionValues"],
            "modification_time": add["modificationTime"], "data_change": True, "stats": add["stats"],
            "schema_hex": schema.serialize().to_pybytes().hex()}


def _entry(argv: list[str]) -> int:
    register()
    if argv and argv[0] == "_run":
        source, out, rpt, master, memory = argv[1:6]
        print(json.dumps(run_once(source, out, rows_per_task=int(rpt) or None, master=master, driver_memory=memory)))
        return 0
    if argv and argv[0] == "_commit":
        print(json.dumps(commit_scale_once(int(argv[1]), json.loads(argv[2]), argv[3])))
        return 0
    return main(argv)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from bench import bench_scaling as _module  # the kind's classes under an importable name

    sys.exit(_module._entry(sys.argv[1:]))
