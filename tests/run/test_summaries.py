"""One summary builder for batch runs and streams (pipeline.stages.summary.build_summary): a stream's summary,
made from the same merged worker counts as a batch run's, has every counter field and summary line the batch
run's has, and only its own stream facts besides. No Spark: the stages' inputs are plain values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline.config import build_config
from pipeline.config.identity import RunIdentity
from pipeline.core.metrics import WorkerCounts, merge_counts
from pipeline.registry import ModelInfo, get_task_kind
from pipeline.core.run_counts import BY_KEY, RunCounts
from pipeline.stages.micro_batch import BatchResult
from pipeline.stages.outcomes import Committed, ReadBack, RunPlan
from pipeline.stages.stream import _Watch, stream_summary
from pipeline.stages.summary import build_summary, summarize
from pipeline.core.run_summary import RunSummary

# what a batch run knows that a stream's record does not: rows sampled before the commit, what replaced its
# output since, why staged output was not reused, the source's snapshot; and the stream's own facts
BATCH_ONLY = {"samples", "replaced", "resume_note", "source_snapshot", "source_note"}
STREAM_ONLY = {"stream"}
# the printed lines of those facts (the label before the colon)
BATCH_ONLY_LINES = {"sample", "since then", "not resumed", "source"}
STREAM_ONLY_LINES = {"stream"}

OCR_TASK = {"kind": "ocr", "image_column": "path", "image_input": "path", "reference_column": "reference_text"}


def _config(tmp_path: Path, task: dict[str, Any], *, stream: bool):
    source: dict[str, Any] = {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id"}
    if stream:
        source["stream"] = {"checkpoint_path": str(tmp_path / "checkpoint")}
    return build_config({"job": "score_test", "source": source, "model": {"path": str(tmp_path / "model")},
                         "task": task, "sink": {"path": str(tmp_path / "scores"), "mode": "append"},
                         "run": {"progress": False, "ds": "2026-11-28"}})


def _prep(config) -> SimpleNamespace:
    """What the summary stages read of a run's :class:`~pipeline.stages.outcomes.Prepared` (no session: the kinds
    here read none for their lines)."""
    clock = SimpleNamespace(lap=lambda *a, **k: 0.0)
    return SimpleNamespace(config=config, kind=get_task_kind(config.task.kind), model=ModelInfo("/m", "tiny", "abc"),
                           spark=None, clock=clock, stage=lambda name: None,
                           task=SimpleNamespace(input_columns=("text",)))


def _task_counts(worker: str, kind_counters: dict[str, Any]) -> dict[str, Any]:
    """One task's counts with every counter of every run counted (not zero), as a worker emits them."""
    counts = WorkerCounts(worker=worker, task=0, clock=lambda: 1_700_000_000.0)
    counts.add("rows", 4)
    counts.add_status({"ok": 2, "error": 1, "malformed": 1})
    counts.add_batch(rows=4, tokens=30, padded_tokens=40, padded_length=10, seconds=0.25)
    counts.merge({"tasks_per_worker": {worker: 1}, "model_loads": {worker: 1}, "rows_per_worker": {worker: 4},
                  "torch_threads": {"2": 1}, "endpoint": {"requests": 3, "retry_429": 1}, **kind_counters})
    declared = {f.name: f for f in dataclasses.fields(RunCounts) if f.name != "task"}
    for name, f in declared.items():  # the rest: one of each, so a counter a summary drops shows
        if name not in counts.counts:
            by_key = f.metadata.get("merge") == BY_KEY
            counts.merge({name: {f"{name}-x": 1} if by_key else (1.5 if f.type == "float" else 1)})
    return counts.counts


def _both(tmp_path: Path, task: dict[str, Any], kind_counters: dict[str, Any]) -> tuple[RunSummary, RunSummary]:
    """A batch run's summary and a stream's, of two tasks (two micro-batches) that counted the same."""
    first, second = _task_counts("h:1", kind_counters), _task_counts("h:2", kind_counters)
    merged = merge_counts(merge_counts({}, first), second)
    config = _config(tmp_path, task, stream=False)
    identity = RunIdentity(job="score_test", run_id="r1", ds=dt.date(2026, 11, 28), run_key="k", app_id="k",
                           task_fingerprint="f", source_snapshot="delta:t:3", try_id="t1")
    plan = RunPlan(identity=identity, sink=config.sink, key_columns=(), read_version=None, source_note="rebuilt",
                   inputs=None, scored=None, rows_in=8, tasks=2, known_bad=0, resume_note="nothing staged")
    result = SimpleNamespace(version=1, output=str(tmp_path / "scores"), writer="deltalake")
    committed = Committed(result=result, counts=merged, seconds=2.0, quarantine_version=1, quarantine_run="r1",
                          samples=[{"doc_id": "d1"}])
    batch = summarize(_prep(config), plan, committed=committed, read=ReadBack(None, 6, 2, None))

    stream_config = _config(tmp_path, task, stream=True)
    results = [BatchResult(i, "r1", "2026-11-28", rows_in=4, rows_out=3, rows_quarantined=1, tasks=1, version=i,
                           output=result.output, writer="deltalake", counts=counts)
               for i, counts in enumerate((first, second))]
    watch = _Watch(SimpleNamespace(id="q"), started=time.perf_counter(), run_id="r1")
    return batch, stream_summary(_prep(stream_config), results, watch)


