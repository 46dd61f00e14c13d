"""A minimal job config and a filled-in ``RunSummary`` for the runs table, its report and tracking tests (no Spark)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.config import build_config
from pipeline.core.drift import Verdict, compare
from pipeline.core.metrics import WorkerCounts, batch_metrics
from pipeline.core.sketches import Profile
from pipeline.core.run_summary import RunSummary

__all__ = ["job_config", "quality_record", "summary"]


def job_config(tmp_path: Path, **run: object):
    return build_config({
        "job": "score_documents",
        "source": {"path": str(tmp_path / "docs")},
        "model": {"path": str(tmp_path / "model")},
        "task": {"kind": "embed"},
        "sink": {"path": str(tmp_path / "scores")},
        "run": dict(run),
    })


def summary(run_id: str, *, rows: int = 100, seconds: float = 10.0) -> RunSummary:
    counts = WorkerCounts(worker="host:1", task=0, clock=lambda: 1_700_000_000.0)
    for _ in range(3):
        counts.add_batch(rows=rows // 4, tokens=rows * 2, padded_tokens=rows * 3, padded_length=24, seconds=0.25)
    return RunSummary(
        job="score_documents", run_id=run_id, ds="2026-11-30", rows_in=rows, rows_out=rows - 1,
        status={"ok": rows - 2, "truncated": 1, "error": 1}, seconds=seconds, tokens=rows * 6,
        padded_tokens=rows * 9, batches=3, model_loads={"host:1": 1, "host:2": 1}, model_name="tiny",
        model_revision="abc123", output="/out", delta_version=4, writer="deltalake", rows_quarantined=1,
        precision_used={"fp32": 2}, batch_metrics=batch_metrics(counts.counts),
    )


def quality_record(action: str = "warned") -> dict:
    """A run's quality record as the drift gate makes it: a profile, and a verdict with one measure moved."""
    def night(empty: float) -> dict:
        p = Profile()
        p.tally("status", {"ok": int(400 * (1 - empty)), "skipped_empty": int(400 * empty)})
        p.histogram("input_chars", np.random.default_rng(int(empty * 10)).lognormal(4, 1, 400), bins="log")
        return p.data

    history = night(0.0)
    findings = compare(night(1 / 3), [history])
    return {"profile": night(1 / 3), "drift": Verdict(tuple(findings), ("n1",), None, history, action).to_dict()}
