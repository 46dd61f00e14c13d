"""Train the two-tower recommender on the recs Delta tables and save a versioned model folder.

Usage::

    python jobs/train_recommender.py --warehouse warehouse/recs --models warehouse/models/two_tower
    python jobs/train_recommender.py --set epochs=3 --set holdout_per_user=1 --refit-full

Prints a JSON summary: the model folder, its revision, HitRate@10 / Recall@10
of the model and of the popularity baseline on each user's held-out latest
interactions. ``<models>/LATEST`` names the newest revision.
"""

from __future__ import annotations

import argparse
import json
import sys

from pydantic import ValidationError

from pipeline.config import ConfigError, parse_overrides
from pipeline.recs.config import TrainConfig
from pipeline.recs.train import train_and_save


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", default="warehouse/recs", help="folder with users/items/interactions")
    parser.add_argument("--models", default="warehouse/models/two_tower", help="model root (revisions + LATEST)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"training option, e.g. epochs=3 (options: {', '.join(TrainConfig.model_fields)})")
    parser.add_argument("--refit-full", action="store_true", help="save a refit on all interactions after evaluating")
    parser.add_argument("--quiet", action="store_true", help="no per-epoch log lines")
    args = parser.parse_args(argv)
    try:
        config = TrainConfig.model_validate(parse_overrides(args.overrides))
    except (ConfigError, ValidationError) as exc:
        print(f"error: invalid training option: {exc}", file=sys.stderr)
        return 2
    try:
        summary = train_and_save(args.warehouse, args.models, config, refit_full=args.refit_full,
                                 log=None if args.quiet else (lambda line: print(line, file=sys.stderr)))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
