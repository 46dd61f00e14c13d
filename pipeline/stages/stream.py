"""A streaming job (``source.stream``): the source read as a stream, each micro-batch scored and committed
once (:mod:`pipeline.stages.micro_batch`), and the run on the record.

- ``available_now``: the query scores what the source holds (in micro-batches of
  ``stream.max_files_per_trigger``) and stops: one runs-table row for the whole run, its summary the sum of
  its micro-batches, with the source offsets it read (a nightly job that reads only what arrived).
- ``processing_time``: a micro-batch every ``stream.interval_s`` until SIGTERM; one runs-table row (and
  summary) per ``stream.record_every_s`` of micro-batches, each under a run id of its own (the first is the
  run's, then ``<run id>.2``, ``.3``...), and one for the last stretch when it stops.

Each micro-batch goes through the drift gate (``run.quality``); a record's runs-table row carries the profile
of all its micro-batches and the verdict of the last one that moved.

SIGTERM stops the query after the micro-batch that runs (its commits included); the next one is never
started, and a restart from the checkpoint reads it. A micro-batch that fails (its error budget
exceeded, a failed commit) stops the query with its error; a source whose schema changed, or a Delta
source whose rows were deleted or updated, stops it with a :class:`SourceError` that says so
(:func:`pipeline.io.streams.stream_failure`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pipeline.errors import JobError, RunStopped
from pipeline.config.identity import run_identity
from pipeline.core.metrics import merge_counts
from pipeline.core.sessions import is_connect
from pipeline.stages.micro_batch import BatchResult, MicroBatches
from pipeline.stages.outcomes import Prepared
from pipeline.stages.summary import build_summary, finish
from pipeline.core.run_summary import RunSummary

__all__ = ["check_streamable", "run_stream", "stream_summary"]

_POLL_S = 1.0


def check_streamable(prep: Prepared) -> None:
    """Refuse, before the query starts, a streaming job this library cannot run exactly once."""
    from pipeline.endpoint.attempt import journals_requests

    config = prep.config
    why = None
    if is_connect(prep.spark):
        why = ("its micro-batches commit through foreachBatch, which a Spark Connect session runs on the server, "
               "away from this driver; run it on a classic session (a job cluster), or score the stream with "
               "score(df) into your own writeStream")
    elif prep.kind.job.not_for_dataframes:
        why = f"task.kind {config.task.kind} is not one row out per row in: {prep.kind.job.not_for_dataframes}"
    elif journals_requests(prep.task):
        why = ("a served model's answers are journaled in a run's staging folder so that none is paid for twice, "
               "and a micro-batch stages nothing; score served models in a batch job")
    if why:
        raise JobError(f"source.stream: this job cannot run as a stream: {why}")


def run_stream(prep: Prepared, *, recorder: Any, stop: Any, fixed_ds: bool) -> RunSummary:
    """Start the query, feed the runs table while it runs, and return the summary of its last (or only) run.

    ``recorder``: the run's :class:`pipeline.records.recorder.RunRecorder` (moved on to the next run id per interval);
    ``stop``: the SIGTERM flag (:class:`pipeline.spark.stopping.StopRequest`); ``fixed_ds``: ``run.ds`` was given.
    """
    config = prep.config
    stream = config.source.stream
    assert stream is not None
    check_streamable(prep)
    prep.stage("stream")
    from pipeline.io.streams import open_stream
    from pipeline.core.locations import resolve_location

    identity = run_identity(config, model_revision=prep.model.revision, source_snapshot=None)
    batches = MicroBatches(prep, identity, fixed_ds=fixed_ds, on_batch=lambda result: prep.say(result.line()))
    opened = open_stream(prep.spark, config.source)
    writer = (opened.df.writeStream.foreachBatch(batches)
              .option("checkpointLocation", resolve_location(stream.checkpoint_path)))
    if opened.until is not None:  # available now in limited micro-batches, below Spark 4.2: stopped at `until`
        trigger = {"processingTime": "0 seconds"}
    elif stream.trigger == "available_now":
        trigger = {"availableNow": True}
    else:
        trigger = {"processingTime": f"{int(stream.interval_s * 1000)} milliseconds"}
    query = writer.trigger(**trigger).start()
    batches.begin(str(query.id))
    prep.clock.between = lambda: None  # from here a SIGTERM stops the query between micro-batches, not a stage
    prep.say(f"streaming {config.source.format} {config.source.path} -> {config.sink.path or config.sink.table} "
             f"({stream.trigger.replace('_', ' ')}{_every(stream)}; checkpoint {stream.checkpoint_path}, query "
             f"{query.id})")
    prep.clock.lap("stream start")
    watch = _Watch(query, started=time.perf_counter(), run_id=batches.run_id, until=opened.until)
    try:
        _watch_query(prep, query, batches, watch, stop=stop, recorder=recorder)
    except BaseException as exc:
        _stop_quietly(query)
        summary = recorder.summary = stream_summary(prep, batches.take_results(), watch)
        if getattr(exc, "quality", None):  # the drift gate refused a micro-batch: its verdict is the record's
            summary.quality = {"profile": summary.quality.get("profile") or exc.quality.get("profile") or {},
                               "drift": exc.quality.get("drift") or {}}
        if isinstance(exc, RunStopped):  # what it committed is on the record, and said
            prep.log.summary(summary.render(), summary.to_dict())
            raise RunStopped(_stopped_line(summary)) from None
        raise
    prep.clock.lap("stream")
    return finish(prep, stream_summary(prep, batches.take_results(), watch), recorder=recorder)


def _every(stream: Any) -> str:
    return f" every {stream.interval_s:g} s" if stream.trigger == "processing_time" else ""


class _Watch:
    """The query's progress by batch id (from ``recentProgress``, polled), and the current record's start."""

    def __init__(self, query: Any, *, started: float, run_id: str, until: int | None = None) -> None:
        self.query, self.started, self.run_id, self.intervals = query, started, run_id, 1
        self.progress: dict[int, dict[str, Any]] = {}
        self.until = until  # an available-now run on a processing-time trigger: the version it reads to

    def read_until(self, batches: MicroBatches) -> bool:
        """Whether a run with :attr:`until` is done: Spark reported a micro-batch (committed) that read through
        that version, and no micro-batch is running or unreported."""
        if self.until is None or not batches.idle.is_set() or not self.reported(batches.results):
            return False
        for data in self.progress.values():
            for source in data.get("sources") or []:
                end = source.get("endOffset")
                end = json.loads(end) if isinstance(end, str) and end.startswith("{") else end
                if isinstance(end, dict) and not end.get("snapshot") and int(end.get("version", -1)) >= self.until:
                    return True
        return False

    def poll(self) -> None:
        try:
            updates = self.query.recentProgress
        except Exception:  # noqa: BLE001 - the query is going down: what was polled stays
            return
        for update in updates:
            data = json.loads(update.json) if hasattr(update, "json") else dict(update)
            self.progress[int(data["batchId"])] = data  # a micro-batch's own report replaces a no-data one

    def settle(self, batches: MicroBatches, timeout_s: float = 30.0) -> None:
        """Wait until the query reported the micro-batches that finished (Spark reports one once its checkpoint
        records it done), so a stop now does not make a restart read a committed micro-batch again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.poll()
            if self.reported(batches.results):
                return
            time.sleep(0.2)

    def reported(self, results: list[BatchResult]) -> bool:
        """Whether the query reported each of ``results``' micro-batches (a report of no data that Spark posts
        under the next batch id before that micro-batch runs does not count)."""
        return all(self.progress.get(r.batch_id, {}).get("numInputRows", 0) for r in results if r.rows_in)


