"""Spark jobs named after the run (pipeline.spark.job_labels), read where Spark keeps them: in each task's
local properties (what the job carried when it was submitted), on a classic and a Spark Connect session.
The whole-run check, every job of a run in Spark's event log, is in tests/run/test_logging.py."""

from __future__ import annotations

import threading

from pipeline.core.sessions import is_connect
from pipeline.spark.job_labels import JobLabels


def _seen_by_a_task(spark) -> tuple[str | None, set[str]]:
    """``(spark.job.description, spark.job.tags)`` of a job this thread starts, as its task sees them."""
    import pandas as pd

    def props(batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        for _ in batches:
            pass
        yield pd.DataFrame({"description": [context.getLocalProperty("spark.job.description")],
                            "tags": [context.getLocalProperty("spark.job.tags") or ""]})

    row = spark.range(1, numPartitions=1).mapInPandas(props, "description string, tags string").collect()[0]
    return row["description"], set(filter(None, row["tags"].split(",")))


def _ours(tags: set[str]) -> set[str]:
    """The tags as this project set them (Connect wraps a session tag: ``SparkConnect_SessionTag_..._Tag_<tag>``)."""
    return {t.split("_Tag_", 1)[-1] for t in tags if "sbi-run-" in t or "] run " in t}


def test_a_stage_labels_the_jobs_of_its_thread_and_release_restores_what_was_there(any_spark):
    classic = not is_connect(any_spark)
    if classic:
        any_spark.sparkContext.setJobDescription("the notebook's own description")
    labels = JobLabels(job="score,docs", run_id="20261129", spark=any_spark)
    try:
        labels.stage("planning")
        description, tags = _seen_by_a_task(any_spark)
        assert _ours(tags) == {"sbi-run-20261129", "[score;docs] run 20261129: planning"}
        if classic:
            assert description == "[score,docs] run 20261129: planning"
        else:  # the server describes each job itself; the run's text rides in its tags
            assert description.startswith("Spark Connect - ")
        labels.stage("commit")
        assert _ours(_seen_by_a_task(any_spark)[1]) == {"sbi-run-20261129", "[score;docs] run 20261129: commit"}

        other: dict[str, object] = {}  # another thread's jobs are not this thread's stage
        thread = threading.Thread(target=lambda: other.update(seen=_seen_by_a_task(any_spark)))
        thread.start()
        thread.join(300)
        assert _ours(other["seen"][1]) == set()
    finally:
        labels.release()
    description, tags = _seen_by_a_task(any_spark)
    assert _ours(tags) == set()
    if classic:
        assert description == "the notebook's own description"
        any_spark.sparkContext.setJobDescription(None)