def _set(summary: RunSummary) -> set[str]:
    """The summary's fields that say something (not their empty default)."""
    defaults = RunSummary(job="", run_id="", ds="", rows_in=0, rows_out=0, status={}, seconds=0.0, tokens=0,
                          padded_tokens=0, batches=0, model_loads={}, model_name="", model_revision="", output="",
                          delta_version=None, writer="")
    return {f.name for f in dataclasses.fields(RunSummary)
            if getattr(summary, f.name) != getattr(defaults, f.name)}


def _labels(summary: RunSummary) -> set[str]:
    """The categories of the printed lines: the label before each line's colon."""
    return {line.split(":", 1)[0].strip() for line in summary.render().splitlines()[1:]}


@pytest.mark.parametrize("task, kind_counters", [
    ({"kind": "embed"}, {}),
    (OCR_TASK, {"images_inferred": 4, "ocr_lines": 9, "ocr_detect_seconds": 0.5, "cer_errors": 0.5,
                "cer_reference_chars": 40}),
], ids=["embed", "ocr"])
def test_a_streams_summary_has_every_counter_field_and_line_of_a_batch_runs(tmp_path, monkeypatch, task,
                                                                            kind_counters):
    import pipeline.io.delta.tables

    monkeypatch.setattr(pipeline.io.delta.tables, "replaced_by", lambda *a, **k: None)  # no table to look at
    batch, stream = _both(tmp_path, task, kind_counters)
    # every counter's summary field, filled and the same from the same counts (the retries, the precision gate,
    # the generation backend...), the per-batch metrics, and the kind's own lines
    for name in RunCounts.summary_targets():
        assert getattr(batch, name), f"the test's counts leave {name} empty: it would not show a stream dropping it"
        assert getattr(stream, name) == getattr(batch, name), name
    assert stream.batch_metrics == batch.batch_metrics and stream.details == batch.details
    assert {"torch threads", "malformed input"} <= batch.details.keys()
    if task["kind"] == "ocr":
        assert "character error rate" in stream.details
    # no field a batch run sets is left out of the stream's but the batch run's own facts, and the same lines
    assert _set(batch) - _set(stream) <= BATCH_ONLY, _set(batch) - _set(stream)
    assert _set(stream) - _set(batch) <= STREAM_ONLY
    assert _labels(batch) - _labels(stream) <= BATCH_ONLY_LINES, _labels(batch) - _labels(stream)
    assert _labels(stream) - _labels(batch) <= STREAM_ONLY_LINES
    assert (batch.rows_in, batch.rows_out, batch.rows_quarantined) == (stream.rows_in, stream.rows_out,
                                                                       stream.rows_quarantined)


def test_every_counter_fills_a_field_the_summary_has():
    summary_fields = {f.name for f in dataclasses.fields(RunSummary)}
    assert set(RunCounts.summary_targets()) <= summary_fields
    assert RunCounts().summary_fields().keys() == RunCounts.summary_targets().keys()


def test_the_counts_fields_are_not_overridden_by_a_caller(tmp_path):
    with pytest.raises(TypeError, match="precision_checks"):
        build_summary(_prep(_config(tmp_path, {"kind": "embed"}, stream=False)), {}, precision_checks={})


def test_the_summary_declares_no_counter_field_itself():
    from pipeline.core.run_summary import _counter_fields

    types = {f.name: f.type for f in dataclasses.fields(RunSummary)}
    assert {name: types[name] for name in RunCounts.summary_types()} == RunCounts.summary_types()

    class Again:
        status: dict[str, int]

    with pytest.raises(TypeError, match="Again.status is filled by the counters"):
        _counter_fields(Again)
