"""Orchestrate one job: read -> infer on the executors -> write Delta -> report.

The only module that orders the stages (:mod:`pipeline.stages`) of a run. ``run_job`` is what
spark-submit entries, the CLI and notebooks call::

    from pipeline import load_config, run_job
    summary = run_job(load_config("conf/score_documents.yaml", overrides=["source.limit=100"]))
    assert summary.complete
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.io.stores import using_settings
from pipeline.core.logs import RunLog
from pipeline.core.metrics import StageClock
from pipeline.stages.outcomes import AlreadyCommitted, Checkpoint
from pipeline.core.run_summary import RunSummary

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["JobError", "run_job"]


def run_job(config: JobConfig, *, spark: "SparkSession | None" = None, out: TextIO | None = None) -> RunSummary:
    """Run ``config`` end to end and return (and print) its summary.

    Rows whose scoring failed go to the quarantine table (``sink.quarantine_path``),
    the rest to the output. Before any commit the scored ``(id, content_hash)``
    keys must match the input's and the failed rows stay within the error budget
    (``pipeline.spark.checks``); the quarantine commits first, then the output, and
    both are read back at the versions committed and checked again by key.
    Every run, failed or not, leaves a row in the runs table (``pipeline.records.runs``).

    Its lines and events are records of the ``pipeline`` loggers (:mod:`pipeline.core.logs`): written to ``out``
    when given; else to stdout when nothing handles those loggers, or to the application's handlers when
    something does. ``run.log_format: json`` writes them as JSON lines, one event per driver stage among
    them. Every Spark job it starts is described ``[job] run <id>: <stage>`` (:mod:`pipeline.spark.job_labels`).
    """
    # every run on the record (runs table, report, MLflow); recording never fails the run
    from pipeline.records.recorder import RunRecorder
    from pipeline.spark.job_labels import JobLabels

    # the run id and ds resolved once, here: the record, the identity and every stage read these (a stream's
    # micro-batches take the day they start on, unless run.ds was given)
    fixed_ds = config.run.ds is not None
    run = config.run.model_copy(update={"run_id": config.run.resolved_run_id(), "ds": config.run.resolved_ds()})
    config = config.model_copy(update={"run": run})
    log = RunLog(job=config.job, run_id=run.run_id, out=out, fmt=config.run.log_format)
    clock = StageClock()
    clock.on_lap = log.stage  # one event per driver stage, with its seconds and counts
    labels = JobLabels(job=config.job, run_id=run.run_id)
    started = time.perf_counter()
    # the config's storage: section over the AWS_* environment for every table the job opens on S3
    with using_settings(config.storage.options()):
        recorder = RunRecorder.begin(config, run_id=run.run_id, ds=run.ds, log=log)
        clock.lap("runs table", version=recorder.version)
        try:
            from pipeline.spark.stopping import stop_on_sigterm

            # a stream is not cancelled: it stops once the micro-batch that runs has committed
            with stop_on_sigterm(lambda: recorder.session, cancel_jobs=config.source.stream is None) as stop:
                clock.between = stop.check
                try:
                    summary = _run_job(config, spark=spark, log=log, recorder=recorder, clock=clock, stop=stop,
                                       labels=labels, fixed_ds=fixed_ds)
                finally:
                    clock.between = lambda: None
                    labels.release()  # a notebook's session keeps no label of this run
        except BaseException as exc:
            log.failed(_failure_line(exc, config), error_class=type(exc).__name__,
                       seconds=time.perf_counter() - started)
            recorder.end(error=exc)
            raise
        clock.skip()
        recorder.end(summary=summary)
        # after the summary was printed: the returned summary has it, the printed one not
        clock.lap("runs table", version=recorder.version)
    summary.stage_seconds = dict(clock.seconds)
    return summary


def _run_job(config: JobConfig, *, spark: "SparkSession | None", log: RunLog, recorder: Any,
             clock: StageClock, stop: Any = False, labels: Any = None, fixed_ds: bool = True) -> RunSummary:
    """The stages of one run, in order: prepare, identify, plan, score and commit, read back, summary; a
    streaming job (``source.stream``): prepare, then its query (:func:`pipeline.stages.stream.run_stream`). A
    served model in batch mode has the provider's batches between the plan and the scoring
    (:mod:`pipeline.stages.batch`), and a run that ends before they do returns their summary.

    ``stop``: true once a SIGTERM asked the run to stop (``pipeline.spark.stopping.StopRequest``);
    ``labels``: what names the run's Spark jobs (``pipeline.spark.job_labels.JobLabels``); ``fixed_ds``:
    ``run.ds`` was given (a stream's micro-batches take the day they start on otherwise)."""
    from pipeline.errors import RunStopped
    from pipeline.stages.commit import score_and_commit
    from pipeline.stages.identify import identify
    from pipeline.stages.batch import BatchesPending, answered_plan, pending_summary, run_batches
    from pipeline.stages.planning import batch_mode, plan_run
    from pipeline.stages.prepare import prepare
    from pipeline.stages.summary import already_committed, finish, summarize

    prep = prepare(config, spark=spark, log=log, recorder=recorder, clock=clock, labels=labels)
    if config.source.stream is not None:
        from pipeline.stages.stream import run_stream

        return run_stream(prep, recorder=recorder, stop=stop, fixed_ds=fixed_ds)
    checkpoint = Checkpoint()
    try:
        identified = identify(prep)
        if identified.done is not None:
            return already_committed(prep, identified.identity, identified.done)
        plan = plan_run(prep, identified)
        checkpoint.staging_dir = plan.staging_dir
        if batch_mode(prep) and plan.rows_in:  # a served model's batch API: submitted, waited for, collected
            checkpoint.batches = True
            waited = run_batches(prep, plan)
            if isinstance(waited, BatchesPending):
                return pending_summary(prep, plan, waited, recorder=recorder)
            plan = answered_plan(prep, plan, waited)
        outcome = score_and_commit(prep, plan, checkpoint)
    except Exception as exc:
        if isinstance(exc, RunStopped) or stop:  # a cancelled Spark job surfaces as its error
            raise RunStopped(_stopped_message(checkpoint)) from None
        raise
    if isinstance(outcome, AlreadyCommitted):
        return already_committed(prep, plan.identity, outcome)
    committed, read = outcome
    return finish(prep, summarize(prep, plan, committed=committed, read=read), recorder=recorder)


def _failure_line(exc: BaseException, config: JobConfig) -> str:
    """The one line a failed run's event carries: what the CLI would print, the config's secrets scrubbed."""
    from pipeline.config.redaction import scrub
    from pipeline.core.error_text import error_line, is_spark_error

    text = error_line(exc) if is_spark_error(exc) else ((str(exc).strip().splitlines() or [""])[0]
                                                         or type(exc).__name__)
    return scrub(text, config.secret_values())


def _stopped_message(checkpoint: Checkpoint) -> str:
    """What a run stopped by SIGTERM says: whether anything may have committed, what is staged, how to resume."""
    from pipeline.journal.plans import staged_tasks

    if checkpoint.committing:
        return ("stopped by SIGTERM during its commit: the commit may have landed. Rerun the same command: a commit "
                "that landed is found and nothing is written twice")
    staged = len(staged_tasks(checkpoint.staging_dir))
    where = (f"{staged} finished inference task(s) are staged in {checkpoint.staging_dir}, and a rerun of the same "
             "command reuses them" if checkpoint.staging_dir
             else "nothing is staged (staging off), so a rerun scores every row again")
    if checkpoint.batches:
        where += ("; the batches submitted so far stay at the provider, journaled there too: the rerun polls and "
                  "collects them, submitting nothing again")
    return f"stopped by SIGTERM before its commit: nothing was committed; {where}. Resume: rerun the same command"
