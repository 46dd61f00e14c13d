"""The built wheel, installed with its extras beside one pyspark: the CLI and ``run_job`` as a user's first hour asks.

Run by ``make test-wheel`` in a fresh venv per Spark line and Python (``.ci/test_wheel.sh``): ``sbi --version``
and ``sbi check``, an embed job on the jar-free writer (classic session) and on the Delta connector (a Spark
Connect session whose server has it; refused by name where no release is built for the line), a YAML job on
Connect, errors of the public types, and a missing extra refused with the line that installs it. Every table is
read back with ``deltalake`` and every input id accounted for.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline
from pipeline import ConfigError, JobConfig, JobError, JsonFormatter, RunSummary, load_config, read_runs, run_job
from pipeline.core.compat import installed_pyspark
from pipeline.config import build_config
from tests.wheel.jobs import check_embed_rows, embed_job

pytestmark = pytest.mark.wheel

SBI = str(Path(sys.executable).parent / "sbi")


@pytest.mark.entry("sbi")
def test_the_installed_wheel_runs_beside_the_platforms_pyspark():
    assert "site-packages" in Path(pipeline.__file__).parts, pipeline.__file__
    expected = os.environ.get("SBI_EXPECT_PYSPARK")
    if expected:
        assert installed_pyspark() == expected, "installing the wheel moved the platform's pyspark"
    done = subprocess.run([SBI, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(f"spark-batch-inference {pipeline.__version__} (pyspark {installed_pyspark()}")
    assert pipeline.__version__ not in ("0+unknown", "0.1.0")


@pytest.mark.entry("sbi")
def test_sbi_check_validates_the_job_and_this_machine(tmp_path, tiny_embed_model):
    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps(embed_job(tmp_path, tiny_embed_model, writer="auto")))
    done = subprocess.run([SBI, "check", str(conf)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["task"]["kind"] == "embed"
    assert f"pyspark {installed_pyspark()}: supported" in done.stderr
    assert "libraries for task.kind embed: installed (transformers)" in done.stderr


@pytest.mark.entry("run_job", "RunSummary", "JsonFormatter", "read_runs")
def test_embed_job_on_the_jar_free_writer(spark, tmp_path, tiny_embed_model):
    """The job's lines through the exported JSON formatter (docs/logging.md), and its row of the runs table read
    back (docs/operations/quality.md)."""
    lines, logger = io.StringIO(), logging.getLogger("pipeline")
    handler, level = logging.StreamHandler(lines), logger.level
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        summary = run_job(build_config(embed_job(tmp_path, tiny_embed_model, writer="deltalake")), spark=spark)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert isinstance(summary, RunSummary) and summary.writer == "deltalake"
    check_embed_rows(tmp_path, summary)
    events = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert [e["run_id"] for e in events if e["event"] == "summary"] == [summary.run_id], events[-3:]
    (row,) = read_runs(str(tmp_path / "scores_runs"), run_id=summary.run_id)
    assert row["outcome"] == "ok" and row["job"] == "wheel_smoke"


@pytest.mark.entry("run_job", "load_config", "JobConfig")
def test_embed_job_on_the_delta_connector_from_a_yaml_file_on_spark_connect(on_connect, tmp_path, tiny_embed_model):
    """The job as a user writes it (a YAML file, ``load_config``) on a Connect session whose server has the Delta
    connector: its writer where a release is built for this line; elsewhere refused before any work."""
    import yaml

    from pipeline.errors import SinkError
    from pipeline.core.sessions import delta_package

    path = tmp_path / "connect_job.yaml"
    path.write_text(yaml.safe_dump(embed_job(tmp_path, tiny_embed_model, writer="delta")))
    config = load_config(str(path))
    assert isinstance(config, JobConfig) and config.sink.writer == "delta"
    if delta_package() is None:  # no Delta release is built for this Spark line: refused before any work
        with pytest.raises(SinkError, match="no Delta connector release is built for Spark"):
            run_job(config, spark=on_connect)
        assert not (tmp_path / "scores").exists()
        config = load_config(str(path), overrides=["sink.writer=deltalake"])
    summary = run_job(config, spark=on_connect)
    assert summary.writer == ("delta" if delta_package() else "deltalake")
    check_embed_rows(tmp_path, summary)


@pytest.mark.entry("ConfigError", "load_config")
def test_a_config_error_names_the_key_and_the_value(tmp_path, tiny_embed_model):
    path = tmp_path / "bad.yaml"
    job = embed_job(tmp_path, tiny_embed_model, writer="auto")
    job["task"]["pooling"] = "max"
    path.write_text(json.dumps(job))
    with pytest.raises(ConfigError, match=r"task.pooling: Input should be 'mean' or 'cls'"):
        load_config(str(path))


@pytest.mark.entry("JobError", "run_job")
def test_a_stream_on_spark_connect_is_a_job_error_before_any_work(on_connect, tmp_path, tiny_embed_model):
    config = build_config(embed_job(tmp_path, tiny_embed_model, writer="deltalake",
                                    source={"stream": {"checkpoint_path": str(tmp_path / "chk")}}))
    with pytest.raises(JobError, match="this job cannot run as a stream: its micro-batches commit through "
                                       "foreachBatch, which a Spark Connect session runs on the server"):
        run_job(config, spark=on_connect)
    assert not (tmp_path / "scores").exists() and not (tmp_path / "chk").exists()


@pytest.mark.entry("sbi")
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