def _watch_query(prep: Prepared, query: Any, batches: MicroBatches, watch: _Watch, *, stop: Any,
                 recorder: Any) -> None:
    """Wait for the query (polling its progress), stop it after the running micro-batch on SIGTERM, and move
    the runs table on to the next record every ``stream.record_every_s`` of a ``processing_time`` stream."""
    from pipeline.io.streams import stream_failure

    stream = prep.config.source.stream
    assert stream is not None
    while True:
        try:
            done = query.awaitTermination(_POLL_S)
        except Exception as exc:  # noqa: BLE001 - the query failed: its micro-batch's own error first
            if stop or isinstance(batches.failure, RunStopped):
                raise RunStopped("stopped by SIGTERM") from None
            raise (batches.failure or stream_failure(exc, prep.config.source)
                   or JobError(f"the streaming query failed: {_first_line(exc)}")) from exc
        watch.poll()
        if stop:
            batches.stop()  # the running micro-batch finishes its commits; the next one is refused
            watch.settle(batches)  # and Spark records it done in the checkpoint
            _stop_quietly(query)
            raise RunStopped("stopped by SIGTERM")
        if done:
            return
        if watch.read_until(batches):  # everything the table held at the start is committed: stop here
            watch.settle(batches)
            _stop_quietly(query)
            return
        if stream.trigger == "processing_time" and time.perf_counter() - watch.started >= stream.record_every_s:
            _next_record(prep, batches, watch, recorder)


