"""The smoke set's fixtures: a jar-free classic session, a Spark Connect server with the Delta connector, tiny
models shared by the Spark lines of one run, and the results file the docs' matrix is rendered from.

``make test-wheel`` (``.ci/test_wheel.sh``) copies ``tests/wheel``, ``tests/support`` and ``notebooks`` into a
folder outside the checkout and runs them with the Python of a fresh venv holding the built wheel, its extras and
one pyspark version: what is imported here is the installed package, never this repository's ``pipeline/``.
Under ``$SBI_EXPECT_PYSPARK`` (the script sets it) a ``pipeline`` imported from anywhere else is an error, not
a skipped set.

Each test names the public entry points it runs (``@pytest.mark.entry("score", ...)``: the names of
``pipeline.__all__`` and the ``sbi`` command) and the shipped notebook it runs (``@pytest.mark.notebook(name)``);
``tests/faces/test_wheel_smoke_set.py`` fails when one is left out. At the end the outcome of each, with the
pyspark and Python versions, is written to ``$SBI_WHEEL_RESULTS/<pyspark>-py<X.Y>.json``; the script merges those
into ``docs/wheel_matrix.json``, from which ``.ci/wheel_matrix.py`` renders the docs' matrix.

Two JVMs per venv: the classic session is jar-free (the deltalake writer, the jar-free Delta stream reader), and
the Connect server carries the Delta connector where a release is built for this Spark line (the connector
writer, on a Connect session as on Databricks' serverless and shared clusters).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m")

EXPECT_ENV = "SBI_EXPECT_PYSPARK"
RESULTS_ENV = "SBI_WHEEL_RESULTS"
# a folder the Spark lines of one make test-wheel share: the tiny models (built once, so every line scores the
# same weights) and each line's score(df) embeddings, compared across the lines
SHARED_ENV = "SBI_WHEEL_SHARED"
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"

_outcomes: dict[str, str] = {}
_marks: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def pytest_configure(config: pytest.Config) -> None:
    # run from a folder outside the checkout: pyproject.toml's markers are not there
    config.addinivalue_line("markers", "wheel: the smoke set make test-wheel runs against the installed wheel")
    config.addinivalue_line("markers", "entry(*names): the public entry points (pipeline.__all__, sbi) a test runs")
    config.addinivalue_line("markers", "notebook(name): the shipped notebook whose code path a test runs")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The smoke set runs only against an installed wheel: never from a checkout's ``pipeline/`` (an error where
    the script expects the wheel, a skip elsewhere)."""
    import pipeline

    where = Path(pipeline.__file__).parent
    if "site-packages" not in where.parts:
        if os.environ.get(EXPECT_ENV):
            raise pytest.UsageError(f"the wheel smoke set imported pipeline from {where}, not from the venv's "
                                    f"site-packages: it would test the checkout, not the built wheel")
        skip = pytest.mark.skip(reason=f"the wheel smoke set runs against the installed wheel (make test-wheel), "
                                       f"not {where}")
        for item in items:
            item.add_marker(skip)
    for item in items:
        entries = tuple(name for mark in item.iter_markers("entry") for name in mark.args)
        notebooks = tuple(name for mark in item.iter_markers("notebook") for name in mark.args)
        _marks[item.nodeid] = (entries, notebooks)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" or report.outcome != "passed":  # a setup that failed or skipped decides it too
        if _outcomes.get(report.nodeid) in (None, "passed"):
            _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Write what ran and how, per entry point and notebook, to ``$SBI_WHEEL_RESULTS`` (when set)."""
    folder = os.environ.get(RESULTS_ENV)
    if not folder or not _marks:
        return
    from pipeline.core.compat import installed_pyspark, spark_line

    pyspark = installed_pyspark() or "?"
    python = platform.python_version()
    entries: dict[str, list[str]] = {}
    notebooks: dict[str, list[str]] = {}
    for nodeid, (names, books) in _marks.items():
        outcome = _outcomes.get(nodeid, "not run")
        for name in names:
            entries.setdefault(name, []).append(outcome)
        for name in books:
            notebooks.setdefault(name, []).append(outcome)

    def verdict(outcomes: list[str]) -> str:
        return "passed" if all(o == "passed" for o in outcomes) else "failed"

    counts = {k: sum(1 for o in _outcomes.values() if o == k) for k in ("passed", "failed", "skipped")}
    counts["not run"] = len(_marks) - len(_outcomes)
    result = {
        "pyspark": pyspark, "spark_line": "{}.{}".format(*spark_line(pyspark)) if pyspark != "?" else "?",
        "python": python, "python_line": ".".join(python.split(".")[:2]),
        "delta_connector": _connector_line(pyspark),
        "tests": counts, "complete": counts["passed"] == len(_marks) and exitstatus == 0,
        "entry_points": {k: verdict(v) for k, v in sorted(entries.items())},
        "notebooks": {k: verdict(v) for k, v in sorted(notebooks.items())},
    }
    path = Path(folder) / f"{pyspark}-py{result['python_line']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def _connector_line(pyspark: str) -> bool:
    from pipeline.core.sessions import delta_package

    try:
        return delta_package() is not None
    except Exception:  # noqa: BLE001 - an unreadable version: no connector claimed
        return False


@pytest.fixture(scope="session")
def shared() -> Path:
    """The folder shared by the lines of one run (``$SBI_WHEEL_SHARED``); a temporary one otherwise."""
    import tempfile

    folder = Path(os.environ.get(SHARED_ENV) or tempfile.mkdtemp(prefix="sbi-wheel-shared-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def spark():
    """The classic local session, jar-free (``$SBI_NO_JARS``): ``sink.writer auto`` is the deltalake writer and a
    Delta stream reads through the jar-free reader, as on a Spark without the connector (4.3 has no release)."""
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    os.environ["SBI_NO_JARS"] = "1"
    try:
        session = get_session(SparkConfig(master="local[2]", app_name="wheel-smoke", shuffle_partitions=4,
                                          arrow_max_records_per_batch=1000))
    finally:
        os.environ.pop("SBI_NO_JARS", None)
    yield session
    session.stop()


def _built(folder: Path, build) -> Path:
    """``folder`` when a line before this one built it (same weights on every line), else built now; under a
    lock, since lines may run side by side (``SBI_WHEEL_JOBS``): the second waits for the first's build."""
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / ".complete"
        if not done.exists():
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def tiny_embed_model(shared: Path) -> Path:
    from tests.support.data import build_tiny_bert

    return _built(shared / "models" / "tiny-embed", lambda f: build_tiny_bert(f, kind="embed"))


