"""The summary: what a run did, counted from the workers' counts and the tables read back, printed,
written (``run.summary_path``) and returned; a run whose rows do not add up fails here, counts recorded.
"""

from __future__ import annotations

from typing import Any

from pipeline.compat import runtime_versions
from pipeline.errors import JobError
from pipeline.identity import RunIdentity
from pipeline.io.outputs import write_output
from pipeline.metrics import batch_metrics
from pipeline.rows import Status
from pipeline.run_counts import RunCounts
from pipeline.stages.plan import AlreadyCommitted, Committed, Prepared, ReadBack, RunPlan
from pipeline.summary import RunSummary

__all__ = ["already_committed", "finish", "summarize"]


def already_committed(prep: Prepared, identity: RunIdentity, done: AlreadyCommitted) -> RunSummary:
    """The summary of a retry of a run whose commit already landed: nothing scored, nothing written."""
    config = prep.config
    prep.say(done.note, identity)
    return RunSummary(
        versions=runtime_versions(),
        job=config.job, run_id=identity.run_id, ds=identity.ds.isoformat(), rows_in=0, rows_out=0, status={},
        seconds=0.0, tokens=0, padded_tokens=0, batches=0, model_loads={}, model_name=prep.model.name,
        model_revision=prep.model.revision, output=done.output, delta_version=done.version, writer=done.writer,
        details={"already committed": done.note},
    )


def _summary_details(prep: Prepared, plan: RunPlan, counts: RunCounts) -> dict[str, str]:
    """The summary's extra lines: the kind's own, known-bad rows skipped, malformed input, torch threads."""
    details: dict[str, str] = {}
    if plan.known_bad:
        details["known-bad rows skipped"] = (f"{plan.known_bad:,} (quarantined earlier with the same content and "
                                             "task fingerprint; --retry-quarantined scores them again)")
    malformed = int(counts.status.get(Status.MALFORMED, 0))
    if malformed:
        details["malformed input"] = (f"{malformed:,} source line(s) could not be parsed; quarantined with their "
                                      f"raw text in input_{prep.task.input_columns[0]}")
    if counts.torch_threads:  # {threads: tasks}: spark.task.cpus, or model.torch_threads
        details["torch threads"] = ", ".join(f"{t} ({n} tasks)" for t, n in sorted(counts.torch_threads.items()))
    return details


def summarize(prep: Prepared, plan: RunPlan, *, committed: Committed, read: ReadBack) -> RunSummary:
    """The run's summary: counts, samples, whether every row is accounted for, and what replaced the output."""
    from pipeline.io.delta.tables import replaced_by

    config, spark, kind, ds, run_id = prep.config, prep.spark, prep.kind, plan.identity.ds, plan.identity.run_id
    result, merged = committed.result, committed.counts
    # the counters the kind's workers emit besides every kind's (its job's TaskCounts subclass)
    counts = RunCounts.from_merged(merged, task=kind.job.counters)
    prep.clock.lap("read-back", rows=read.rows_out, quarantined=read.rows_quarantined, scanned=read.written is not None)
    prep.stage("summary")
    samples = committed.samples  # taken from the scored rows in hand, before the commits
    incomplete = read.incomplete or kind.job.check_complete(
        rows_in=plan.rows_in, rows_out=read.rows_out, rows_quarantined=read.rows_quarantined, counts=counts)
    replaced = None
    if not incomplete and result.version is not None and read.rows_out:
        replaced = replaced_by(spark, result.output, run_id=run_id, version=result.version,
                               partition={"ds": ds} if plan.partition_ds is not None else {})
    details = kind.job.after_commit(spark, config, output=result.output, run_id=run_id, ds=ds) if not incomplete else {}
    details = {**kind.job.summary_lines(spark, config, counts, prep.model), **details,
               **_summary_details(prep, plan, counts)}
    quarantine_path = plan.quarantine_path
    # a served model in batch mode: this try paid what the batch answers it collected used (its tasks sent nothing)
    paid = int(plan.batch_api.get("tokens", 0)) if plan.batch_api else int(counts.tokens)
    return RunSummary(
        versions=runtime_versions(),
        job=config.job, run_id=run_id, ds=ds.isoformat(), rows_in=plan.rows_in, rows_out=read.rows_out,
        rows_quarantined=read.rows_quarantined,
        quarantine=quarantine_path if committed.quarantine_version is not None else None,
        status={k: int(v) for k, v in counts.status.items()}, seconds=committed.seconds,
        tokens=paid, padded_tokens=int(counts.padded_tokens), batches=int(counts.batches),
        model_loads={w: int(counts.model_loads.get(w, 0)) for w in counts.tasks_per_worker},
        model_name=prep.model.name, model_revision=prep.model.revision, output=result.output,
        delta_version=result.version, writer=result.writer,
        batch_sizes={k: int(v) for k, v in counts.batch_sizes.items()}, samples=samples,
        incremental=config.run.incremental, retries=_retries(counts),
        precision_used=counts.precision_used, precision_fallbacks=counts.precision_fallbacks,
        precision_checks=counts.precision_checks, precision_auto=counts.precision_auto,
        generation_backend=counts.generation_backend,
        load_seconds=float(counts.load_seconds), infer_seconds=float(counts.infer_seconds),
        profile_seconds=float(counts.profile_seconds),
        tasks=plan.tasks, rows_per_worker={w: int(n) for w, n in counts.rows_per_worker.items()},
        incomplete=incomplete, details=details, replaced=replaced,
        batch_metrics=batch_metrics(merged), resumed_tasks=int(counts.resumed_tasks),
        rows_reused=int(counts.rows_reused), rows_scored=plan.rows_in - int(counts.rows_reused),
        resume_note=plan.resume_note, source_snapshot=plan.identity.source_snapshot, source_note=plan.source_note,
        prompt_tokens=int(counts.prompt_tokens), completion_tokens=int(counts.completion_tokens),
        endpoint=_endpoint_stats(counts, plan.batch_api),
        quality=committed.quality or {}, batch_api=plan.batch_api or {},
    )


def _endpoint_stats(counts: RunCounts, batch_api: dict[str, Any] | None) -> dict[str, Any]:
    """What the requests to a served model did; in batch mode with what this try paid for its batches."""
    stats = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in counts.endpoint.items()}
    if batch_api:
        stats["tokens_paid"] = int(batch_api.get("tokens", 0))
    return stats


def _retries(counts: RunCounts) -> dict[str, int]:
    """What was retried or split, in this order, leaving out what did not happen."""
    retried = {"oom_splits": counts.oom_splits, "adaptive_splits": counts.adaptive_splits,
               "poison_bisections": counts.poison_bisections, "task_retries": counts.task_retries}
    return {k: int(v) for k, v in retried.items() if v}


def finish(prep: Prepared, summary: RunSummary, *, recorder: Any) -> RunSummary:
    """Print (and write) the summary; a run whose rows do not add up fails here, with its counts recorded."""
    config = prep.config
    prep.clock.lap("summary")
    summary.stage_seconds = dict(prep.clock.seconds)
    recorder.summary = summary  # a run failing its row check below is recorded with its counts
    prep.log.summary(summary.render(), summary.to_dict())
    if config.run.summary_path:  # a local path or an object (s3://), never a local folder named after a scheme
        write_output(config.run.summary_path, summary.to_json(), key="run.summary_path")
    if not summary.complete:
        raise JobError(f"{summary.incomplete}; see the summary above")
    return summary
