"""The values one run's stages hand each other, frozen once made, and the typed outcomes they return.

- :class:`Prepared`: what the checks before any Spark work found (the kind and task, the checked
  model, the session, the fault drills, whether the job runs light).
- :class:`RunPlan`: everything decided before inference, built once: the run's identity
  (:class:`pipeline.config.identity.RunIdentity`), the sink in effect, the commit keys, the output version
  the keys were compared at, the rows and tasks, the staging folder, and the lazily scored rows.
  No stage after planning reads ``config.sink`` again: the sink in effect is ``plan.sink``.
- :class:`AlreadyCommitted`: a retry whose commit had landed (found before planning, or when a
  concurrent try of the same run committed first); :class:`Committed` and :class:`ReadBack`: what
  the commits left and what reading them back found.

The pure rules of the plan (:func:`effective_sink`, :func:`commit_keys`) are here too:

>>> from pipeline.config import SinkConfig
>>> s = SinkConfig(path="/out", mode="overwrite_partition", partition_by=["ds"])
>>> effective_sink(s, incremental=True).mode, effective_sink(s, incremental=False).mode
('append', 'overwrite_partition')
>>> commit_keys(SinkConfig(path="/out", mode="append", partition_by=["ds"]), id_column="id", incremental=False)
('id', 'ds')
>>> commit_keys(SinkConfig(path="/out", mode="append"), id_column="doc", incremental=True)
('doc', 'content_hash', 'task_fingerprint')
>>> commit_keys(s, id_column="id", incremental=False)
()
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig, SinkConfig
from pipeline.config.identity import RunIdentity
from pipeline.core.logs import RunLog
from pipeline.core.metrics import StageClock
from pipeline.registry import ModelInfo, TaskKind, kind_and_task
from pipeline.core.rows import MODEL_LINEAGE_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["LINEAGE_COLUMNS", "AlreadyCommitted", "Checkpoint", "Committed", "Prepared", "ReadBack", "RunPlan",
           "commit_keys", "effective_sink", "kind_and_task"]

# the model's lineage (task_fingerprint: what incremental runs compare besides the input, pipeline.config.fingerprint),
# then the run's own; score(df) rows carry the model's only
LINEAGE_COLUMNS = (*MODEL_LINEAGE_COLUMNS, "run_id", "scored_at")


@dataclass(frozen=True)
class Prepared:
    """What the checks before any Spark work found, where the run's lines and stage times go (``log``,
    ``clock``), and what names its Spark jobs (``labels``: :class:`pipeline.spark.job_labels.JobLabels`)."""

    config: JobConfig
    kind: TaskKind
    task: Any
    model: ModelInfo
    spark: "SparkSession"
    scored_at: dt.datetime
    faults: dict[str, Any]
    log: RunLog
    clock: StageClock
    labels: Any = None
    # a small job (pipeline.stages.small_jobs): its session was built light and its commits run in the driver
    small: bool = False
    # the Delta source's log, read once (pipeline.io.delta.state.TableState; None: not a Delta source read here)
    source_state: Any = None

    def say(self, line: str, identity: RunIdentity | None = None, *, warning: bool = False) -> None:
        """One line of this run's output: ``[job] run <id>: line`` (``[job] line`` without an identity);
        ``warning``: ``warning: line``, logged as a warning."""
        who = f" run {identity.run_id}" if identity is not None else ""
        text = f"[{self.config.job}]{who}{':' if who else ''} {'warning: ' if warning else ''}{line}"
        if warning:
            self.log.warning(text)
        else:
            self.log.line(text)

    def stage(self, name: str) -> None:
        """The run enters stage ``name`` (a name :attr:`clock` laps): the Spark jobs it starts from now on carry
        ``[job] run <id>: name``, and a failure is reported in it."""
        self.log.stage_now = name
        if self.labels is not None:
            self.labels.stage(name)


@dataclass
class Checkpoint:
    """How far a run got, for the message of a run stopped by SIGTERM: the staging folder once planned, and
    whether the commits began. The one mutable value of a run; the stages that move it say so."""

    staging_dir: str | None = None
    committing: bool = False
    # a served model in batch mode got to its batches (submitted or about to be): a stop leaves them at the provider
    batches: bool = False


@dataclass(frozen=True)
class RunPlan:
    """Everything decided before any row is scored, made once by :func:`pipeline.stages.planning.plan_run`."""

    identity: RunIdentity
    # the sink in effect: an incremental run appends whatever sink.mode says (effective_sink)
    sink: SinkConfig
    # what makes an output row the same row for the commit (commit_keys); () when not keyed
    key_columns: tuple[str, ...]
    # the output version the keys were compared at: the commit writes only keys no commit since wrote
    read_version: int | None
    # why the source is a new input though its version looks the same (a rebuilt table); None: nothing to say
    source_note: str | None
    inputs: "DataFrame"
    scored: "DataFrame"
    rows_in: int
    tasks: int
    known_bad: int
    # where the workers on this host report rows done inside a task (progress); None: not reported
    rows_dir: str | None = None
    # the plan folder of staged task output (None: no staging), the tasks staged there before this try
    # started, and why staged output of an earlier try is not reused (None: nothing to say)
    staging_dir: str | None = None
    staged_before: int = 0
    resume_note: str | None = None
    # a stream's micro-batch (its batch id; None: a batch run): its commits carry the query's transaction at
    # this version, its quarantine is written only when rows failed, and its rows are read back by scored_at
    micro_batch: int | None = None
    # the input's key tally, observed as the scoring pass reads the rows (pipeline.spark.checks.InputTally)
    input_tally: Any = None
    # what the plan read of the output and quarantine tables, once (pipeline.io.delta.state.TableState; None:
    # no such table, or not read)
    sink_state: Any = None
    quarantine_state: Any = None
    # the drift gate's history of the job's runs, read once for a stream (pipeline.stages.quality.RunsHistory;
    # None: read when the gate runs)
    runs_history: Any = None
    # batch mode of a served model (task.endpoint.mode batch): what the provider's batches did (the summary's
    # batch_api; pipeline.stages.batch), once they ended and ``scored`` reads their answers; None: live
    batch_api: dict[str, Any] | None = None

    @property
    def quarantine_path(self) -> str:
        return self.sink.resolved_quarantine_path()

    @property
    def partition_ds(self) -> dt.date | None:
        """The run date when the output is partitioned by it (the day the run's rows live in), else None."""
        return self.identity.ds if "ds" in self.sink.partition_by else None


@dataclass(frozen=True)
class AlreadyCommitted:
    """A retry of a run whose commit already landed: nothing scored, nothing written."""

    version: int | None
    by: str | None
    writer: str
    output: str

    @property
    def note(self) -> str:
        return f"already committed at version {self.version} by run {self.by or '?'}; nothing to do"


@dataclass(frozen=True)
class Committed:
    """What the commits left: the output's write result, the quarantine's version and run, the counts, the quality."""

    result: Any
    counts: Any
    seconds: float
    quarantine_version: int | None
    quarantine_run: str
    # the quarantine write's result (None: no quarantine commit)
    quarantine_result: Any = None
    # the output's profile and the drift verdict ({"profile": ..., "drift": ...}); None: run.quality off
    quality: dict[str, Any] | None = None
    # the key tallies (pipeline.core.rows.KeyTally) of the rows sent to the output and to the quarantine, from the
    # scoring pass (None: the exact check ran, and the read-back reads the tables); a few rows for the summary
    written: Any = None
    quarantined: Any = None
    samples: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ReadBack:
    """The counts the commits add up to, from their own log entries or from the rows read back at their
    versions (``written``: those rows; None when the log entries agreed and nothing was read)."""

    written: "DataFrame | None"
    rows_out: int
    rows_quarantined: int
    incomplete: str | None


def effective_sink(sink: SinkConfig, *, incremental: bool) -> SinkConfig:
    """The sink in effect: an incremental run's new rows join the run's partition (replacing it would drop
    the rows scored earlier today), so it appends whatever ``sink.mode`` says."""
    if incremental and sink.mode != "append":
        return sink.model_copy(update={"mode": "append"})
    return sink


def commit_keys(sink: SinkConfig, *, id_column: str, incremental: bool) -> tuple[str, ...]:
    """What makes an output row the same row, for the commit: (id, ds) for an append (the id alone when
    the table has no ds column, as the key filter before scoring compares); (id, content hash,
    task fingerprint) for an incremental run; none for the modes that replace (their commit is the
    replace). Rows whose output is not one row per input (recommendations) are not keyed."""
    if sink.mode != "append" or not sink.path:
        return ()
    if incremental:
        return (id_column, "content_hash", "task_fingerprint")
    return (id_column, "ds") if "ds" in sink.partition_by else (id_column,)
