"""Score and commit: inference, the checks before any commit, the quarantine commit, then the output's.

Nothing is committed unless every input row came back exactly once, the failed rows stay within the
error budget (``run.max_error_fraction``, ``run.max_errors``) and the drift gate lets the output through
(:mod:`pipeline.stages.quality`). The quarantine commits first, then the
output; an append is keyed on its rows (``plan.key_columns``), so an overlapping run's keys are written once.
"""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.core.rows import QUARANTINED_STATUSES
from pipeline.stages.outcomes import AlreadyCommitted, Checkpoint, Committed, Prepared, ReadBack, RunPlan
from pipeline.stages.quality import check_quality
from pipeline.stages.quarantine import check_quarantine_pair, commit_quarantine, say_swept
from pipeline.stages.resume import remove_staging
from pipeline.stages.verify import read_back, write_tallied

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["score_and_commit"]


def _check_before_commit(check: Any, errors: int, rows: int, scored: "DataFrame", config: JobConfig) -> None:
    """Refuse to commit scored rows that lost or duplicated input rows (``check``: the exact check's verdict,
    None when the tallies agreed), or that failed beyond the error budget (``errors`` of ``rows``)."""
    from pipeline.spark.checks import error_budget, top_errors

    if check is not None and not check.ok:
        raise JobError(
            f"scoring did not return every input row exactly once, so nothing was committed: {check.describe()}. "
            "A source that changed while the job ran (files added to a folder) does this; otherwise it is a bug "
            "or a broken executor, not bad input: rerun the job, and report it if it repeats"
        )
    budget = error_budget(errors, rows, max_fraction=config.run.max_error_fraction,
                          max_errors=config.run.max_errors)
    if budget.exceeded:
        raise JobError(
            f"{budget.describe(top_errors(scored))}. Nothing was committed (neither the output nor the quarantine "
            "table). Fix the cause (a bad model or deploy, batching.max_length beyond the model, broken input), "
            "or raise run.max_error_fraction / run.max_errors if these failures are expected"
        )


@contextmanager
def _budget_stop(prep: Prepared, plan: RunPlan) -> Iterator[None]:
    """A Spark job failed by ``run.max_tokens`` (a task's :class:`TokenBudgetReached`) ends the run as that
    error, with what this try spent and what is kept for the rerun; any other failure passes unchanged."""
    from pipeline.errors import TokenBudgetReached
    from pipeline.core.error_text import python_error_line

    try:
        yield
    except TokenBudgetReached:
        raise
    except Exception as exc:  # noqa: BLE001 - only the budget's stop is rewritten
        line = python_error_line(str(exc)) or ""
        if not line.startswith("TokenBudgetReached"):
            raise
        from pipeline.journal.plans import staged_tasks
        from pipeline.journal.request_log import try_usage

        spent = try_usage(plan.staging_dir, plan.identity.try_id)
        staged = len(staged_tasks(plan.staging_dir))
        raise TokenBudgetReached(
            f"run.max_tokens {prep.config.run.max_tokens:,} reached: this try spent {spent:,} tokens on the server; "
            f"nothing was committed. Kept for the rerun in {plan.staging_dir}: {staged} of {plan.tasks} task(s) "
            "staged and every answer of the others in the request journal, so the same command again (with a "
            "budget for the rest) pays only for the rows not answered yet", tokens=spent) from None


def score_and_commit(prep: Prepared, plan: RunPlan, checkpoint: Checkpoint) -> tuple[Committed, ReadBack] | AlreadyCommitted:
    """Inference and the check before any commit, the quarantine commit, the output commit, and the
    read-back of both at the versions committed; a try that finds a concurrent try of this run committed
    first gets :class:`AlreadyCommitted`. ``checkpoint.committing`` is set once the commits begin."""
    from pyspark import StorageLevel

    # Scored rows feed the checks and two writes (quarantine, output): keep them so inference runs once.
    scored = plan.scored.persist(StorageLevel.MEMORY_AND_DISK)
    started = time.perf_counter()
    try:
        try:
            checked = _score_and_check(prep, plan, scored)
            quality = check_quality(prep, plan, checked.counts)  # a refused run: nothing committed, staging kept
            checkpoint.committing = True
            result, quarantine = _commit_both(prep, plan, scored, errors=checked.errors)
        finally:
            scored.unpersist()
        if isinstance(result, AlreadyCommitted):
            return result
        committed = Committed(result=result, counts=checked.counts, seconds=time.perf_counter() - started,
                              quarantine_version=quarantine[0], quarantine_run=quarantine[1],
                              quarantine_result=quarantine[2], quality=quality,
                              written=checked.written, quarantined=checked.quarantined, samples=checked.samples)
        return committed, read_back(prep, plan, committed)
    finally:
        if plan.rows_dir:  # the workers' rows-done files are read while the job runs, and only then
            shutil.rmtree(plan.rows_dir, ignore_errors=True)


