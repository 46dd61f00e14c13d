"""Plan: the rows a run scores and everything decided before inference, made once as a frozen
:class:`~pipeline.stages.outcomes.RunPlan`.

Before any row is scored the plan refuses what would fail or lose data later: a source that shrank far
below what the output holds (``run.min_rows_fraction``), an output table whose columns this job cannot
write, a served model without a request journal.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from pipeline.config import SinkConfig
from pipeline.errors import JobError
from pipeline.config.identity import RunIdentity
from pipeline.spark.checks import observe_input_tally
from pipeline.stages.identify import Identified
from pipeline.stages.inputs import append_key_filter, read_new_inputs
from pipeline.stages.outcomes import Prepared, RunPlan, commit_keys, effective_sink
from pipeline.stages.resume import no_staging_reason, open_staging
from pipeline.stages.scoring import plan_inference_tasks, score_inputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["batch_mode", "check_output_columns", "plan_run", "scored_rows"]


def plan_run(prep: Prepared, identified: Identified) -> RunPlan:
    """The rows to score (new ones only for incremental runs and appends), their inference tasks, the
    lazily scored rows and the sink they go to: the run's :class:`RunPlan`, made once."""
    from pipeline.io.delta.state import read_state

    config, spark, ident = prep.config, prep.spark, identified.identity
    prep.stage("planning")
    sink = effective_sink(config.sink, incremental=config.run.incremental)
    # each table's log read once: the version the keys are compared at, the shrink guard, the schema check
    sink_state = read_state(config.sink.location, table=config.sink.table)
    quarantine_state = read_state(config.sink.quarantine_location, files=False) if config.sink.path else None
    new, rows_in, known_bad = _rows_to_score(prep, identified, sink_state)
    _check_shrink(prep, ident.ds, rows_in + known_bad, sink_state)
    tasks = plan_inference_tasks(spark, config, rows_in, prep.task)
    from pipeline.spark.progress import rows_folder

    rows_dir = rows_folder(spark) if config.run.progress and rows_in else None  # workers' rows done, same host
    staging = open_staging(prep, ident, rows=rows_in, tasks=tasks)
    observed, input_tally = observe_input_tally(new.rows)  # the input's keys tallied as the scoring pass reads them
    scored = scored_rows(prep, ident, observed, tasks=tasks, rows_in=rows_in, staging_dir=staging.folder,
                         rows_dir=rows_dir)
    check_output_columns(prep, scored, sink, state=sink_state)
    mode_note = " incremental" if config.run.incremental else ""
    prep.say(f"scoring {rows_in:,}{mode_note} rows in {tasks} tasks with {prep.model.name} @ {prep.model.revision} "
             f"-> {sink.path or sink.table} (ds {ident.ds}, mode {sink.mode})", ident)
    if staging.staged_before:
        prep.say(f"resuming: {staging.staged_before} of {tasks} task(s) finished by an earlier try are staged in "
                 f"{staging.folder}; those whose input rows are the same are reused", ident)
    return RunPlan(identity=ident, sink=sink,
                   key_columns=commit_keys(sink, id_column=config.source.id_column, incremental=config.run.incremental),
                   read_version=new.read_version, source_note=identified.source_note, inputs=new.rows, scored=scored,
                   rows_in=rows_in, tasks=tasks, known_bad=known_bad, rows_dir=rows_dir, staging_dir=staging.folder,
                   staged_before=staging.staged_before, resume_note=staging.resume_note, input_tally=input_tally,
                   sink_state=sink_state, quarantine_state=quarantine_state)


def _rows_to_score(prep: Prepared, identified: Identified, sink_state: Any) -> tuple[Any, int, int]:
    """``(new inputs, rows to score, known-bad rows left out)``: the source read at the version its log was read
    at; counted from that log where no filter or anti-join stands between the table and the rows scored."""
    from pipeline.io.sources import pinned_versions

    config, spark, ident = prep.config, prep.spark, identified.identity
    source = identified.source_state
    sink_version = None if sink_state is None else (sink_state.version if sink_state.exists else -1)
    readable = source is not None and not source.unreadable  # else the connector reads (and pins) it
    with pinned_versions({config.source.location.spark: source.version} if readable else {}):
        new = read_new_inputs(spark, config, fingerprint=ident.task_fingerprint, task=prep.task,
                              sink_version=sink_version)
    known_bad = new.known_bad.count() if new.known_bad is not None else 0
    logged = _logged_rows(prep, source)
    if config.sink.mode == "append" and not config.run.incremental:
        new = append_key_filter(spark, new, config, ident.ds, sink_version=sink_version, rows_before=logged)
    rows_in = logged if logged is not None and new.rows_before is None and not config.run.incremental \
        else new.rows.count()
    if new.rows_before is not None and new.rows_before > rows_in:
        prep.say(f"{new.rows_before - rows_in:,} of {new.rows_before:,} row(s) already in {config.sink.path} for "
                 f"ds {ident.ds} (key: id, ds): not scored again", ident)
    return new, rows_in, known_bad


def _logged_rows(prep: Prepared, source: Any) -> int | None:
    """The rows the source gives, from its log's counts (``source.limit`` applied), when nothing but the log
    stands between the table and the rows read: no ``source.where``, the default reader of the task kind."""
    from pipeline.tasks.job import TaskJob

    config = prep.config
    if source is None or config.source.where or type(prep.kind.job).read_inputs is not TaskJob.read_inputs:
        return None
    total = source.rows()
    if total is None:
        return None
    return min(total, config.source.limit) if config.source.limit else total


