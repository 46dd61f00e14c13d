"""Every Spark job a run starts names the job, the run id and the stage, on either kind of session.

A slow job in the Spark UI (or a line of the event log) says which run and which of its stages started
it. Both kinds get the same text, ``[job] run <id>: <stage>`` (:func:`describe`), where each can carry it:

- classic sessions: the job description (``spark.job.description``, what the UI's Jobs page lists) and
  two job tags, through the ``SparkContext``'s thread-local properties;
- Spark Connect: the server sets each job's description to its own ``Spark Connect - <plan>``, so the
  run's text travels as session tags (``spark.addTag``), which the server adds to every job of the
  operation as ``SparkConnect_SessionTag_User_<user>_Session_<session>_Tag_<tag>``.

The tags: ``sbi-run-<run id>`` (the same on every job of the run: ``spark.interruptTag`` stops them
all) and the description itself (commas, which a tag cannot hold, become semicolons).

All of it is per thread, as Spark keeps it: the runner's thread names its stages with :meth:`JobLabels.stage`
and takes the labels off at the end (:meth:`JobLabels.release`), a job started from another thread (the
warm-up) names itself there. What the thread carried before (a notebook's own description) comes back.

>>> describe("score_documents", "r1", "planning")
'[score_documents] run r1: planning'
>>> run_tag("nightly-2026-11-29"), describe_tag("a,b", "r1", "commit")
('sbi-run-nightly-2026-11-29', '[a;b] run r1: commit')
"""

from __future__ import annotations

import threading
from typing import Any

from pipeline.core.sessions import is_connect

__all__ = ["JobLabels", "describe", "describe_tag", "run_tag"]

_DESCRIPTION = "spark.job.description"


def describe(job: str, run_id: str, stage: str) -> str:
    """The description of a run's Spark jobs in ``stage``."""
    return f"[{job}] run {run_id}: {stage}"


def run_tag(run_id: str) -> str:
    """The tag every Spark job of run ``run_id`` carries (run ids hold no comma)."""
    return f"sbi-run-{run_id}"


def describe_tag(job: str, run_id: str, stage: str) -> str:
    """:func:`describe` as a job tag: a tag cannot hold a comma."""
    return describe(job, run_id, stage).replace(",", ";")


class JobLabels:
    """The labels of one run's Spark jobs; :meth:`attach` once the run has its session."""

    def __init__(self, *, job: str, run_id: str, spark: Any = None) -> None:
        self.job, self.run_id, self.spark = job, run_id, spark
        self._threads = threading.local()  # per thread: the tags this object set, the description before

    def attach(self, spark: Any) -> None:
        self.spark = spark

    def stage(self, name: str) -> None:
        """Label the Spark jobs this thread starts from now on with ``name`` (until the next stage, or
        :meth:`release`)."""
        if self.spark is None:
            return
        tags = {run_tag(self.run_id), describe_tag(self.job, self.run_id, name)}
        mine: set[str] = getattr(self._threads, "tags", set())
        try:
            if is_connect(self.spark):
                self._connect_tags(mine, tags)
            else:
                sc = self.spark.sparkContext
                if not hasattr(self._threads, "before"):
                    self._threads.before = sc.getLocalProperty(_DESCRIPTION)
                sc.setJobDescription(describe(self.job, self.run_id, name))
                for tag in mine - tags:
                    sc.removeJobTag(tag)
                for tag in tags - mine:
                    sc.addJobTag(tag)
        except Exception:  # noqa: BLE001 - a label is for people reading the UI; it never fails a run
            return
        self._threads.tags = tags

    def release(self) -> None:
        """Take this thread's labels off: its tags go, its description is what it was before the run."""
        mine: set[str] = getattr(self._threads, "tags", set())
        if self.spark is None or not mine:
            return
        try:
            if is_connect(self.spark):
                self._connect_tags(mine, set())
            else:
                sc = self.spark.sparkContext
                for tag in mine:
                    sc.removeJobTag(tag)
                sc.setLocalProperty(_DESCRIPTION, getattr(self._threads, "before", None))
        except Exception:  # noqa: BLE001 - the session may be gone already
            pass
        self._threads.tags = set()
        if hasattr(self._threads, "before"):
            del self._threads.before

    def _connect_tags(self, mine: set[str], tags: set[str]) -> None:
        held = self.spark.getTags()
        for tag in mine - tags:
            if tag in held:
                self.spark.removeTag(tag)
        for tag in tags - mine:
            self.spark.addTag(tag)