def _next_record(prep: Prepared, batches: MicroBatches, watch: _Watch, recorder: Any) -> None:
    """End the current runs-table record with the micro-batches it covers and start the next, between two
    micro-batches (none runs meanwhile) and once their progress is in."""
    with batches.lock:
        if not batches.results or not batches.idle.is_set() or not watch.reported(batches.results):
            return  # a quiet stretch adds no row; a micro-batch runs, or its report is not in yet: next poll
        results, batches.results = batches.results, []
        prep.clock.lap("stream")
        summary = finish(prep, stream_summary(prep, results, watch), recorder=recorder)
        recorder.end(summary=summary)
        watch.intervals += 1
        run_id = f"{prep.config.run.resolved_run_id()}.{watch.intervals}"
        recorder.next_run(run_id)
        batches.run_id = watch.run_id = run_id
        watch.started = time.perf_counter()
        if prep.labels is not None:
            prep.labels.run_id = run_id


def stream_summary(prep: Prepared, results: list[BatchResult], watch: _Watch) -> RunSummary:
    """The summary of a stream's run (or interval): the sum of its micro-batches, and what the query read.

    Built by the batch run's builder (:func:`pipeline.stages.summary.build_summary`) from the micro-batches'
    merged counts, so it has every counter field a batch run's summary has, and the kind's own lines."""
    config = prep.config
    written = [r for r in results if not r.replayed]
    merged: dict[str, Any] = {}
    for r in written:
        merge_counts(merged, r.counts)
    last = next((r for r in reversed(results) if r.version is not None), None)
    quarantined = sum(r.rows_quarantined for r in written)
    sink = config.sink
    return build_summary(
        prep, merged, run_id=watch.run_id, ds=written[-1].ds if written else config.run.resolved_ds().isoformat(),
        rows_in=sum(r.rows_in for r in written), rows_out=sum(r.rows_out for r in written),
        rows_quarantined=quarantined, quarantine=sink.resolved_quarantine_path() if quarantined else None,
        seconds=time.perf_counter() - watch.started,
        output=last.output if last else str(sink.path or sink.table), delta_version=last.version if last else None,
        writer=last.writer if last else "", tasks=sum(r.tasks for r in written),
        rows_scored=sum(r.rows_in for r in written), quality=_stream_quality(merged, written),
        stream=_stream_facts(config, results, watch),
    )


def _stream_quality(merged: dict[str, Any], written: list[BatchResult]) -> dict[str, Any]:
    """The record's quality: the profile of all its micro-batches (the sketches add up, so the next runs are
    compared with the whole run or interval) and the drift verdict of its last micro-batch that moved (else of
    its last one); empty when no micro-batch went through the gate (``run.quality`` off).

    >>> batch = lambda action: BatchResult(0, "r", "2026-01-01", quality={"drift": {"action": action}})
    >>> _stream_quality({"profile": {"cat": {}}}, [batch("warned"), batch("passed")])
    {'profile': {'cat': {}}, 'drift': {'action': 'warned'}}
    """
    gated = [r.quality for r in written if r.quality]
    if not gated:
        return {}
    moved = [q for q in gated if (q.get("drift") or {}).get("action") not in (None, "passed")]
    return {"profile": merged.get("profile") or {}, "drift": (moved or gated)[-1].get("drift") or {}}


def _stream_facts(config: Any, results: list[BatchResult], watch: _Watch) -> dict[str, Any]:
    """What the summary and the runs table say about the query: its micro-batches and the offsets read."""
    stream = config.source.stream
    ids = [r.batch_id for r in results]
    facts: dict[str, Any] = {"trigger": stream.trigger, "checkpoint": stream.checkpoint_path,
                             "query_id": str(watch.query.id), "micro_batches": len(ids),
                             "batch_ids": [min(ids), max(ids)] if ids else [],
                             "replayed": [r.batch_id for r in results if r.replayed]}
    first, last = (watch.progress.get(min(ids)), watch.progress.get(max(ids))) if ids else (None, None)
    if first and last:  # one source: its offsets before the first micro-batch and after the last
        facts["sources"] = [{"source": f"{config.source.format} {config.source.path}",
                             "start_offset": source.get("startOffset"), "end_offset": end.get("endOffset")}
                            for source, end in zip(first.get("sources") or [], last.get("sources") or [])]
    return facts


def _stopped_line(summary: RunSummary) -> str:
    """What a stream stopped by SIGTERM says: what it committed, and that a restart goes on from there."""
    facts = summary.stream
    done = (f"micro-batches {facts['batch_ids'][0]}-{facts['batch_ids'][1]} committed ({summary.rows_in:,} rows)"
            if facts.get("batch_ids") else "no micro-batch committed")
    return (f"stopped by SIGTERM after the micro-batch that was running: {done}. Run the same command again: the "
            f"stream goes on from its checkpoint ({facts.get('checkpoint')}) with the next micro-batch")


def _stop_quietly(query: Any) -> None:
    try:
        query.stop()
    except Exception:  # noqa: BLE001 - the query is down already
        pass


def _first_line(exc: BaseException) -> str:
    from pipeline.core.error_text import error_line

    return error_line(exc)
