"""The endpoint backend against the in-process vLLM backend: rows/s and tokens/s on the same prompts, by width.

    make bench-endpoint                     # 200 reviews, widths 1/4/16, in the vLLM environment
    PYTHONPATH=. .venv-vllm/bin/python bench/bench_endpoint.py --rows 200 --widths 1,4,16 --repeats 1

Both run the extract job's task (conf/extract_fields.yaml: its template, system prompt and JSON Schema,
greedy, SmolLM2-135M-Instruct in fp32, eager) on the same Rotten Tomatoes reviews, in this one process
and without Spark, so the figures are the backends' own:

- ``vllm``: the task's vllm backend (one in-process ``vllm.LLM``, ``max_num_seqs`` = the width, its
  structured outputs for the schema);
- ``endpoint``: the task's endpoint backend (httpx, ``concurrency`` = the width) against vLLM's OpenAI
  server (``python -m vllm.entrypoints.openai.api_server``, started once on 127.0.0.1 with
  ``--max-num-seqs`` = the largest width, ``response_format: json_schema``).

Timed: ``process`` of the whole chunk of rows (engine build, server start and a 2-row warm-up
excluded; the server's start is reported). The two run one after the other, never at once, in
alternating order per repeat, so both see the same machine; while the in-process engine runs, the
server's process group is paused (SIGSTOP, then SIGCONT): idle, its CPU worker still spun about a third
of a core here, which the in-process runs would otherwise pay for; ``rows/s`` counts every row,
``tokens/s`` the completion tokens (``all tokens/s``: prompt + completion). Also reported: rows ``ok``
(valid against the schema) and how many completions the two backends agree on, row for row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"


def _machine() -> dict[str, str]:
    flags = subprocess.run("grep -o 'avx512[a-z_0-9]*\\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\\n' ' '",
                           shell=True, capture_output=True, text=True).stdout.strip()
    return {"cpu_flags": flags, "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "cores": str(os.cpu_count()), "python": platform.python_version()}


def _task(backend: str, width: int, url: str | None, key: str | None):
    from pipeline.config import BatchingConfig, load_config
    from pipeline.tasks import build_task

    job = load_config("conf/extract_fields.yaml")
    settings = job.task.model_dump()
    # the KV cache given outright: at one sequence vLLM 0.32 refused the exact size engine_kwargs plans (it found
    # room for 384 of the 448 tokens)
    settings.update(backend=backend, vllm={"max_num_seqs": width, "kv_cache_mb": 64 + 32 * width},
                    max_kv_cache_mb=None)
    if backend == "endpoint":
        settings["endpoint"] = {"base_url": url, "model": "smollm2", "api_key": key, "concurrency": width,
                                "timeout_s": 600}
    config = type(job.task).model_validate(settings)
    return build_task(config, model=job.model.model_copy(update={"path": DEFAULT_MODEL}), batching=BatchingConfig())


def _run(task, loaded, texts: list[str]) -> dict[str, float]:
    import pyarrow as pa

    from pipeline.core.metrics import WorkerCounts

    chunk = pa.RecordBatch.from_pydict({"text": texts})
    counts = WorkerCounts()
    started = time.perf_counter()
    out = task.process(loaded, chunk, counts).to_pydict()
    seconds = time.perf_counter() - started
    completion = sum(out["completion_tokens"][i] or 0 for i in range(len(texts)))
    prompt = sum(out["prompt_tokens"][i] or 0 for i in range(len(texts)))
    return {"seconds": seconds, "rows_per_s": len(texts) / seconds, "tokens_per_s": completion / seconds,
            "all_tokens_per_s": (prompt + completion) / seconds, "ok": out["status"].count("ok"),
            "completion_tokens": completion, "prompt_tokens": prompt, "completions": out["completion"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--widths", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--wheels", default=".cache/wheels")
    parser.add_argument("--json", default="bench/results_endpoint.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generate import review_texts

    import signal

    from pipeline.demo.served import start_vllm_server, stop_vllm_server

    widths = [int(w) for w in args.widths.split(",")]
    texts = review_texts(args.rows, 0, args.wheels)
    key = "sk-bench-" + os.urandom(6).hex()
    machine = _machine()
    print(f"machine: {machine}", flush=True)
    results: dict[str, dict[str, list[dict[str, float]]]] = {"vllm": {}, "endpoint": {}}
    started = time.perf_counter()
    server, url = start_vllm_server(DEFAULT_MODEL, name="smollm2", api_key=key, max_model_len=512,
                                    max_num_seqs=max(widths))
    try:
        server_start_s = time.perf_counter() - started
        print(f"vLLM's OpenAI server up in {server_start_s:.1f} s at {url}", flush=True)
        for repeat in range(args.repeats):
            for width in widths:
                order = ("vllm", "endpoint") if (repeat + width) % 2 == 0 else ("endpoint", "vllm")
                for backend in order:
                    os.killpg(server.pid, signal.SIGCONT if backend == "endpoint" else signal.SIGSTOP)
                    task = _task(backend, width, url, key)
                    loaded = task.load(Path(DEFAULT_MODEL) if backend == "vllm" else None, "cpu")
                    _run(task, loaded, texts[:2])  # warm-up through the timed path
                    result = _run(task, loaded, texts)
                    results[backend].setdefault(str(width), []).append(result)
                    print(f"repeat {repeat} width {width:>2} {backend:<8}: {result['rows_per_s']:6.2f} rows/s "
                          f"{result['tokens_per_s']:7.1f} tokens/s, ok {result['ok']}/{len(texts)} "
                          f"({result['seconds']:.1f} s; {os.getloadavg()[0]:.1f} load)", flush=True)
                    if backend == "vllm":
                        from pipeline.generation.vllm_backend import shutdown_engine

                        shutdown_engine()
    finally:
        os.killpg(server.pid, signal.SIGCONT)
        stop_vllm_server(server)
    summary = _summarize(results, widths)
    for line in summary["table"]:
        print(line)
    Path(args.json).write_text(json.dumps({"machine": machine, "rows": args.rows, "widths": widths,
                                           "repeats": args.repeats, "server_start_s": round(server_start_s, 1),
                                           "summary": summary["rows"],
                                           "runs": {b: {w: [{k: v for k, v in r.items() if k != "completions"}
                                                            for r in rs] for w, rs in ws.items()}
                                                    for b, ws in results.items()}}, indent=2))
    print(f"-> {args.json}")
    return 0


def _summarize(results: dict, widths: list[int]) -> dict:
    def med(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}" + (f" ({min(values):.2f}-{max(values):.2f})" if len(values) > 1 else "")

    rows, table = [], ["| width | backend | rows/s | tokens/s | all tokens/s | ok rows | endpoint/vllm tokens/s | "
                       "completions equal |", "|---|---|---|---|---|---|---|---|"]
    for width in widths:
        ours, base = results["endpoint"][str(width)], results["vllm"][str(width)]
        ratio = [e["tokens_per_s"] / v["tokens_per_s"] for e, v in zip(ours, base)]
        same = sum(a == b for a, b in zip(ours[0]["completions"], base[0]["completions"]))
        for name, runs in (("vllm", base), ("endpoint", ours)):
            row = {"width": width, "backend": name, "rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
                   "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
                   "ok": runs[0]["ok"], "ratio": statistics.median(ratio), "same": same}
            rows.append(row)
            table.append(f"| {width} | {name} | {med([r['rows_per_s'] for r in runs])} | "
                         f"{med([r['tokens_per_s'] for r in runs])} | {med([r['all_tokens_per_s'] for r in runs])} | "
                         f"{runs[0]['ok']} | {med(ratio) if name == 'endpoint' else ''} | "
                         f"{same if name == 'endpoint' else ''} |")
    return {"rows": rows, "table": table}


if __name__ == "__main__":
    raise SystemExit(main())
