"""The built wheel, installed with its extras beside one pyspark, does what a user's first hour asks of it.

Run by ``make test-wheel`` in a fresh venv per Spark line (``.ci/test_wheel.sh``): the CLI, an embed job end to
end on both writers (the Delta connector where a Delta release is built for this Spark line), a Spark Connect
session, an extract job, and a missing extra refused with the line that installs it. Every table is read back
with ``deltalake``, and every input row is accounted for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import pipeline
from pipeline import load_config, run_job
from pipeline.compat import installed_pyspark
from pipeline.config import build_config
from tests.support.data import make_documents
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA

pytestmark = pytest.mark.wheel

SBI = str(Path(sys.executable).parent / "sbi")


def _job(tmp_path: Path, model: Path, *, writer: str, rows: int = 40, **sections) -> dict:
    write_deltalake(str(tmp_path / "docs"), make_documents(rows), mode="overwrite")
    data = {
        "job": "wheel_smoke",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id", "keep_columns": ["source"]},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "batching": {"batch_size": 8, "max_length": 64},
        "sink": {"path": str(tmp_path / "scores"), "mode": "append", "writer": writer},
        "run": {"progress": False, "ds": "2026-12-01"},
        "spark": {"small_job_rows": 0},  # the full path: Spark's write, not the small job's driver commit
    }
    data.update(sections)
    return data


def _read(path: Path) -> pa.Table:
    return DeltaTable(str(path)).to_pyarrow_table()


def _check_embed_rows(tmp_path: Path, summary, rows: int) -> None:
    out = _read(tmp_path / "scores")
    assert out.num_rows == summary.rows_out and summary.rows_in == rows
    assert summary.rows_out + summary.rows_quarantined == rows
    ids = out["doc_id"].to_pylist()
    assert len(ids) == len(set(ids))
    statuses = set(out["status"].to_pylist())
    assert "ok" in statuses and statuses <= {"ok", "truncated", "skipped_null", "skipped_empty", "skipped_no_content"}
    embeddings = [e for e, s in zip(out["embedding"].to_pylist(), out["status"].to_pylist()) if s == "ok"]
    assert embeddings and all(len(e) == 32 for e in embeddings)
    assert summary.versions["spark_batch_inference"] == pipeline.__version__
    assert summary.versions["pyspark"] == installed_pyspark()


def test_the_installed_wheel_runs_beside_the_platforms_pyspark():
    assert "site-packages" in Path(pipeline.__file__).parts, pipeline.__file__
    expected = os.environ.get("SBI_EXPECT_PYSPARK")
    if expected:
        assert installed_pyspark() == expected, "installing the wheel moved the platform's pyspark"
    done = subprocess.run([SBI, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(f"spark-batch-inference {pipeline.__version__} (pyspark {installed_pyspark()}")
    assert pipeline.__version__ not in ("0+unknown", "0.1.0")


def test_sbi_check_validates_the_job_and_this_machine(tmp_path, tiny_embed_model):
    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps(_job(tmp_path, tiny_embed_model, writer="auto")))
    done = subprocess.run([SBI, "check", str(conf)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["task"]["kind"] == "embed"
    assert f"pyspark {installed_pyspark()}: supported" in done.stderr
    assert "libraries for task.kind embed: installed (transformers)" in done.stderr


def test_embed_job_on_the_jar_free_writer(spark, tmp_path, tiny_embed_model):
    summary = run_job(build_config(_job(tmp_path, tiny_embed_model, writer="deltalake")), spark=spark)
    assert summary.writer == "deltalake"
    _check_embed_rows(tmp_path, summary, 40)


def test_embed_job_on_the_delta_connector(spark, tmp_path, tiny_embed_model):
    from pipeline.errors import SinkError
    from pipeline.sessions import delta_package

    config = build_config(_job(tmp_path, tiny_embed_model, writer="delta"))
    if delta_package() is None:  # no Delta release is built for this Spark line: refused before any work
        with pytest.raises(SinkError, match="no Delta connector release is built for Spark"):
            run_job(config, spark=spark)
        assert not (tmp_path / "scores").exists()
        return
    summary = run_job(config, spark=spark)
    assert summary.writer == "delta"
    _check_embed_rows(tmp_path, summary, 40)


def test_extract_job(spark, tmp_path, tiny_llm):
    texts = ["a good film", "awful", "i loved the music", None, "boring plot, great actor"]
    write_deltalake(str(tmp_path / "reviews"), pa.table({"doc_id": [f"r{i}" for i in range(len(texts))],
                                                         "text": pa.array(texts, pa.string())}))
    config = build_config({
        "job": "wheel_extract", "source": {"format": "delta", "path": str(tmp_path / "reviews"), "id_column": "doc_id"},
        "model": {"path": str(tiny_llm), "name": "tiny-llama"},
        "task": {"kind": "extract", "output_schema": EXTRACT_SHORT_SCHEMA, "max_new_tokens": 64, "backend": "transformers"},
        "sink": {"path": str(tmp_path / "fields"), "mode": "overwrite_partition", "writer": "deltalake"},
        # a tiny random model: its rows may well fail the schema; every one must still be accounted for
        "run": {"progress": False, "ds": "2026-12-01", "max_error_fraction": 1.0}, "spark": {"small_job_rows": 0},
    })
    summary = run_job(config, spark=spark)
    out = _read(tmp_path / "fields")
    assert summary.rows_out + summary.rows_quarantined == len(texts) == summary.rows_in
    assert out.num_rows == summary.rows_out
    assert "fields" in out.column_names and set(out["doc_id"].to_pylist()) <= {f"r{i}" for i in range(len(texts))}


def test_a_missing_extra_fails_before_any_work_with_the_line_that_adds_it(tmp_path, tiny_llm):
    """The smoke venv has no int4 extra (llama.cpp): a job that needs it says how to install it, in seconds."""
    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps({
        "job": "wheel_int4", "source": {"format": "delta", "path": str(tmp_path / "nowhere"), "id_column": "doc_id"},
        "model": {"path": str(tiny_llm), "precision": "int4"}, "task": {"kind": "generate", "template": "{text}"},
        "sink": {"path": str(tmp_path / "out")},
    }))
    done = subprocess.run([SBI, "run", str(conf)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "pip install 'spark-batch-inference[transformers,int4]'" in done.stderr
    assert "llama_cpp (int4)" in done.stderr
    assert not (tmp_path / "out").exists()


def test_embed_job_on_a_spark_connect_session(connect_url, tmp_path, tiny_embed_model):
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    try:
        session = get_session(SparkConfig(remote=connect_url, shuffle_partitions=4))
        config = load_config_from(tmp_path, _job(tmp_path, tiny_embed_model, writer="deltalake"))
        summary = run_job(config, spark=session)
        _check_embed_rows(tmp_path, summary, 40)
        session.stop()
    finally:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def load_config_from(tmp_path: Path, data: dict):
    """The job as a user writes it: a YAML file, loaded with ``load_config``."""
    import yaml

    path = tmp_path / "connect_job.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path))
