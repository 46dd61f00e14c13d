"""The summary: what a run did, counted from the workers' counts and the tables read back, printed,
written (``run.summary_path``) and returned; a run whose rows do not add up fails here, counts recorded.
"""

from __future__ import annotations

from typing import Any, Mapping

from pipeline.core.compat import runtime_versions
from pipeline.errors import JobError
from pipeline.config.identity import RunIdentity
from pipeline.io.outputs import write_output
from pipeline.core.metrics import batch_metrics
from pipeline.core.rows import Status
from pipeline.core.run_counts import RunCounts
from pipeline.stages.outcomes import AlreadyCommitted, Committed, Prepared, ReadBack, RunPlan
from pipeline.core.run_summary import RunSummary

__all__ = ["already_committed", "build_summary", "finish", "summarize"]


def already_committed(prep: Prepared, identity: RunIdentity, done: AlreadyCommitted) -> RunSummary:
    """The summary of a retry of a run whose commit already landed: nothing scored, nothing written."""
    config = prep.config
    prep.say(done.note, identity)
    return RunSummary(
        versions=runtime_versions(),
        job=config.job, run_id=identity.run_id, ds=identity.ds.isoformat(), rows_in=0, rows_out=0, seconds=0.0,
        model_name=prep.model.name, model_revision=prep.model.revision, output=done.output,
        delta_version=done.version, writer=done.writer,
        details={"already committed": done.note},
    )


def build_summary(prep: Prepared, merged: Mapping[str, Any], *, counts: RunCounts | None = None,
                  known_bad: int = 0, after_commit: Mapping[str, str] | None = None,
                  batch_api: dict[str, Any] | None = None, **facts: Any) -> RunSummary:
    """The summary of a batch run or of a stream's record, from its merged worker counts: the one builder of both.

    Every counter's summary field (:meth:`pipeline.core.run_counts.RunCounts.summary_fields`), the per-batch
    metrics, the kind's own lines (``summary_lines`` of its job, then ``after_commit``'s lines, then the
    run's: known-bad rows skipped, malformed input, torch threads), the model and the runtime's versions;
    ``facts`` are the :class:`RunSummary` fields the counts do not say (run id, rows in and out, the output,
    the stream's facts...).

    Args:
        prep: the run's checks before any work (config, kind, model).
        merged: :func:`pipeline.core.metrics.merge_counts` of the tasks' (or micro-batches') counts.
        counts: ``merged`` read with the kind's counters (read here when None).
        known_bad: rows skipped as quarantined earlier with the same content and task fingerprint.
        after_commit: the lines of the kind's work after the commit (``TaskJob.after_commit``).
        batch_api: a served model in batch mode: what the provider's batches did (this try paid their tokens).
        **facts: the other :class:`RunSummary` fields.
    """
    config = prep.config
    counts = counts if counts is not None else RunCounts.from_merged(merged, task=prep.kind.job.counters)
    fields = counts.summary_fields()
    if fields.keys() & facts.keys():  # the counts say these; a caller's own value would hide them
        raise TypeError(f"build_summary: {', '.join(sorted(fields.keys() & facts.keys()))} come from the counts")
    details = {**prep.kind.job.summary_lines(prep.spark, config, counts, prep.model), **(after_commit or {}),
               **_summary_details(prep, known_bad, counts)}
    fields.update(
        # a served model in batch mode: this try paid what the batch answers it collected used (its tasks sent nothing)
        tokens=int(batch_api.get("tokens", 0)) if batch_api else fields["tokens"],
        # the loads of every worker that ran a task (0: it reused the model a task before it loaded)
        model_loads={w: fields["model_loads"].get(w, 0) for w in counts.tasks_per_worker},
        endpoint=_endpoint_stats(counts, batch_api),
    )
    return RunSummary(**{
        "versions": runtime_versions(), "job": config.job, "model_name": prep.model.name,
        "model_revision": prep.model.revision, "incremental": config.run.incremental, **fields,
        "batch_metrics": batch_metrics(merged), "details": details, "batch_api": batch_api or {}, **facts})


def _summary_details(prep: Prepared, known_bad: int, counts: RunCounts) -> dict[str, str]:
    """The summary's extra lines: known-bad rows skipped, malformed input, torch threads."""
    details: dict[str, str] = {}
    if known_bad:
        details["known-bad rows skipped"] = (f"{known_bad:,} (quarantined earlier with the same content and "
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
    incomplete = read.incomplete or kind.job.check_complete(
        rows_in=plan.rows_in, rows_out=read.rows_out, rows_quarantined=read.rows_quarantined, counts=counts)
    replaced = None
    if not incomplete and result.version is not None and read.rows_out:
        replaced = replaced_by(spark, result.output, run_id=run_id, version=result.version,
                               partition={"ds": ds} if plan.partition_ds is not None else {})
    after = kind.job.after_commit(spark, config, output=result.output, run_id=run_id, ds=ds) if not incomplete else {}
    return build_summary(
        prep, merged, counts=counts, known_bad=plan.known_bad, after_commit=after, batch_api=plan.batch_api,
        run_id=run_id, ds=ds.isoformat(), rows_in=plan.rows_in, rows_out=read.rows_out,
        rows_quarantined=read.rows_quarantined,
        quarantine=plan.quarantine_path if committed.quarantine_version is not None else None,
        seconds=committed.seconds, output=result.output, delta_version=result.version, writer=result.writer,
        samples=committed.samples,  # taken from the scored rows in hand, before the commits
        tasks=plan.tasks, incomplete=incomplete, replaced=replaced,
        rows_scored=plan.rows_in - int(counts.rows_reused), resume_note=plan.resume_note,
        source_snapshot=plan.identity.source_snapshot, source_note=plan.source_note, quality=committed.quality or {},
    )


def _endpoint_stats(counts: RunCounts, batch_api: dict[str, Any] | None) -> dict[str, Any]:
    """What the requests to a served model did; in batch mode with what this try paid for its batches."""
    stats = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in counts.endpoint.items()}
    if batch_api:
        stats["tokens_paid"] = int(batch_api.get("tokens", 0))
    return stats


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
