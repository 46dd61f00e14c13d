"""Typed run counts (pipeline.core.run_counts): merged worker counts read once, unknown counters refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from pipeline.core.metrics import WorkerCounts, merge_counts, reused_counts
from pipeline.core.run_counts import RunCounts, TaskCounts
from pipeline.tasks._ocr_job import STAGES, OcrCounts
from pipeline.tasks.classify_image import ImageClassifyCounts, ImageClassifyJob
from pipeline.tasks.recommend import RecommendCounts, RecommendJob


def _worker_counts() -> dict:
    counts = WorkerCounts(worker="h:1", task=0, clock=lambda: 100.0)
    counts.add("rows", 4)
    counts.add("chunks")
    counts.add_status({"ok": 3, "error": 1})
    counts.add_batch(rows=4, tokens=30, padded_tokens=40, padded_length=10, seconds=0.25)
    counts.merge({"tasks_per_worker": {"h:1": 1}, "model_loads": {"h:1": 1}, "load_seconds": 1.5,
                  "precision_used": {"fp32": 1}, "torch_threads": {"2": 1}, "rows_per_worker": {"h:1": 4}})
    counts.add("infer_seconds", 0.5)
    return counts.counts


def test_round_trip_from_merged_worker_counts():
    merged = merge_counts(merge_counts({}, json.loads(json.dumps(_worker_counts()))), _worker_counts())
    counts = RunCounts.from_merged(merged)
    assert counts.rows == 8 and counts.chunks == 2
    assert counts.status == {"ok": 6, "error": 2}
    assert (counts.batches, counts.tokens, counts.padded_tokens, counts.batch_rows) == (2, 60, 80, 8)
    assert counts.batch_sizes == {"4": 2}
    assert counts.model_loads == {"h:1": 2} and counts.tasks_per_worker == {"h:1": 2}
    assert counts.load_seconds == 3.0 and counts.infer_seconds == 1.0
    assert counts.precision_used == {"fp32": 2} and counts.torch_threads == {"2": 2}
    assert counts.by_length["10"]["rows"] == 8
    # what nobody counted reads zero, and the kind's own counters are the empty base
    assert counts.oom_splits == 0 and counts.endpoint == {} and counts.task == TaskCounts()


def test_reused_task_counts_are_known():
    counts = RunCounts.from_merged(reused_counts({"status": {"ok": 3}, "rows": 3, "tokens": 9}, rows=3))
    assert (counts.resumed_tasks, counts.rows_reused, counts.rows, counts.tokens) == (1, 3, 3, 0)


def test_an_unknown_counter_is_refused_by_name():
    with pytest.raises(ValueError) as info:
        RunCounts.from_merged({"rows": 2, "tokns": 40})
    message = str(info.value)
    assert "'tokns'" in message
    assert "tokens" in message and "padded_tokens" in message  # the known names are listed
    # a kind's counter is unknown to a run of another kind
    with pytest.raises(ValueError, match="'ocr_lines'"):
        RunCounts.from_merged({"ocr_lines": 3}, task=RecommendCounts)


def test_a_counter_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="'status'"):
        RunCounts.from_merged({"status": 3})
    with pytest.raises(ValueError, match="'tokens'"):
        RunCounts.from_merged({"tokens": {"a": 1}})


def test_a_kinds_declared_counters_are_accepted_and_read_as_attributes():
    merged = {"rows": 2, "status": {"ok": 2}, "images_inferred": 3, "ocr_lines": 40, "ocr_lines_turned": 1,
              "ocr_detect_seconds": 1.25, "cer_errors": 2.5, "cer_reference_chars": 50, "ocr_provider": {"cpu": 1}}
    counts = RunCounts.from_merged(merged, task=OcrCounts)
    ocr = counts.task
    assert isinstance(ocr, OcrCounts)
    assert (ocr.images_inferred, ocr.ocr_lines, ocr.ocr_lines_turned) == (3, 40, 1)
    assert ocr.cer_errors == 2.5 and ocr.cer_reference_chars == 50 and ocr.ocr_provider == {"cpu": 1}
    assert list(ocr.stage_seconds) == list(STAGES) and ocr.stage_seconds["detect"] == 1.25
    # every stage the workers time is a declared counter
    RunCounts.from_merged({f"ocr_{stage}_seconds": 1.0 for stage in STAGES}, task=OcrCounts)

    recs = RunCounts.from_merged({"recommendations": 30, "unknown_users": 2, "items_scored": 900},
                                 task=RecommendJob.counters).task
    assert (recs.recommendations, recs.unknown_users, recs.items_scored) == (30, 2, 900)
    assert ImageClassifyJob.counters is ImageClassifyCounts
    assert RunCounts.from_merged({"images_inferred": 5}, task=ImageClassifyCounts).task.images_inferred == 5


def test_a_kind_may_not_redeclare_a_counter_every_run_has():
    @dataclass(frozen=True)
    class Clashing(TaskCounts):
        tokens: int = 0

    with pytest.raises(ValueError, match="tokens"):
        RunCounts.from_merged({}, task=Clashing)


def test_recommend_completeness_reads_the_typed_counts():
    counts = RunCounts.from_merged({"status": {"ok": 2}, "recommendations": 6}, task=RecommendCounts)
    job = RecommendJob()
    assert job.check_complete(rows_in=2, rows_out=6, rows_quarantined=0, counts=counts) is None
    assert "produced 6" in job.check_complete(rows_in=2, rows_out=5, rows_quarantined=0, counts=counts)
