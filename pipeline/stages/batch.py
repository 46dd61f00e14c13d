"""Batch mode of the endpoint backend: the run's rows answered through the provider's batch API, then scored.

With ``task.endpoint.mode: batch`` the runner puts this stage between the plan and the score-and-commit
stage (:func:`run_batches`, :func:`answered_plan`):

1. **Request files.** The rows' requests are built on the executors by the task's own request code
   (:func:`pipeline.spark.batch_requests.request_lines`) and streamed to the driver, which writes each
   request key not yet in the run's batch journal into request files of at most ``batch.max_requests_per_file``
   lines and ``batch.max_bytes_per_file`` bytes (:class:`pipeline.journal.batch_log.BatchLog`).
2. **The provider** (:mod:`pipeline.stages.batch_api`): each file uploaded and submitted as one batch (ids
   journaled the moment they come back), polled until every batch ends, the output and error files
   collected, what the provider did not answer submitted again, the answers written one line per key.
   ``--submit-only`` ends the run after the submission; ``batch.max_wait_s`` after that long: nothing is
   committed and the same command later collects and commits (:func:`pending_summary`).
3. **Scoring.** Each row gets its request key again (the same request, so the same key), the answers are
   joined to the rows by key, and the rows are scored by the task as in live mode, its client replaced by
   the answers (:class:`pipeline.tasks._endpoint_batch.AnswerClient`): the same parsing and checks, the same
   statuses, quarantine, checks before the commit, commit and read-back.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.errors import JobError
from pipeline.stages.outcomes import Prepared, RunPlan
from pipeline.core.run_summary import RunSummary

if TYPE_CHECKING:
    from pipeline.journal.batch_log import BatchLog

__all__ = ["BatchesDone", "BatchesPending", "answered_plan", "batch_facts", "pending_summary", "run_batches"]


@dataclass(frozen=True)
class BatchesDone:
    """Every batch of the run ended and was collected: the answers' folder and what the batches did."""

    answers_dir: str
    facts: dict[str, Any]


@dataclass(frozen=True)
class BatchesPending:
    """The run ends with batches still at the provider (``--submit-only``, or ``batch.max_wait_s`` passed)."""

    facts: dict[str, Any]
    reason: str


def _journal(prep: Prepared, plan: RunPlan) -> "BatchLog":
    from pipeline.journal.batch_log import BatchLog, batch_plan
    from pipeline.journal.plans import open_plan
    from pipeline.stages.resume import no_staging_reason, staging_root

    ident, root = plan.identity, staging_root(prep.config)
    if root is None or plan.staging_dir is None:
        raise JobError("task.endpoint.mode batch journals every request file and batch id in the run's staging "
                       "folder, so that nothing is submitted twice, and there is none: "
                       f"{no_staging_reason(prep.config)}")
    return BatchLog(open_plan(root, batch_plan(run_key=ident.run_key, source_version=ident.source_snapshot,
                                               task_fingerprint=ident.task_fingerprint, job=prep.config.job,
                                               ds=ident.ds.isoformat())))


def _request_plan(prep: Prepared, rows: Any) -> Any:
    """The executors' plan of the two request passes: the task, its input columns, no model."""
    from pipeline.spark.udf import InferencePlan
    from pipeline.stages.inputs import malformed_input

    return InferencePlan.for_job(prep.config, model_path=prep.model.path, task_class=prep.kind.task,
                                 input_columns=(*prep.task.input_columns, *malformed_input(rows)))


def _write_requests(prep: Prepared, plan: RunPlan, log: "BatchLog") -> int:
    """Request files for every request key of the run's rows that no journaled file holds; how many requests."""
    from pipeline.endpoint.batch_wire import cut_files
    from pipeline.spark.batch_requests import request_lines

    cfg = prep.config.task.endpoint.batch
    seen = set(log.submitted_keys())
    lines = request_lines(plan.inputs, _request_plan(prep, plan.inputs))

    def fresh() -> Any:
        for row in lines.toLocalIterator():
            if row["key"] not in seen:  # rows with the same request share one line, and one answer
                seen.add(row["key"])
                yield row["key"], row["line"], int(row["estimate"])

    written = 0
    for part in cut_files(fresh(), max_requests=cfg.max_requests_per_file, max_bytes=cfg.max_bytes_per_file):
        batch = log.add_file(part, round=1)
        written += batch.requests
        prep.say(f"batch API: request file {batch.name}: {batch.requests:,} request(s), an estimated "
                 f"{batch.estimate:,} tokens", plan.identity)
    return written


