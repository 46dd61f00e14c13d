"""Run one job in its own process (its own SparkContext on ``local[2,4]``) for the driver-kill test.

Invoked by tests/run/test_commits.py and tests/run/test_resume.py: ``python tests/support/commit_job.py <config.json>``; the tests
kill it from outside.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(config_file: str) -> None:
    from pipeline.config import JobConfig, SparkConfig
    from pipeline.runner import run_job
    from pipeline.spark.session import get_session

    config = JobConfig.model_validate_json(Path(config_file).read_text())
    # the connector's log replay in 2 tasks, not 50 (tests/conftest.py's DELTA_TEST_CONFS; unused without it)
    spark = get_session(SparkConfig(master="local[2,4]", app_name="commit-kill-test", shuffle_partitions=2,
                                    arrow_max_records_per_batch=20,
                                    conf={"spark.default.parallelism": "2",
                                          "spark.databricks.delta.snapshotPartitions": "2"}),
                        storage=config.storage.options())  # the config's S3 settings as S3A's, as run_job's session
    run_job(config, spark=spark)


if __name__ == "__main__":
    main(sys.argv[1])
