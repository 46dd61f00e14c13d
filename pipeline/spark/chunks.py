"""The per-chunk steps of one scoring task on an executor, on plain Arrow values.

``pipeline.spark.udf.score_partition`` is the ``mapInArrow`` function; these are
the steps it runs on every chunk, each taking plain values (batches, column
names, the task's :class:`~pipeline.core.metrics.WorkerCounts`), never the plan:

- :func:`split_null_ids`: rows without an id are flagged ``invalid_id`` and never reach the model;
- :func:`task_results`, :func:`join_results`: the task's results, beside each chunk's kept columns, in
  input order (the flagged rows back in their places: a column function's output is matched to its
  input row by position);
- :func:`profile_chunk`: each output chunk sketched into the task's profile (:mod:`pipeline.core.sketches`);
- :func:`carry_failed_inputs`: a quarantined row's own inputs carried out beside its results (the quarantine
  table keeps them), null on every other row;
- :func:`with_metrics`: the metrics column that carries the task's counts on its last row (so run metrics
  work on Spark Connect, which has no accumulators);
- :func:`digesting`, :func:`finish_stage`, :func:`replay_staged`: the worker side of staging
  (:mod:`pipeline.journal.tasks`): the input digested as it is read, the rows staged at the task's end,
  or a finished try's staged rows replayed instead of scoring.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from pipeline.core.metrics import WorkerCounts
from pipeline.core.rows import INVALID_ID, MALFORMED_COLUMN, QUARANTINED_STATUSES

__all__ = ["CARRIED_PREFIX", "Taken", "carry_failed_inputs", "digesting", "each_hook", "finish_profile", "finish_stage", "in_input_order", "join_results",
           "profile_chunk", "replay_staged", "split_null_ids", "task_results", "with_metrics"]

# a quarantined row's input column ``c`` comes out of the task as ``_sbi_input_<c>``
CARRIED_PREFIX = "_sbi_input_"

# one chunk as split_null_ids left it: rows with an id, the rows without one already flagged (or None), and
# the mask of which rows those were (or None)
Taken = tuple[pa.RecordBatch, "pa.RecordBatch | None", Any]


def digesting(batches: Iterator[pa.RecordBatch], digest: Any) -> Iterator[pa.RecordBatch]:
    """``batches`` unchanged, each added to ``digest`` (an :class:`~pipeline.journal.tasks.InputDigest`) as read."""
    for batch in batches:
        digest.update(batch)
        yield batch


def finish_stage(stage: Any, digest: Any, counts: WorkerCounts) -> None:
    """Stage the task's rows (durable, then its marker); a failure to stage never fails the task."""
    if stage is None:
        return
    try:
        stage.finish(digest=digest.value(), counts=counts.counts)
    except (OSError, pa.ArrowException):
        stage.abandon()
        counts.add("staging_errors")


def replay_staged(table: pa.Table, stored: dict[str, Any], *, metrics_column: str | None, input_rows: int,
                  rows_file: Any) -> Iterator[pa.RecordBatch]:
    """A reused task's staged rows, its counts (:func:`~pipeline.core.metrics.reused_counts` of its
    ``input_rows``) on the last row."""
    from pipeline.core.metrics import reused_counts

    counts = reused_counts(stored, rows=input_rows)
    if rows_file is not None:
        done = WorkerCounts()
        done.merge({"progress_rows": input_rows})
        rows_file(done, force=True)
    chunks = [b for b in table.to_batches() if b.num_rows]
    for n, batch in enumerate(chunks):
        if metrics_column is None:
            yield batch
        else:
            last = n == len(chunks) - 1
            yield with_metrics(batch, metrics_column, json.dumps(counts) if last else None)


