"""Fail fast: a Spark Connect server, metastore or S3 endpoint nobody answers ends the command in seconds.

Real sockets on the loopback: a port just closed (nothing listens), a port that
accepts connections and never says a word, a server that starts listening a
moment late. The CLI runs in a new process, as a user runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.spark.reach import Unreachable, bounded, job_addresses, probe

REPO = Path(__file__).resolve().parents[2]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never answers (a wrong service, a hung server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


def test_probe_waits_for_a_server_that_starts_late_and_names_the_address_of_one_that_never_does():
    port = _closed_port()
    server = socket.socket()

    def start_late() -> None:
        time.sleep(1.2)
        server.bind(("127.0.0.1", port))
        server.listen(1)

    threading.Thread(target=start_late, daemon=True).start()
    started = time.monotonic()
    probe("127.0.0.1", port, timeout_s=10, what="the test server", check="nothing")
    assert 1.0 < time.monotonic() - started < 8
    server.close()

    closed = _closed_port()
    started = time.monotonic()
    with pytest.raises(Unreachable) as err:
        probe("127.0.0.1", closed, timeout_s=2, what="the Spark Connect server", check="spark.remote")
    assert time.monotonic() - started < 4
    message = str(err.value)
    assert f"127.0.0.1:{closed}" in message and "Connection refused" in message and "spark.remote" in message
    assert isinstance(err.value, PipelineError)  # the CLI prints it as one line


def test_a_call_that_never_answers_is_bounded():
    with pytest.raises(Unreachable, match="the server did not answer within 0.5 s"):
        bounded(lambda: time.sleep(30), timeout_s=0.5, what="the server")
    assert bounded(lambda: 7, timeout_s=5, what="x") == 7
    with pytest.raises(ZeroDivisionError):  # the call's own error reaches the caller
        bounded(lambda: 1 / 0, timeout_s=5, what="x")


def _cli(*sets: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    args = [sys.executable, "-m", "pipeline", "run", str(REPO / "conf" / "score_documents.yaml")]
    for item in sets:
        args += ["--set", item]
    started = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    return proc, time.monotonic() - started


def test_cli_with_a_connect_address_nobody_listens_on_fails_in_seconds(tmp_path):
    """It printed nothing for 14 minutes before."""
    port = _closed_port()
    proc, seconds = _cli(f"spark.remote=sc://127.0.0.1:{port}/", "spark.connect_timeout_s=3",
                         f"sink.path={tmp_path / 'out'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "cannot reach" in line]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert f"the Spark Connect server at 127.0.0.1:{port}" in lines[0] and "spark.remote" in lines[0]
    assert seconds < 30  # the interpreter, the imports and the (cached) model check included
    assert not (tmp_path / "out").exists()


def test_connect_port_that_accepts_and_never_answers_fails_within_the_setting(silent_port):
    code = ("from pipeline.config import SparkConfig\n"
            "from pipeline.spark.session import get_session\n"
            f"get_session(SparkConfig(remote='sc://127.0.0.1:{silent_port}/', connect_timeout_s=3))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SPARK_REMOTE", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    seconds = time.monotonic() - started
    assert proc.returncode != 0
    assert f"Unreachable: the Spark Connect server at 127.0.0.1:{silent_port} did not answer within 3 s" in proc.stderr
    assert seconds < 30


def test_metastore_and_s3_endpoint_of_the_config_are_probed_before_the_session(tmp_path):
    from pipeline.config import load_config
    from pipeline.runner import run_job

    port = _closed_port()
    base = [f"source.path={REPO / 'warehouse' / 'demo' / 'documents'}", "spark.connect_timeout_s=2"]
    config = load_config(REPO / "conf" / "score_documents.yaml", overrides=[
        *base, f"sink.path={tmp_path / 'out'}",
        f"spark.conf.spark.hadoop.hive.metastore.uris=thrift://127.0.0.1:{port}"])
    assert job_addresses(config) == [("the Hive metastore", [("127.0.0.1", port)],
                                      "spark.conf hive.metastore.uris and that the metastore runs")]
    started = time.monotonic()
    with pytest.raises(Unreachable, match=f"cannot reach the Hive metastore at 127.0.0.1:{port}"):
        run_job(config)
    assert time.monotonic() - started < 15

    s3 = load_config(REPO / "conf" / "score_documents.yaml", overrides=[
        *base, "sink.path=s3a://lake/scores", f"spark.conf.spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:{port}"])
    with pytest.raises(Unreachable, match=f"cannot reach the S3 endpoint at 127.0.0.1:{port}"):
        run_job(s3)
    # a local job with an endpoint configured does not need it
    local = load_config(REPO / "conf" / "score_documents.yaml", overrides=[
        *base, f"sink.path={tmp_path / 'out'}", f"spark.conf.spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:{port}"])
    assert job_addresses(local) == []