def scored_rows(prep: Prepared, ident: RunIdentity, rows: "DataFrame", *, tasks: int, rows_in: int | None = None,
                staging_dir: str | None, rows_dir: str | None) -> "DataFrame":
    """``rows`` lazily scored in ``tasks`` inference tasks, with lineage (:func:`score_inputs`), and what a task
    that sends rows to a server needs (:func:`_request_settings`); ``rows_in``: how many (to refuse a served
    model without a staging folder). Batch mode scores the rows joined to their answers here again
    (``pipeline.stages.batch``)."""
    requests = _request_settings(prep, ident, staging_dir=staging_dir, tasks=tasks, rows=rows_in or 0)
    return score_inputs(rows, prep.config, tasks=tasks, run_id=ident.run_id, ds=ident.ds, scored_at=prep.scored_at,
                        model=prep.model, faults=prep.faults, task=prep.task, progress_dir=rows_dir,
                        staging_dir=staging_dir, fingerprint=ident.task_fingerprint, carry_failed=True,
                        **requests)


def _check_shrink(prep: Prepared, ds: dt.date, rows: int, sink_state: Any = None) -> None:
    """Refuse, before any work, to replace a day (or a table) with far fewer rows than it holds now: an empty or
    shrunk source is almost always an upstream failure (``run.min_rows_fraction``; ``--allow-empty`` to go on).
    What the output holds comes from the log the plan read (``sink_state``), else from Spark."""
    from pipeline.io.delta.tables import rows_held

    config = prep.config
    sink = config.sink
    if config.run.allow_empty or config.run.incremental or sink.mode == "append" or not config.run.min_rows_fraction:
        return
    where = {"ds": ds} if sink.mode == "overwrite_partition" else None
    held = sink_state.rows(where) if sink_state is not None else None
    if held is None:
        held = rows_held(prep.spark, path=sink.path, table=sink.table, partition=where)
    per_input = prep.kind.job.output_rows_per_input(config)  # e.g. a user's top k recommendations
    need = config.run.min_rows_fraction * held / per_input
    if held and rows < need:
        what = f"ds {ds}" if where else "the table"
        holds = f"{held:,}" if per_input == 1 else f"{held:,} ({held / per_input:,.0f} input rows' worth)"
        raise JobError(
            f"refusing to replace {what} of {sink.path or sink.table}: the source gives {rows:,} row(s) where it holds "
            f"{holds} now (run.min_rows_fraction {config.run.min_rows_fraction:g} needs at least {need:,.0f}); an empty "
            "or shrunk source is usually an upstream failure, so nothing was scored or written. Check the source, "
            "or rerun with --allow-empty (run.allow_empty: true) to replace it anyway")


def check_output_columns(prep: Prepared, scored: "DataFrame", sink: SinkConfig, *, state: Any = None) -> None:
    """Before any row is scored: the output table can take this job's columns (a column someone else added
    stays and gets nulls; one of ours that the table holds with another type is refused, named). The table's
    schema from the log the plan read (``state``: :class:`pipeline.io.delta.state.TableState`), else asked."""
    from pipeline.io.delta.schema import check_output_schema, delta_schema_of, existing_schema
    from pipeline.spark.udf import internal_columns

    if state is not None and state.schema is not None:
        existing = state.schema
    elif state is not None and not state.exists:
        existing = None
    else:
        existing = existing_schema(prep.spark, path=sink.path, table=sink.table)
    if existing is None:
        return
    ours = delta_schema_of(prep.kind.job.shape_output(scored.drop(*internal_columns(scored)), prep.config).schema)
    check_output_schema(existing, ours, target=sink.path or sink.table)


def _request_settings(prep: Prepared, ident: RunIdentity, *, staging_dir: str | None, tasks: int,
                      rows: int) -> dict[str, Any]:
    """For a task that sends rows to a server: this try's id, the token budget and each task's share of the
    rates; refused without a staging folder (its request journal lives there). Empty for other tasks."""
    from pipeline.endpoint.attempt import journals_requests

    config = prep.config
    batch = batch_mode(prep)
    if config.run.submit_only and not batch:
        raise JobError("run.submit_only (--submit-only) is set, but this job sends no batches: it is for "
                       "task.backend endpoint with task.endpoint.mode batch")
    if not journals_requests(prep.task):
        if config.run.max_tokens is not None:
            raise JobError(f"run.max_tokens is set but task.kind {config.task.kind} does not send rows to a server; "
                           "it applies to task.backend: endpoint")
        return {}
    if staging_dir is None and rows:
        raise JobError(
            "the endpoint backend journals every answer in the run's staging folder, so that no row is paid for "
            f"twice by a retry or a rerun, and there is none: {no_staging_reason(config)}")
    from pipeline.spark.planning import count_cores

    at_once = max(1, min(tasks, count_cores(prep.spark)))
    # batch mode: the driver holds run.max_tokens when it submits; the tasks only read the answers
    return {"try_id": ident.try_id, "max_tokens": None if batch else config.run.max_tokens,
            "rate_share": 1.0 / at_once}


def batch_mode(prep: Prepared) -> bool:
    """Whether the run's rows go through the provider's batch API (``task.endpoint.mode: batch``)."""
    endpoint = getattr(prep.config.task, "endpoint", None)
    return getattr(prep.config.task, "backend", None) == "endpoint" and endpoint is not None \
        and endpoint.mode == "batch"