@dataclass(frozen=True)
class _Checked:
    """What the check before the commits found: rows failed, the workers' counts, the tallies of the rows
    for the output and the quarantine (None: the exact check ran instead), a few rows for the summary."""

    errors: int
    counts: dict[str, Any]
    written: Any = None
    quarantined: Any = None
    samples: list[dict[str, Any]] = field(default_factory=list)


def _score_and_check(prep: Prepared, plan: RunPlan, scored: "DataFrame") -> _Checked:
    """Run inference (the first action over the persisted ``scored`` rows, which brings the tallies and the
    tasks' counts home) under the progress line, and hold the checks before any commit. The input's keys are
    joined with the scored ones only when their tallies disagree."""
    from pipeline.spark.progress import JobProgress, stage_source
    from pipeline.spark.run_metrics import merge_task_counts
    from pipeline.spark.checks import scored_totals
    from pipeline.spark.udf import METRICS_COLUMN

    config = prep.config
    progress = (JobProgress(stage_source(prep.spark, rows_dir=plan.rows_dir), job=config.job,
                            planned_tasks=plan.tasks, rows_total=plan.rows_in, interval=config.run.progress_interval_s,
                            emit=prep.log.progress, reused_tasks=plan.staged_before)
                if config.run.progress and plan.rows_in else nullcontext())
    prep.clock.lap("planning", rows=plan.rows_in, tasks=plan.tasks)
    prep.stage("inference and check")
    with progress, _budget_stop(prep, plan):
        totals = scored_totals(scored, id_column=config.source.id_column, metrics_column=METRICS_COLUMN)
    counts = merge_task_counts(totals.metrics) if plan.rows_in else {}
    seen = plan.input_tally.get() if plan.input_tally is not None else None
    agreed = seen is not None and seen == totals.total and seen.rows == plan.rows_in
    check = None if agreed else _exact_check(prep, plan, scored)
    try:
        _check_before_commit(check, totals.errors if check is None else check.errors,
                             totals.total.rows if check is None else check.rows_out, scored, config)
    except JobError:
        remove_staging(prep, plan.identity.run_key)  # rows judged bad: a rerun scores them again, never replays them
        raise
    errors = totals.errors if check is None else check.errors
    samples = _samples(prep, plan, scored)
    prep.clock.lap("inference and check", rows=totals.total.rows, errors=errors, exact=check is not None)
    if check is not None:
        return _Checked(errors, counts, samples=samples)
    return _Checked(errors, counts, totals.written, totals.quarantined, samples)


def _exact_check(prep: Prepared, plan: RunPlan, scored: "DataFrame") -> Any:
    """The input's keys joined with the scored ones (a second read of the input): what differs, by key."""
    from pipeline.spark.checks import identity_check, key_counts

    return identity_check(key_counts(plan.inputs, id_column="id"),
                          key_counts(scored, id_column=prep.config.source.id_column, status_column="status"))


def _samples(prep: Prepared, plan: RunPlan, scored: "DataFrame") -> list[dict[str, Any]]:
    """The summary's sample rows, from the scored rows in hand (cached): written rows, their id and results."""
    from pyspark.sql import functions as F

    config = prep.config
    n = config.run.sample_rows if plan.micro_batch is None else 0  # a stream's summary shows none
    columns = [c for c in (config.source.id_column, "label", "score", "completion", "finish_reason", "n_tokens",
                           "status") if c in scored.columns]
    if not n or not columns:
        return []
    ok = scored.where(~F.coalesce(F.col("status").isin(*QUARANTINED_STATUSES), F.lit(False))) \
        if "status" in scored.columns else scored
    return [r.asDict() for r in ok.select(*columns).limit(n).collect()]


