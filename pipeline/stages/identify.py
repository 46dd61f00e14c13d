"""Identify: which logical run this try belongs to, and whether that run's commit already landed.

The run's identity (:func:`pipeline.config.identity.run_identity`) hashes the config, the model revision and the
source snapshot (:func:`pipeline.io.snapshots.source_snapshot`). Its run key is the Delta transaction id of the
run's commits: a retry of an append or incremental run whose commit landed, and whose rows are still in
the output, ends here as :class:`~pipeline.stages.outcomes.AlreadyCommitted`. A transaction id is a fast path
only while the rows it stood for are there; appends are keyed on the rows themselves later.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig
from pipeline.config.identity import RunIdentity, run_identity
from pipeline.stages.outcomes import AlreadyCommitted, Prepared
from pipeline.stages.resume import remove_staging
from pipeline.stages.verify import rows_written

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Identified", "identify"]


@dataclass(frozen=True)
class Identified:
    """This try's identity; why its source is a new input though its version looks the same (a rebuilt
    table; None: nothing to say); for a retry whose commit landed, that commit (then the run ends); and what
    the source's log said, read once (:class:`pipeline.io.delta.state.TableState`; None: not a Delta source
    whose log is read here)."""

    identity: RunIdentity
    source_note: str | None
    done: AlreadyCommitted | None = None
    source_state: Any = None


def identify(prep: Prepared) -> Identified:
    """This try's identity, with :class:`AlreadyCommitted` for a retry whose commit landed (its rows still there)."""
    from pipeline.io.delta.history import committed_run_via
    from pipeline.io.delta.target import resolve_writer
    from pipeline.io.snapshots import source_snapshot

    config, spark = prep.config, prep.spark
    prep.stage("idempotency")
    state = prep.source_state
    snapshot = state.snapshot if state is not None else source_snapshot(config.source)
    ident = run_identity(config, model_revision=prep.model.revision, source_snapshot=snapshot)
    note = _rebuilt_source_note(config, snapshot)
    if note:
        prep.say(note, ident)
    if config.run.incremental or config.sink.mode == "append":
        done = committed_run_via(spark, config.sink.location, ident.run_key) if config.sink.path else None
        if done and _run_rows_remain(spark, config, by=done[1], ds=ident.ds):
            remove_staging(prep, ident.run_key)  # a try killed after its commit left it; nothing will read it again
            return Identified(ident, note, AlreadyCommitted(version=done[0], by=done[1], output=str(config.sink.path),
                                                            writer=resolve_writer(spark, config.sink)), state)
        if done:
            # the transaction id outlived the rows (the day deleted, restored or overwritten since): the rows
            # missing by key are scored, under this try's own transaction id, or the commit would be skipped
            prep.say(f"run {done[1]} committed at version {done[0]} but its rows are no longer in "
                     f"{config.sink.path}; scoring the rows missing by key", ident)
            ident = ident.retry_of_gone_rows()
    prep.clock.lap("idempotency")
    return Identified(ident, note, source_state=state)


def _run_rows_remain(spark: "SparkSession", config: JobConfig, *, by: str | None, ds: dt.date) -> bool:
    """Whether the output still holds rows of run ``by`` (for ``ds`` when partitioned by it): a transaction
    id found in the table is a fast path only while the rows it stood for are there. Unknown run: True."""
    from pipeline.io.sources import SourceError

    if not by or not config.sink.path:
        return True
    day = ds if "ds" in config.sink.partition_by else None
    try:
        return rows_written(spark, config.sink.location, by, day).limit(1).count() > 0
    except SourceError:
        return False


def _rebuilt_source_note(config: JobConfig, snapshot: str | None) -> str | None:
    """A line when the source table was dropped and rebuilt since this job's last finished run (its Delta
    table id changed, whatever its version says): its rows are a new input."""
    from pipeline.io.snapshots import source_rebuilt
    from pipeline.records.runs import read_runs

    runs_path = config.resolved_runs_path()
    if not snapshot or not snapshot.startswith("delta:") or not runs_path:
        return None
    try:
        rows = [r for r in read_runs(runs_path, job=config.job) if r["outcome"] == "ok" and r["summary_json"]]
    except Exception:  # noqa: BLE001 - no runs table yet (a first run): nothing to compare with
        return None
    for row in reversed(rows):
        before = json.loads(row["summary_json"]).get("source_snapshot")
        if before:
            change = source_rebuilt(before, snapshot)
            return (f"the source {config.source.path} was rebuilt since run {row['run_id']} ({change}): a new "
                    "input, scored as such (keys the output holds are not scored again)") if change else None
    return None