def profile_chunk(task: Any, out: pa.RecordBatch, profile: Any) -> None:
    """Add an output chunk to the task's :class:`~pipeline.core.sketches.Profile` (None: not profiling): the kind's
    ``profile_output``, else every kind's part (statuses and tokens)."""
    if profile is None:
        return
    started = time.perf_counter()
    hook = getattr(task, "profile_output", None)
    if hook is not None:
        hook(out, profile)
    else:
        profile.rows(out)
    profile.seconds += time.perf_counter() - started


def finish_profile(profile: Any, counts: WorkerCounts) -> None:
    """The task's profile into its counts (``profile``), and the seconds it cost (``profile_seconds``)."""
    if profile is not None:
        counts.merge({"profile": profile.data})
        counts.add("profile_seconds", profile.seconds)


def each_hook(*hooks: Any) -> Any:
    """One ``on_batch`` hook calling each of ``hooks`` that is set (None when none is)."""
    live = [h for h in hooks if h is not None]
    if len(live) <= 1:
        return live[0] if live else None
    return lambda counts: [h(counts) for h in live]


def join_results(results: Iterator[pa.RecordBatch], taken: "deque[Taken]", keep: tuple[str, ...],
                 counts: WorkerCounts) -> Iterator[pa.RecordBatch]:
    """Each chunk's kept columns beside its results, its rows without an id in their places, in input order.

    ``taken`` holds each chunk read so far as :func:`split_null_ids` split it (rows with an id, rows without
    one already flagged or None, which rows those were); ``results`` has one result per chunk that had rows
    with an id.
    """
    while True:
        t0 = time.perf_counter()
        result = next(results, None)
        # the time this thread spends in the task for the chunk (chunks ahead read and tokenised included)
        counts.add("infer_seconds", time.perf_counter() - t0)
        while taken and taken[0][0].num_rows == 0 and taken[0][1] is not None:
            yield taken.popleft()[1]  # rows without ids only: no result of the task's
        if result is None:
            break
        valid, invalid, missing = taken.popleft()
        out = pa.RecordBatch.from_arrays([valid.column(c) for c in keep] + list(result.columns),
                                         names=list(keep) + result.schema.names)
        yield out if invalid is None else in_input_order(out, invalid, missing)
    for _, invalid, _ in taken:  # the task's stream ended: what is left holds rows without ids only
        if invalid is not None:
            yield invalid


def in_input_order(scored: pa.RecordBatch, flagged: pa.RecordBatch, missing: Any) -> pa.RecordBatch:
    """One chunk's ``scored`` rows and its ``flagged`` rows (``missing``: a mask over the chunk, true where a
    row was flagged) back in the chunk's order.

    >>> scored = pa.record_batch({"id": ["a", "c"], "status": ["ok", "ok"]})
    >>> flagged = pa.record_batch({"id": pa.array([None], pa.string()), "status": ["invalid_id"]})
    >>> in_input_order(scored, flagged, pa.array([False, True, False])).column("status").to_pylist()
    ['ok', 'invalid_id', 'ok']
    """
    rows = pa.Table.from_batches([scored])
    both = pa.concat_tables([rows, pa.Table.from_batches([flagged.select(scored.schema.names)]).cast(rows.schema)])
    mask = np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool)
    positions = np.concatenate([np.flatnonzero(~mask), np.flatnonzero(mask)])
    return both.take(pa.array(np.argsort(positions, kind="stable"))).combine_chunks().to_batches()[0]


