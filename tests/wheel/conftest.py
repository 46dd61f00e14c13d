"""The smoke set's fixtures: a classic session on the installed pyspark, tiny models, a Connect server.

``make test-wheel`` (``.ci/test_wheel.sh``) copies ``tests/wheel`` and ``tests/support`` into a folder outside
the checkout and runs them with the Python of a fresh venv holding the built wheel, its extras and one pyspark
version: what is imported here is the installed package, never this repository's ``pipeline/``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m")


def pytest_configure(config: pytest.Config) -> None:
    # run from a folder outside the checkout: pyproject.toml's markers are not there
    config.addinivalue_line("markers", "wheel: the smoke set make test-wheel runs against the installed wheel")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The smoke set runs only against an installed wheel: never from a checkout's ``pipeline/``."""
    import pipeline

    if "site-packages" not in Path(pipeline.__file__).parts:
        skip = pytest.mark.skip(reason=f"the wheel smoke set runs against the installed wheel (make test-wheel), "
                                       f"not {Path(pipeline.__file__).parent}")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def spark():
    """A classic local session built by the library (the Delta connector's jars when ``make test-wheel`` cached
    them for this Spark line)."""
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    session = get_session(SparkConfig(master="local[2]", app_name="wheel-smoke", shuffle_partitions=4,
                                      arrow_max_records_per_batch=1000,
                                      conf={"spark.databricks.delta.snapshotPartitions": "2"}))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tiny_embed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.data import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-embed", kind="embed")


@pytest.fixture(scope="session")
def tiny_llm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.generation_models import save_model_folder

    return save_model_folder(tmp_path_factory.mktemp("models") / "tiny-llama")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory):
    """A Spark Connect server of the installed pyspark in its own process (jar-free); yields ``sc://...``."""
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", "--driver-memory", "1g",
           "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for key, value in {"spark.connect.grpc.binding.port": str(port), "spark.connect.grpc.binding.address": "127.0.0.1",
                       "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
                       "spark.python.daemon.module": "pipeline.spark.daemon"}.items():
        cmd += ["--conf", f"{key}={value}"]
    with open(log, "wb") as sink:
        server = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            with socket.socket() as sock:
                sock.settimeout(1)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start (exit {server.poll()}):\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(1)
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