def run_batches(prep: Prepared, plan: RunPlan) -> BatchesDone | BatchesPending:
    """Write, submit, wait for and collect the run's batches (see the module docstring)."""
    from pipeline.endpoint.batches import BatchApi
    from pipeline.journal.request_log import record_batch_usage
    from pipeline.stages.batch_api import Driver, resubmit, submit, verdicts, wait, write_answers

    config, ident = prep.config, plan.identity
    endpoint = config.task.endpoint
    prep.stage("batch API")
    log = _journal(prep, plan)
    driver = Driver(log=log, api=BatchApi(endpoint), endpoint=endpoint, path=prep.task.request_path,
                    try_id=ident.try_id, say=lambda line: prep.say(line, ident), between=prep.clock.between,
                    faults=prep.faults, max_tokens=config.run.max_tokens)
    _write_requests(prep, plan, log)
    waited = 0.0
    while True:
        submit(driver)
        limit = 0.0 if config.run.submit_only else endpoint.batch.max_wait_s
        left, seconds = wait(driver, max_wait_s=None if limit is None else max(0.0, limit - waited))
        waited += seconds
        if left or config.run.submit_only:
            reason = ("submitted (--submit-only)" if config.run.submit_only
                      else f"still running after task.endpoint.batch.max_wait_s {limit:g} s")
            facts = batch_facts(log, ident.try_id, waited_s=waited, pending=left)
            return BatchesPending({**facts, "pending_reason": reason}, reason)
        found = verdicts(log, driver.path)
        if not resubmit(log, found, endpoint, driver.say):
            break
    write_answers(log, found)
    facts = batch_facts(log, ident.try_id, waited_s=waited)
    record_batch_usage(str(plan.staging_dir), ident.try_id, facts["tokens"])
    prep.clock.lap("batch API", batches=len(facts["batches"]), requests=facts["requests"], tokens=facts["tokens"])
    return BatchesDone(log.answers_dir, facts)


def answered_plan(prep: Prepared, plan: RunPlan, done: BatchesDone) -> RunPlan:
    """The run's plan with its rows joined, by request key, to the answers, and scored over them (what changes:
    ``scored``, the input's key tally observed under it, and ``batch_api``, what the batches did)."""
    from pathlib import Path

    from pyspark.sql import functions as F

    from pipeline.core.rows import ANSWER_COLUMN, REQUEST_KEY_COLUMN
    from pipeline.spark.batch_requests import with_request_keys
    from pipeline.spark.checks import observe_input_tally
    from pipeline.stages.planning import scored_rows

    # the input observed again for its key tally: the first scoring pass (whose observation the plan holds) never
    # runs in batch mode, this one does
    observed, input_tally = observe_input_tally(plan.inputs)
    keyed = with_request_keys(observed, _request_plan(prep, plan.inputs))
    if any(Path(done.answers_dir).glob("part-*.jsonl")):
        answers = prep.spark.read.text(done.answers_dir).select(
            F.get_json_object("value", "$.key").alias(REQUEST_KEY_COLUMN), F.col("value").alias(ANSWER_COLUMN))
        joined = keyed.join(answers, on=REQUEST_KEY_COLUMN, how="left")
    else:  # no row was sent (all skipped): nothing to join
        joined = keyed.withColumn(ANSWER_COLUMN, F.lit(None).cast("string"))
    scored = scored_rows(prep, plan.identity, joined.drop(REQUEST_KEY_COLUMN), tasks=plan.tasks,
                         rows_in=plan.rows_in, staging_dir=plan.staging_dir, rows_dir=plan.rows_dir)
    return dataclasses.replace(plan, scored=scored, batch_api=done.facts, input_tally=input_tally)


def batch_facts(log: "BatchLog", try_id: str, *, waited_s: float, pending: int = 0) -> dict[str, Any]:
    """What the run's batches did, for the summary, the runs table and the report.

    ``tokens``: what the answers this try collected used (what it paid); ``waited_s``: how long this try
    waited for the provider; ``provider_s``: from the first batch's creation to the last one's end.
    """
    files = log.files()
    created = [f.created_at for f in files if f.created_at]
    ended = [f.ended_at for f in files if f.ended_at]
    return {
        "journal": str(log.folder), "batches": [f.summary() for f in files],
        "states": dict(sorted(Counter(f.status for f in files).items())),
        "requests": sum(f.requests for f in files if f.round == 1),
        "resubmitted": sum(f.requests for f in files if f.round > 1),
        "answered": sum(f.answered for f in files), "failed": sum(f.failed for f in files),
        "submitted_by_this_try": sum(1 for f in files if f.submitted_by == try_id),
        "estimate": sum(f.estimate for f in files if f.submitted_by == try_id),
        "tokens": sum(f.tokens for f in files if f.collected_by == try_id),
        "tokens_all": sum(f.tokens for f in files),
        "waited_s": round(waited_s, 1),
        "provider_s": round(max(ended) - min(created), 1) if ended and created and not pending else None,
        "pending": pending,
    }


def pending_summary(prep: Prepared, plan: RunPlan, pending: BatchesPending, *, recorder: Any) -> RunSummary:
    """The summary of a run that ends with its batches at the provider: nothing scored or committed; printed,
    recorded (runs-table outcome ``submitted``) and returned."""
    from pipeline.core.compat import runtime_versions

    config, ident = prep.config, plan.identity
    left = pending.facts["pending"]
    summary = RunSummary(
        versions=runtime_versions(), job=config.job, run_id=ident.run_id, ds=ident.ds.isoformat(),
        rows_in=plan.rows_in, rows_out=0, seconds=0.0, tokens=pending.facts["tokens"], model_name=prep.model.name,
        model_revision=prep.model.revision,
        output=str(plan.sink.path or plan.sink.table), delta_version=None, writer="-", tasks=plan.tasks,
        incomplete=(f"nothing committed yet: {left} batch(es) {pending.reason}; the same command again collects "
                    "the answers and commits"),
        batch_api=pending.facts, source_snapshot=ident.source_snapshot,
    )
    prep.clock.lap("batch API", batches=len(pending.facts["batches"]), pending=left)
    summary.stage_seconds = dict(prep.clock.seconds)
    recorder.summary = summary
    prep.log.summary(summary.render(), summary.to_dict())
    return summary
