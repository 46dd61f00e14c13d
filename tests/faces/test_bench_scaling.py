"""bench/bench_scaling.py: its model-free task kind runs the real path into Delta, and what it measures is the commit."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from bench.bench_scaling import (
    add_template, build_source, commit_facts, commit_scale_once, expected_score, fit_costs, job_config, register,
)
from pipeline import run_job
from pipeline.io.delta.writer import DeltaWriteMessage
from pipeline.registry import unregister_task
from tests.support.data import make_documents


@pytest.fixture
def hash_kind():
    register()
    yield
    unregister_task("bench_hash_score")  # a bench kind: never part of the docs' config reference


def test_hash_kind_runs_the_real_path_and_the_commit_facts_match_the_table(spark, tmp_path, hash_kind):
    texts = make_documents(60)["text"]  # a null and a blank row among them
    built = build_source(tmp_path / "src", 300, files=3, corpus=texts)
    assert built["rows"] == 300 and len(DeltaTable(str(tmp_path / "src")).file_uris()) == 3
    out = tmp_path / "out"
    summary = run_job(job_config(tmp_path / "src", out, rows_per_task=100), spark=spark, out=open("/dev/null", "w"))
    assert summary.complete and summary.rows_in == summary.rows_out == 300 and summary.tasks == 4

    table = DeltaTable(str(out))
    rows = pa.table(table.to_pyarrow_table()).to_pylist()
    by_text = {t: i for i, t in enumerate(texts.to_pylist())}
    for row in rows:
        text = texts[int(row["doc_id"][1:]) % len(texts)].as_py()
        if text is None:
            assert row["status"] == "skipped_null" and row["score"] is None
        elif not text.strip():
            assert row["status"] == "skipped_empty"
        else:
            assert row["status"] == "ok" and row["score"] == expected_score(text) and text in by_text
    assert summary.status == {"ok": 290, "skipped_null": 5, "skipped_empty": 5}

    facts = commit_facts(str(out), table.version())
    adds = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert facts["files"] == len(adds) == facts["write_tasks"] == 4  # one file per write task here
    assert facts["data_bytes"] == sum(a["size_bytes"] for a in adds)
    assert facts["rows"] == 300 and facts["removes"] == 0
    log = out / "_delta_log" / f"{table.version():020d}.json"
    assert facts["log_json_bytes"] == log.stat().st_size
    # the messages the driver got: one DeltaWriteMessage per task, as pickled (rebuilt from the add actions)
    assert facts["messages_pickled_bytes"] > 4 * len(pickle.dumps(DeltaWriteMessage()))
    assert facts["last_file_to_commit_s"] is not None and facts["last_file_to_commit_s"] >= 0

    # the synthetic commits behind the 1-billion-row estimate start from one of these real add actions
    template = add_template(out)
    assert template["size"] in {a["size_bytes"] for a in adds} and json.loads(template["stats"])["numRecords"] > 0
    result = commit_scale_once(50, dict(template), str(tmp_path))
    assert result["adds"] == result["files_listed"] == 50
    assert result["log_json_bytes"] > 50 * len(template["stats"])
    # the nightly rerun's overwrite_partition: 50 removes and 50 adds in one JSON, larger than the first
    assert result["replace_log_json_bytes"] > result["log_json_bytes"]
    assert not Path(tmp_path, "commit-50").exists()


def test_fit_recovers_fixed_per_row_and_per_task_costs():
    runs = [{"rows": r, "tasks": t, "wall_s": 12 + 3e-6 * r + 0.05 * t}
            for r, t in ((100_000, 10), (100_000, 100), (1_000_000, 100), (10_000_000, 1000))]
    fit = fit_costs(runs)
    assert fit == {"fixed_s": 12.0, "per_row_us": 3.0, "per_task_ms": 50.0}
    assert fit_costs(runs[:2]) is None  # two points cannot separate three costs
    assert np.isclose(fit_costs(runs[1:] + runs[:1])["per_task_ms"], 50.0)
