"""spark-submit entry for the nightly recommendation refresh.

    spark-submit jobs/refresh_recommendations.py --conf conf/refresh_recommendations.yaml --ds 2026-11-30
    python jobs/refresh_recommendations.py --set task.k=20 --set model.path=warehouse/models/two_tower/<rev>
"""

from __future__ import annotations

import sys

from pipeline.recs.job import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], default_config="conf/refresh_recommendations.yaml"))
