"""spark-submit entry for the nightly recommendation refresh (the ``recommend`` task).

    spark-submit jobs/refresh_recommendations.py --conf conf/refresh_recommendations.yaml --ds 2026-11-30
    python jobs/refresh_recommendations.py --set task.k=20 --set model.path=warehouse/models/two_tower/<rev>
"""

from pipeline.cli import job_main

if __name__ == "__main__":
    raise SystemExit(job_main("conf/refresh_recommendations.yaml"))