def _commit_both(prep: Prepared, plan: RunPlan, scored: "DataFrame", *,
                 errors: int) -> tuple[Any, tuple[int | None, str, Any]]:
    """The quarantine commit, then the output's (with the quarantine pair checked around it for an
    ``overwrite_partition`` run), then the run's staging removed: ``(output result or AlreadyCommitted,
    (quarantine version, run id of its rows, its write's result))``."""
    from pipeline.core import faults as fault_hooks

    ident = plan.identity
    metadata = {"sbi.job": prep.config.job, "sbi.run_id": ident.run_id, "sbi.model_revision": prep.model.revision}
    fault_hooks.before_commits(prep.faults)
    prep.stage("quarantine commit")
    quarantine_version, quarantine_run, quarantine_result = commit_quarantine(prep, plan, scored, errors=errors,
                                                                              metadata=metadata)
    if pairs := (plan.sink.mode == "overwrite_partition" and quarantine_version is not None):
        check_quarantine_pair(prep, plan, version=quarantine_version,
                              when="this run committed no output, so the pair agrees once that run's output "
                                   "commit lands")
    result = _commit_output(prep, plan, scored, metadata=metadata)
    fault_hooks.after_output_commit(prep.faults, run_id=ident.run_id)
    if pairs and not isinstance(result, AlreadyCommitted):
        check_quarantine_pair(prep, plan, version=quarantine_version,
                              when=f"this run's output (version {result.version}) and that quarantine now hold "
                                   f"different runs' rows: rerun ds {ident.ds}")
    remove_staging(prep, ident.run_key)  # the commit landed: no try of this run reads the staged output again
    return result, (quarantine_version, quarantine_run, quarantine_result)


def _commit_output(prep: Prepared, plan: RunPlan, scored: "DataFrame", *, metadata: dict[str, str]) -> Any:
    """The output commit: the write result, or :class:`AlreadyCommitted` when a concurrent try of this run
    committed first. Appends are keyed on their rows (``plan.key_columns``) from ``plan.read_version`` on;
    a small job's commit is written from this process."""
    from pipeline.core import faults as fault_hooks
    from pyspark.sql import functions as F

    from pipeline.io.delta.plan import CommitOptions
    from pipeline.spark.udf import internal_columns

    config, ident = prep.config, plan.identity
    prep.stage("commit")
    to_write = scored.drop(*internal_columns(scored)).where(~F.col("status").isin(*QUARANTINED_STATUSES))
    ids = F.col(config.source.id_column)
    if (lost := fault_hooks.lost_at_output_commit(prep.faults)) is not None:  # a drill: the commit loses a row
        to_write = to_write.where(~ids.eqNullSafe(F.lit(lost)))
    if (swap := fault_hooks.swapped_at_output_commit(prep.faults)) is not None:  # a drill: one lost, one twice
        to_write = to_write.where(~ids.eqNullSafe(F.lit(swap[0]))).unionByName(to_write.where(ids == F.lit(swap[1])))
    commit = CommitOptions(txn_app_id=ident.app_id, txn_version=ident.txn_version, key_columns=plan.key_columns,
                           read_version=plan.read_version, base_version=_version_read(plan.sink_state))
    result = write_tallied(prep, prep.kind.job.shape_output(to_write, config), plan.sink, commit=commit,
                           partition_values={"ds": ident.ds}, commit_metadata=metadata, faults=prep.faults,
                           in_driver=prep.small)
    prep.clock.lap("commit", version=result.version)
    if result.already_committed:  # a concurrent try of this very run committed first
        return AlreadyCommitted(version=result.version, by=None, writer=result.writer,
                                output=str(plan.sink.path or plan.sink.table))
    say_swept(prep, result)
    return result


def _version_read(state: Any) -> int | None:
    """The output's version as the plan read its log (-1: no table yet; None: not read)."""
    if state is None or (state.exists and state.version is None):
        return None
    return state.version if state.exists else -1
