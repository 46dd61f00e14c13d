"""Task retries on the default master, worker errors as one line, and config values that must not get through."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipeline.config import ConfigError, SparkConfig, build_config

from tests.support.data import make_documents, write_delta

REPO = Path(__file__).resolve().parents[2]
# one block of Java frames ("\tat org.apache..." lines in a row) is one printed stack trace
JAVA_TRACE = re.compile(r"(?:^\s+at [\w$.]+\(.*\)\n)+", re.MULTILINE)


def _cli(*args: str, env: dict[str, str] | None = None, timeout: int = 420) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": str(REPO), **(env or {})}
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT", "SBI_FAULTS"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _job_yaml(tmp_path: Path, model: Path, *, faults: dict) -> Path:
    """A job with no ``spark`` section at all: the default master (``local[*]``), no maxFailures anywhere."""
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({
        "job": "retries",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id", "repartition": 3},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed"},
        "batching": {"batch_size": 16, "max_length": 64},
        "sink": {"path": str(tmp_path / "scores"), "mode": "overwrite_partition", "partition_by": ["ds"]},
        "run": {"progress": False, "ds": "2026-11-29", "summary_path": None, "faults": faults},
    }))
    return path


# ------------------------------------------------------------------ retries


def test_local_masters_get_a_retry_budget():
    from pipeline.spark.session import with_local_task_attempts

    assert SparkConfig().master == "local[*]" and SparkConfig().local_task_attempts == 4
    assert with_local_task_attempts("local[*]", 4) == "local[*,4]"
    assert with_local_task_attempts("local[16]", 4) == "local[16,4]"
    assert with_local_task_attempts("local", 3) == "local[1,3]"
    # what the user wrote wins: a failure count of their own, a cluster, or no retries asked for
    assert with_local_task_attempts("local[2,1]", 4) == "local[2,1]"
    assert with_local_task_attempts("local-cluster[2,1,1024]", 4) == "local-cluster[2,1,1024]"
    assert with_local_task_attempts("yarn", 4) == "yarn"
    assert with_local_task_attempts("local[*]", 1) == "local[*]"
    with pytest.raises(ConfigError, match="spark.local_task_attempts"):
        build_config({"job": "j", "source": {"path": "x"}, "model": {"path": "m"}, "task": {"kind": "embed"},
                      "sink": {"path": "y"}, "spark": {"local_task_attempts": 0}})


@pytest.mark.drills  # a Python worker killed
@pytest.mark.slow  # a Spark of its own in a subprocess
def test_a_killed_worker_is_retried_on_the_default_master(tmp_path, tiny_embed_model):
    """The CLI as shipped: ``local[*]`` from the default config, nothing hand-set; a Python worker dies mid-task."""
    write_delta(tmp_path / "docs", make_documents(120))
    job = _job_yaml(tmp_path, tiny_embed_model, faults={"kill_worker_partitions": [1]})
    done = _cli("run", str(job))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "single attempt" not in done.stderr
    assert re.search(r"task_retries\D+1\b", done.stdout), done.stdout  # the killed task ran again, once
    table = DeltaTable(str(tmp_path / "scores")).to_pyarrow_table()
    ids = table["doc_id"].to_pylist()
    assert len(ids) == 120 and set(ids) == {f"d{i:05d}" for i in range(120)}


# ------------------------------------------------------------------ worker errors as one line


@pytest.mark.drills  # a worker failing every attempt, in a Spark of its own
@pytest.mark.slow  # a Spark of its own in a subprocess
@pytest.mark.beside
def test_a_worker_exception_reaches_the_cli_as_one_line(tmp_path, tiny_embed_model):
    """A Python exception raised on a worker (here: every attempt allowed fails) ends the CLI with one clear line."""
    write_delta(tmp_path / "docs", make_documents(60))
    job = _job_yaml(tmp_path, tiny_embed_model, faults={"fail_write_partitions": [1]})
    done = _cli("run", str(job), "--set", "spark.local_task_attempts=1")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: writing Delta table {tmp_path / 'scores'} failed: "
                           "InjectedFaultError: injected write failure in partition 1, attempt 0"), last
    assert "--verbose" in last
    traces = JAVA_TRACE.findall(done.stderr)
    assert len(traces) <= 1, f"{len(traces)} Java stack traces printed:\n{done.stderr[-4000:]}"
    assert "An exception was thrown from the Python worker" not in done.stderr


def test_spark_errors_become_one_line_on_either_session(any_spark, capsys):
    from pyspark.sql import functions as F
    from pyspark.sql.functions import udf

    from pipeline.cli import _print_error
    from pipeline.core.error_text import error_line, is_spark_error

    @udf("long")
    def explode_on_13(i):
        if i == 13:
            raise ValueError("poison row 13\nsecond line of the message")
        return i

    with pytest.raises(Exception) as err:
        any_spark.range(20).repartition(2).select(explode_on_13(F.col("id"))).collect()
    assert is_spark_error(err.value)
    assert error_line(err.value) == "ValueError: poison row 13"
    _print_error(err.value, verbose=False)
    assert capsys.readouterr().err == "error: ValueError: poison row 13 (--verbose prints Spark's full error)\n"
    _print_error(err.value, verbose=True)  # the whole text is still there when asked for
    text = capsys.readouterr().err
    assert "Traceback (most recent call last)" in text and "second line of the message" in text
    assert text.rstrip().endswith("error: ValueError: poison row 13")


def test_error_line_reads_the_last_python_exception():
    from pipeline.core.error_text import error_line, python_error_line

    chained = (
        "An error occurred while calling o164.save.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed 4 times, most recent "
        "failure: org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was thrown from "
        "the Python worker: Traceback (most recent call last):\n"
        '  File "/w/x.py", line 3, in f\n    raise KeyError(1)\n'
        "KeyError: 1\n\nThe above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        '  File "/w/x.py", line 5, in g\n    raise ModelError("config.json names ViTModel")\n'
        "    ^^^^^^^^^^^^^^^^^\n"
        "pipeline.errors.ModelError: config.json names ViTModel, not a text model\n"
        "  set model.path to a text model\n"
        " SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:1)\n"
    )
    assert python_error_line(chained) == "ModelError: config.json names ViTModel, not a text model"
    assert error_line("An error occurred while calling o164.save.\n: java.io.IOException: disk full") == (
        "java.io.IOException: disk full")
    assert python_error_line("no traceback here") is None


# ------------------------------------------------------------------ values that must not get through


BASE = {"job": "j", "source": {"format": "delta", "path": "x"}, "model": {"path": "m"},
        "task": {"kind": "embed"}, "sink": {"path": "y"}}


@pytest.mark.parametrize("run_id", ["x' OR '1'='1", "a b", "../../etc", "", "r" * 129])
def test_unsafe_run_ids_are_refused(run_id):
    with pytest.raises(ConfigError, match=r"run.run_id: .* is not a valid run id: use 1 to 128 letters"):
        build_config({**BASE, "run": {"run_id": run_id}})


def test_safe_run_ids_pass():
    for run_id in ("nightly-2026-11-29", "a1b2c3", "job.v2:retry_3", "r" * 128):
        assert build_config({**BASE, "run": {"run_id": run_id}}).run.run_id == run_id


def test_a_quote_in_run_id_is_refused_by_the_cli(tmp_path):
    done = _cli("check", "conf/score_documents.yaml", "--run-id", "it's")
    assert done.returncode == 2 and done.stdout == ""
    assert "run.run_id: \"it's\" is not a valid run id" in done.stderr


def test_check_never_prints_values_from_the_environment(tmp_path):
    secret = "hunter2-s3cr3t-value"
    conf = tmp_path / "job.yaml"
    conf.write_text(
        "job: sec\n"
        "source: {format: delta, path: '${SBI_TEST_LAKE}/docs', id_column: doc_id}\n"
        "model: {path: /models/m}\n"
        "task: {kind: embed}\n"
        "sink: {path: '${SBI_TEST_LAKE}/scores'}\n"
        "spark: {conf: {spark.hadoop.fs.s3a.session.token: '${SBI_TEST_SECRET}', spark.app.tag: '${SBI_TEST_SECRET}'}}\n"
    )
    env = {"SBI_TEST_SECRET": secret, "SBI_TEST_LAKE": f"s3://lake-{secret}"}
    done = _cli("check", str(conf), env=env)
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout + done.stderr
    shown = json.loads(done.stdout)
    assert shown["sink"]["path"] == "${SBI_TEST_LAKE}/scores"
    assert shown["spark"]["conf"] == {"spark.hadoop.fs.s3a.session.token": "***", "spark.app.tag": "${SBI_TEST_SECRET}"}
    # a bad value from the environment is named by its ${VAR}, not printed
    bad = _cli("check", str(conf), "--set", "source.limit=${SBI_TEST_SECRET}", env=env)
    assert bad.returncode == 2 and "source.limit" in bad.stderr and "${SBI_TEST_SECRET}" in bad.stderr
    assert secret not in bad.stdout + bad.stderr


@pytest.mark.parametrize("key", ["trust_remote_code", "worker_extension_cls", "load_format", "hf_overrides",
                                 "download_dir"])
def test_engine_args_cannot_change_what_vllm_loads(key):
    data = {**BASE, "task": {"kind": "generate", "backend": "vllm",
                             "vllm": {"engine_args": {key: True, "enable_prefix_caching": True}}}}
    with pytest.raises(ConfigError, match=rf"task.vllm: engine_args \['{key}'\] would change what code and weights"):
        build_config(data)
    # speed knobs still pass through
    ok = {**BASE, "task": {"kind": "generate", "backend": "vllm", "vllm": {"engine_args": {"swap_space": 0}}}}
    assert build_config(ok).task.vllm.engine_args == {"swap_space": 0}