@pytest.fixture(scope="session")
def tiny_llm(shared: Path) -> Path:
    from tests.support.generation_models import save_model_folder

    return _built(shared / "models" / "tiny-llama", save_model_folder)


@pytest.fixture(scope="session")
def tiny_image_model(shared: Path) -> Path:
    from tests.support.image_samples import build_tiny_classifier

    return _built(shared / "models" / "tiny-lite", build_tiny_classifier)


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory):
    """A Spark Connect server of the installed pyspark in its own process, with the Delta connector's jars where
    ``make test-wheel`` cached them for this line; yields ``sc://...``."""
    from pipeline.io.local_server import free_port, local_server
    from pipeline.spark.jars import spark_submit_args

    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", CONNECT_MODE, "SBI_NO_JARS")}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]", "--driver-memory", "1g",
           "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", *spark_submit_args(["delta"])]
    for key, value in {"spark.connect.grpc.binding.port": str(port), "spark.connect.grpc.binding.address": "127.0.0.1",
                       "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
                       "spark.databricks.delta.snapshotPartitions": "2",
                       "spark.python.daemon.module": "pipeline.spark.daemon"}.items():
        cmd += ["--conf", f"{key}={value}"]
    with local_server(cmd, port=port, name="the Spark Connect server", env=env, log=log, start_timeout_s=300,
                      poll_s=1, stop_timeout_s=60):
        yield f"sc://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def connect_session(connect_url: str):
    """A Spark Connect session on :func:`connect_url` (the library's ``get_session``, as a user's job builds it)."""
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    try:
        session = get_session(SparkConfig(remote=connect_url, shuffle_partitions=4, arrow_max_records_per_batch=1000))
    finally:
        os.environ.pop(CONNECT_MODE, None)  # the classic session's tests build classic columns
    yield session
    session.stop()


@pytest.fixture
def on_connect(connect_session, monkeypatch: pytest.MonkeyPatch):
    """The Connect session, with pyspark building Connect columns for the test's duration."""
    monkeypatch.setenv(CONNECT_MODE, "1")
    return connect_session
