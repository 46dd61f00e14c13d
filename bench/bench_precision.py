"""Quantized against fp32, per task, in one run: docs/s or tokens/s ratios and the agreement figures.

    make bench-precision                                   # a few minutes on 2 cores
    PYTHONPATH=. .venv/bin/python bench/bench_precision.py --rows 20000 --repeats 3   # the issue's 20,000 rows

Encoders (``embed``): ``run_job`` of ``conf/score_documents.yaml`` (the real all-MiniLM-L6-v2, zero-shot
positive/negative labels, batch 64, max length 256) on ``local[2]``, one torch thread per worker, over
``--rows`` rows of news articles and reviews (``pipeline.demo.news.news_and_reviews``: half Lee-corpus
news, half Rotten Tomatoes reviews), read from and written to Delta, at fp32 and at int8 (ONNX Runtime,
``pipeline.models.onnx_int8``) with the default accuracy gate calibrating on the job's own rows. The
int8 graph is exported before the timed runs (once per model revision: later runs load it). Agreement
is over every row of the two runs' outputs: embedding cosine, and the zero-shot top label. The time is
the summary's run time (Spark session start excluded); runs alternate fp32/int8, order reversed on
every other repeat.

Generation (``extract``, ``generate``): in this process (no Spark: the backend is what differs), one
torch / llama.cpp thread (one Spark worker's share of the cores), SmolLM2-135M-Instruct at fp32 on the
transformers backend against int4 (the packaged Q4_1 GGUF on llama.cpp), both continuous batching with
16 slots, greedy. ``extract`` is ``conf/extract_fields.yaml`` (JSON-schema constrained) on the first
``--extract-rows`` labelled reviews: tokens/s, valid rows, sentiment against the label
(``bench/bench_extract.py``'s scoring); ``generate`` is ``bench/bench_generate.py``'s prompts
(``--generate-rows`` reviews, max_new_tokens 8..64). Tokens/s counts completion tokens over the
task's time (prefill and decoding, model load excluded).

Every figure is a median of ``--repeats`` runs with its range; the CPU flags and ``uptime`` print at the
start and the end, so a noisy machine shows.
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
sys.path.insert(0, str(REPO / "bench"))

from bench_batching import run_demo_job  # noqa: E402  (the pipeline runner shared by the encoder benches)
from bench_extract import labelled_reviews, score_extract  # noqa: E402

LLM = ".cache/models/smollm2-135m-instruct"


def machine() -> str:
    flags = subprocess.run("grep -o 'avx512[a-z_0-9]*\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                           shell=True, capture_output=True, text=True).stdout.strip()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    return f"cpu flags: {flags or 'none'}\nuptime: {uptime}"


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


# ------------------------------------------------------------------------------------- encoders

def encoder_runs(rows: int, repeats: int, wheels: str) -> dict[str, Any]:
    """fp32 and int8 pipeline runs over ``rows`` news and review rows; rates per repeat and the outputs' agreement."""
    from deltalake import DeltaTable, write_deltalake
    import pyarrow as pa

    from pipeline.config import SparkConfig
    from pipeline.demo.news import news_and_reviews
    from pipeline.spark.session import get_session

    work = Path(tempfile.mkdtemp(prefix="sbi-bench-precision-"))
    try:
        docs = news_and_reviews(rows, wheel_dir=wheels)
        write_deltalake(str(work / "input"), pa.Table.from_pandas(docs, preserve_index=False))
        spark = get_session(SparkConfig(master="local[2]", app_name="bench-precision",
                                        arrow_max_records_per_batch=10_000))
        prepare_int8()
        rates: dict[str, list[float]] = {"fp32": [], "int8": []}
        scoring: dict[str, list[float]] = {"fp32": [], "int8": []}  # rows per second of the workers' task time
        summaries: dict[str, Any] = {}
        for repeat in range(repeats):
            for precision in (("fp32", "int8") if repeat % 2 == 0 else ("int8", "fp32")):
                out = work / f"out-{precision}"
                summary = run_demo_job(spark, [
                    f"source.path={work / 'input'}", f"sink.path={out}", "sink.mode=overwrite", "run.progress=false",
                    f"model.precision={precision}", "model.device=cpu",
                ], what=f"{precision} run")
                rates[precision].append(summary.rows_out / summary.seconds)
                workers = max(1, len(summary.model_loads))
                scoring[precision].append(summary.rows_out / (summary.infer_seconds / workers))
                if summary.precision_used:  # a reused worker loads nothing, so only a run that loaded has the gate's figures
                    summaries.setdefault(precision, summary)
                print(f"  embed {precision} repeat {repeat + 1}: {summary.rows_out:,} rows, {summary.seconds:.1f} s, "
                      f"{rates[precision][-1]:.1f} docs/s ({scoring[precision][-1]:.1f} after load: model load and gate "
                      f"{summary.load_seconds / workers:.1f} s per worker); precision {summary.precision_used} "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        spark.stop()
        agreement = output_agreement(DeltaTable(str(work / "out-fp32")), DeltaTable(str(work / "out-int8")))
        return {"rates": rates, "scoring": scoring, "agreement": agreement, "gate": summaries["int8"].precision_checks,
                "used": summaries["int8"].precision_used, "tokens": summaries["fp32"].tokens,
                "sources": docs["source"].value_counts().to_dict()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare_int8() -> None:
    """Export and quantise the demo model's int8 graph now (a no-op once cached), so no timed run pays for it."""
    from pipeline.config import AccuracyGateConfig, load_config
    from pipeline.models.loading import resolve_model_path
    from pipeline.tasks import build_task

    job = load_config(REPO / "conf/score_documents.yaml")
    model = job.model.model_copy(update={"precision": "int8", "accuracy_gate": AccuracyGateConfig(enabled=False)})
    started = time.perf_counter()
    loaded = build_task(job.task, model=model, batching=job.batching).load(resolve_model_path(job.model.path), "cpu")
    print(f"  int8 graph {loaded.model.path} ready in {time.perf_counter() - started:.1f} s", flush=True)


def output_agreement(fp32: Any, int8: Any) -> dict[str, float]:
    """Mean and 1st-percentile embedding cosine, and top-label agreement, over every row both runs scored."""
    import numpy as np

    cols = ["doc_id", "source", "embedding", "label"]
    a = fp32.to_pandas(columns=cols).set_index("doc_id")
    b = int8.to_pandas(columns=cols).set_index("doc_id").loc[a.index]
    scored = a["embedding"].notna() & b["embedding"].notna()
    ea, eb = (np.stack(x[scored].to_numpy()) for x in (a["embedding"], b["embedding"]))
    cosine = (ea * eb).sum(1) / (np.linalg.norm(ea, axis=1) * np.linalg.norm(eb, axis=1))
    out = {"rows": int(scored.sum()), "mean_cosine": float(cosine.mean()), "p1_cosine": float(np.percentile(cosine, 1)),
           "top_label_agreement": float((a["label"][scored] == b["label"][scored]).mean())}
    for source in sorted(a["source"].unique()):
        mask = (a["source"][scored] == source).to_numpy()
        out[f"mean_cosine_{source}"] = float(cosine[mask].mean())
        out[f"top_label_agreement_{source}"] = float((a["label"][scored][mask] == b["label"][scored][mask]).mean())
    return out


# ----------------------------------------------------------------------------------- generation

def generation_runs(args: argparse.Namespace) -> dict[str, Any]:
    """fp32 (transformers) and int4 (llama.cpp) on the extract and generate tasks, alternating, ``repeats`` times."""
    import torch

    torch.set_num_threads(args.threads)
    tasks = {"extract": extract_workload(args)}
    if args.generate_rows:
        tasks["generate"] = generate_workload(args)
    results: dict[str, Any] = {}
    for name, (build, chunk, labels) in tasks.items():
        loaded = {p: build(p) for p in ("fp32", "int4")}
        rates: dict[str, list[float]] = {"fp32": [], "int4": []}
        scores: dict[str, Any] = {}
        for repeat in range(args.repeats):
            for precision in (("fp32", "int4") if repeat % 2 == 0 else ("int4", "fp32")):
                task, state = loaded[precision]
                from pipeline.core.metrics import WorkerCounts

                counts = WorkerCounts()
                started = time.perf_counter()
                out = task.process(state, chunk, counts).to_pydict()
                seconds = time.perf_counter() - started
                rates[precision].append(counts.counts["completion_tokens"] / seconds)
                scores[precision] = score_extract(out, labels) if labels else {
                    "rows": len(out["status"]), "completion_tokens": counts.counts["completion_tokens"]}
                print(f"  {name} {precision} repeat {repeat + 1}: {counts.counts['completion_tokens']} tokens, "
                      f"{seconds:.1f} s, {rates[precision][-1]:.1f} tokens/s {scores[precision]} "
                      f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        results[name] = {"rates": rates, "scores": scores,
                         "backend": {p: loaded[p][1].load_counts["generation_backend"] for p in loaded}}
    return results


def extract_workload(args: argparse.Namespace) -> tuple[Any, Any, list[str]]:
    from pipeline.config import load_config
    from pipeline.tasks import build_task

    job = load_config(REPO / "conf/extract_fields.yaml")
    chunk, labels = labelled_reviews(str(REPO / job.source.path), args.extract_rows)

    def build(precision: str) -> tuple[Any, Any]:
        task = build_task(job.task.model_copy(update={"slots": args.slots, "backend": "auto"}),
                          model=job.model.model_copy(update={"path": str(REPO / LLM), "precision": precision}),
                          batching=job.batching)
        return task, task.load(REPO / LLM, "cpu")

    return build, chunk, labels


def generate_workload(args: argparse.Namespace) -> tuple[Any, Any, None]:
    import pyarrow as pa

    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.tasks import build_task
    from pipeline.tasks.generate import GenerateTaskConfig

    from bench_generate import DEFAULT_TEMPLATE, review_texts

    import random

    texts = review_texts(args.generate_rows, 0, args.wheels)
    rng = random.Random(0)
    budgets = [rng.randint(8, 64) for _ in texts]
    chunk = pa.RecordBatch.from_pydict({"text": texts, "budget": budgets})
    config = GenerateTaskConfig(template=DEFAULT_TEMPLATE, system_prompt="You are a helpful assistant.",
                                max_new_tokens_column="budget", slots=args.slots, max_input_tokens=384)

    def build(precision: str) -> tuple[Any, Any]:
        task = build_task(config, model=ModelConfig(path=str(REPO / LLM), precision=precision),
                          batching=BatchingConfig())
        return task, task.load(REPO / LLM, "cpu")

    return build, chunk, None


# ---------------------------------------------------------------------------------------- report

def report(enc: dict[str, Any] | None, gen: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"\n## Precision against fp32 (medians of {args.repeats} runs, min-max in brackets)\n")
    print("| task | precision | rate | vs fp32 | agreement with fp32 |")
    print("|---|---|---:|---:|---|")
    if enc:
        ag = enc["agreement"]
        for key, what in (("rates", "docs/s, run time"), ("scoring", "docs/s after model load and gate")):
            ratios = [i / f for i, f in zip(enc[key]["int8"], enc[key]["fp32"])]
            print(f"| embed ({args.rows:,} rows: {enc['sources']}) | fp32 | {spread(enc[key]['fp32'])} {what} | "
                  "1.00x | - |")
            print(f"| embed | int8 (onnxruntime; ran {enc['used']}) | {spread(enc[key]['int8'])} {what} | "
                  f"{spread(ratios, '{:.2f}')}x | mean cosine {ag['mean_cosine']:.4f} (1st pct {ag['p1_cosine']:.4f}), "
                  f"top label {ag['top_label_agreement']:.4f} over {ag['rows']:,} rows |")
    for name, res in gen.items():
        ratios = [i / f for i, f in zip(res["rates"]["int4"], res["rates"]["fp32"])]
        for precision in ("fp32", "int4"):
            s = res["scores"][precision]
            quality = (f"valid {s['valid_rows']}/{s['rows']}, sentiment = label {s['sentiment_accuracy_all_rows']:.3f}"
                       if "valid_rows" in s else f"{s['completion_tokens']} completion tokens")
            ratio = "1.00x" if precision == "fp32" else f"{spread(ratios, '{:.2f}')}x"
            print(f"| {name} ({s['rows']} prompts) | {precision} ({next(iter(res['backend'][precision]))}) | "
                  f"{spread(res['rates'][precision])} tokens/s | {ratio} | {quality} |")
    if enc:
        print("\nAccuracy gate at load (int8 run, per check: the loads that measured it):")
        for check, n in sorted(enc["gate"].items()):
            print(f"  {check} x{n}")
        ag = enc["agreement"]
        print("Agreement by source: " + ", ".join(f"{k} {v:.4f}" for k, v in ag.items()
                                                  if k.startswith(("mean_cosine_", "top_label_agreement_"))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="embed: news + review rows per pipeline run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--extract-rows", type=int, default=64, help="extract: labelled reviews")
    parser.add_argument("--generate-rows", type=int, default=64, help="generate: review prompts (0: skip)")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="generation threads (one Spark worker's share)")
    parser.add_argument("--skip-encoders", action="store_true")
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--wheels", default=str(REPO / ".cache/wheels"))
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    started = time.perf_counter()
    print(f"# precision bench\n{machine()}", flush=True)
    enc = None if args.skip_encoders else encoder_runs(args.rows, args.repeats, args.wheels)
    gen = {} if args.skip_generation else generation_runs(args)
    report(enc, gen, args)
    print(f"\n{machine()}\nbench wall time {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"encoders": enc, "generation": gen}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