def split_null_ids(batch: pa.RecordBatch, schema: pa.Schema, *, keep: tuple[str, ...], id_column: str,
                   counts: WorkerCounts) -> "Taken":
    """``(rows with an id, the rows without one already flagged, which rows those were)``; the last two
    ``None`` when every row has an id.

    ``schema`` is the task's output schema, ``keep`` the columns kept beside its results (``id`` first),
    ``id_column`` the source's id column (named in the error). A row without an id cannot be keyed: an
    append or incremental run could not tell it from another, so it would be written again every night.
    It gets status ``invalid_id`` (quarantined with its content) and never reaches the model. A malformed
    source line (no id either) stays with the task, which flags it ``malformed``. Tasks without the status
    columns keep every row.
    """
    import pyarrow.compute as pc

    ids = batch.column("id")
    if ids.null_count == 0 or "status" not in schema.names or "error" not in schema.names:
        return batch, None, None
    missing = pc.is_null(ids)
    if MALFORMED_COLUMN in batch.schema.names:
        missing = pc.and_(missing, pc.is_null(batch.column(MALFORMED_COLUMN)))
    if not pc.any(missing).as_py():
        return batch, None, None
    flagged = batch.filter(missing)
    n = flagged.num_rows
    message = (f"no id: source column {id_column!r} is null, so the row cannot be keyed (an append or "
               "incremental run could not tell it from another); give it an id or leave it out with source.where")
    results = [pa.array([INVALID_ID] * n, pa.string()) if f.name == "status" else
               pa.array([message] * n, pa.string()) if f.name == "error" else pa.nulls(n, f.type) for f in schema]
    invalid = pa.RecordBatch.from_arrays([flagged.column(c) for c in keep] + results,
                                         names=[*keep, *schema.names])
    counts.add_status({INVALID_ID: n})
    return batch.filter(pc.invert(missing)), invalid, missing


def task_results(task: Any, loaded: Any, inputs: Iterator[pa.RecordBatch], counts: WorkerCounts,
                 cpus: int) -> Iterator[pa.RecordBatch]:
    """The task's result chunks, in input order: its own stream (text tasks overlap the model), else chunk by chunk."""
    stream = getattr(task, "process_stream", None)
    if stream is not None:
        yield from stream(loaded, inputs, counts, cpus=max(1, int(cpus or 1)))
    else:
        for chunk in inputs:
            yield task.process(loaded, chunk, counts)


def carry_failed_inputs(out: pa.RecordBatch, keep: tuple[str, ...], carried: tuple[str, ...]) -> pa.RecordBatch:
    """``out`` (the ``keep`` columns, the ``carried`` input columns, then the task's) in the order of the output
    schema: kept, the task's, then each carried column as ``_sbi_input_<c>``, null on every row whose status is
    not quarantined (only a failed row's inputs travel on to the quarantine table).

    >>> out = pa.record_batch({"id": ["a", "b"], "text": ["fine", "bad"], "status": ["ok", "error"]})
    >>> moved = carry_failed_inputs(out, ("id",), ("text",))
    >>> moved.schema.names, moved.column("_sbi_input_text").to_pylist()
    (['id', 'status', '_sbi_input_text'], [None, 'bad'])
    """
    if not carried:
        return out
    import pyarrow.compute as pc

    names = out.schema.names
    own = [n for n in names if n not in carried or n in keep]
    if "status" in names:
        failed = pc.fill_null(pc.is_in(out.column("status"), pa.array([str(s) for s in QUARANTINED_STATUSES])), False)
    else:
        failed = pa.array([False] * out.num_rows)
    moved = [pc.if_else(failed, out.column(c), pa.scalar(None, out.schema.field(c).type)) for c in carried]
    return pa.RecordBatch.from_arrays([out.column(n) for n in own] + moved,
                                      names=own + [CARRIED_PREFIX + c for c in carried])


def with_metrics(batch: pa.RecordBatch, column: str | None, counts_json: str | None) -> pa.RecordBatch:
    """``batch`` plus the metrics column: null everywhere, ``counts_json`` on the last row.

    >>> out = with_metrics(pa.record_batch({"id": [1, 2]}), "_m", '{"rows": 2}')
    >>> out.schema.names, out.column("_m").to_pylist()
    (['id', '_m'], [None, '{"rows": 2}'])
    """
    values = [None] * batch.num_rows
    if counts_json is not None and values:
        values[-1] = counts_json
    return pa.RecordBatch.from_arrays([*batch.columns, pa.array(values, pa.string())],
                                      names=[*batch.schema.names, str(column)])
