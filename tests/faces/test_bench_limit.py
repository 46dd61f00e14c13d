"""bench/bench_limit.py: the model-free run that bounds the pipeline, and the arithmetic of its gap line."""

from __future__ import annotations

import io

import numpy as np
import pytest

from bench.bench_limit import _gap_lines
from bench.null_forward import KIND, register
from pipeline.registry import unregister_task
from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import job_config, read_scores


@pytest.fixture
def null_kind():
    register()
    yield
    unregister_task(KIND)  # a bench kind: never part of the docs' config reference


def test_null_forward_runs_the_real_path_without_the_model(spark, tmp_path, tiny_embed_model, null_kind):
    docs = make_documents(40)  # a null and a blank row among them
    write_delta(tmp_path / "docs", docs)
    labels = {"pos": "good great", "neg": "bad awful"}
    real = run_job(job_config(tmp_path, tiny_embed_model), spark=spark, out=io.StringIO())
    real_rows = {r["doc_id"]: r for r in read_scores(tmp_path).to_pylist()}

    config = job_config(tmp_path, tiny_embed_model, task={"kind": KIND, "labels": labels},
                        sink={"path": str(tmp_path / "null"), "mode": "overwrite"})
    null = run_job(config, spark=spark, out=io.StringIO())
    assert null.complete and null.rows_in == null.rows_out == real.rows_out == 40
    assert null.status == real.status and null.tokens == real.tokens, "same tokenizer, same rows, same flags"
    from deltalake import DeltaTable

    rows = DeltaTable(str(tmp_path / "null")).to_pyarrow_table().to_pylist()
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 38 and all(r["label"] in labels for r in ok)
    for r in ok:
        vec, model_vec = np.array(r["embedding"]), np.array(real_rows[r["doc_id"]]["embedding"])
        assert vec.shape == model_vec.shape, "the model's width, so the bytes moved and written are the same"
        assert abs(np.linalg.norm(vec) - 1) < 1e-5
        assert abs(vec @ model_vec) < 0.9, "random vectors, not the model's"


def _run(seconds, rows=1000, **extra):
    return {"seconds": seconds, "rows": rows, "docs_per_s": rows / seconds, **extra}


def test_gap_line_predicts_the_pipeline_from_its_forward_seconds_and_the_null_run():
    pipe = _run(12.0, infer_seconds=20.0, forward_seconds=18.0, forward_per_worker={"a": 9.5, "b": 8.5})
    runs = {
        "raw 1x2 fp32": [_run(10.0, cpu_seconds={"forward (all processes)": 20.0})] * 3,
        "raw 2x1 fp32": [_run(8.0, cpu_seconds={"forward (all processes)": 15.0})] * 3,
        "pipeline local[2] fp32": [pipe],
        "pipeline local[2] null forward fp32": [_run(2.0), _run(3.0), _run(2.5)],
    }
    text = "\n".join(_gap_lines(runs, "fp32", 2))
    assert "took 2.5 s (median; 2.0-3.0)" in text
    assert "12.0 s predicted, 12.0 s measured" in text  # forward 18/2 + slowest (9.5 - 9.0) + 2.5
    # the limit is the faster raw layout (8.0 s); 8 / (8 + 2.0), 8 / (8 + 3.0), 8 / (8 + 2.5) per repeat
    assert "as fast as the limit's (8.0 s)" in text and "at most 0.76 (0.73-0.80) of the limit" in text
    assert "over the limit's: 0.67" in text  # 1000 / 12 docs/s against 1000 / 8
    del runs["pipeline local[2] null forward fp32"]
    assert "Everything but the model" not in "\n".join(_gap_lines(runs, "fp32", 2))
