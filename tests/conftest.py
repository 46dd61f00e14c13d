"""Shared fixtures: one local SparkSession (and a Spark Connect one), tiny random models, the writer a test runs on.

The plain helpers these build on (documents, Delta tables, model folders) are in ``tests/support/data.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Every JVM the tests start (the fixtures' sessions, the Connect server, the drivers of the kill drills and
# spark-submit tests) compiles with C1 only and collects with the serial GC: the test jobs are short, and on
# 2 cores C2's compiler threads and G1's workers compete with the job itself. A cold 100-row job took 0.8x
# the time (median of 3, docs/benchmarks_small_jobs.md). C1 alone gets a 48 MB code cache, which a
# session with the connector filled within a minute: the JVM then stops compiling and runs the rest
# interpreted; 256 MB holds a whole run (docs/benchmarks_small_jobs.md, "The suite's JVM code cache and its two runs
# side by side"). Read by spark-submit's launcher (SPARK_SUBMIT_OPTS). The library's small jobs start theirs so too.
from pipeline.spark.class_archive import QUICK_START_JVM_OPTIONS as FAST_START_JVM  # noqa: E402
from tests.support.data import CONNECT_MODE, CONNECTOR_RUN, DELTA_TEST_CONFS, REPO, writer_stack, build_tiny_bert  # noqa: E402

# With the class archive (make jvm-archive, pipeline.spark.class_archive) these JVMs map Spark's classes instead of
# loading them one by one; sessions the library builds map the archive of their own class path themselves. In the
# connector run the Delta jars are on most JVMs' class path, whose archive is another: none is named for all.
if "SPARK_SUBMIT_OPTS" not in os.environ:
    from pipeline.spark.class_archive import mapped_options

    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [FAST_START_JVM,
                                                             "" if CONNECTOR_RUN else mapped_options()]))

# jar-free unless this is the connector run (tests/support/data.py, CONNECTOR_RUN)
if not CONNECTOR_RUN:
    os.environ["SBI_NO_JARS"] = "1"


# tests/wheel is the smoke set of the built wheel: make test-wheel runs it in venvs of its own, outside the checkout
collect_ignore = ["wheel"]


def pytest_sessionstart(session: pytest.Session) -> None:
    """Every JVM of the run (the fixtures' sessions, the Connect server, the drivers the drills kill) keeps its
    scratch folders (``spark-*``: shuffle, broadcast, the jars and files it was given) under this run's pytest
    base folder, not in /tmp: a killed driver never removes its own, and with the S3 jars in each one they
    were 672 MB a driver (a drill-heavy run filled a disk). pytest keeps its three newest base folders and
    removes older ones, these with them; and the run removes its own when it ends (:func:`pytest_sessionfinish`:
    with the connector's jars a drill-heavy run left 6 GB there). Read by Spark's launcher (``SPARK_LOCAL_DIRS``);
    one a caller set wins."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("SPARK_LOCAL_DIRS"):
        return
    local = factory.getbasetemp() / "spark-local"
    local.mkdir(exist_ok=True)
    os.environ["SPARK_LOCAL_DIRS"] = str(local)
    session.config.stash[_SPARK_LOCAL] = local


_SPARK_LOCAL = pytest.StashKey[Path]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The JVMs' scratch folders of this run (:func:`pytest_sessionstart`) go with it: the session fixture's JVM
    removes its own at exit, a killed driver's stay; the next runs' base folders hold none of them."""
    import shutil

    local = session.config.stash.get(_SPARK_LOCAL, None)
    if local is not None:
        shutil.rmtree(local, ignore_errors=True)

# what a `beside` test may not use: in the connector run these carry the connector jars
SESSION_FIXTURES = frozenset({"spark", "connect_server", "spark_connect", "any_spark", "writer"})


@pytest.fixture(autouse=True)
def _beside_is_jar_free(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``beside`` test run in the connector run is still jar-free: its subprocesses get ``SBI_NO_JARS=1``."""
    if CONNECTOR_RUN and request.node.get_closest_marker("beside"):
        monkeypatch.setenv("SBI_NO_JARS", "1")


@pytest.fixture(autouse=True)
def _no_remembered_gate_verdicts(tmp_path_factory: pytest.TempPathFactory):
    """Each test finds the session's tiny models without precision gate verdicts (``pipeline.models.verdicts``):
    a test of the gate measures it, and a test of remembering remembers within itself."""
    yield
    import shutil

    for folder in tmp_path_factory.getbasetemp().glob("models*/*/.sbi-gate"):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["deltalake", pytest.param("delta", marks=pytest.mark.connector)])
def writer(request: pytest.FixtureRequest):
    """The test runs on both Delta writers: ``deltalake`` (jar-free) and ``delta`` (the Delta Spark connector,
    in the connector run). Config helpers (``job_config``, :func:`sink_config`) pick it up."""
    writer_stack.append(request.param)
    yield request.param
    writer_stack.pop()


@pytest.fixture(scope="session")
def tiny_embed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-embed", kind="embed")


@pytest.fixture(scope="session")
def own_process_run(tmp_path_factory: pytest.TempPathFactory, tiny_embed_model: Path) -> tuple[dict, list[str]]:
    """One small embed job in a process of its own, jar-free (tests/support/event_log_job.py): ``spark.task.cpus=2``
    on ``local[2]``, Spark's event log on, its lines as JSON. Its ``RESULT`` and the other lines it printed.

    Shared by the ``beside`` tests of what only a fresh SparkContext sets (tests/run/test_logging.py reads its
    lines and event log, tests/spark/test_threads.py its one task's torch threads): one JVM, one worker and one
    model load for both, where each had a process of its own."""
    from tests.support.drivers import run_job_script

    lines: list[str] = []
    result = run_job_script("event_log_job.py", tmp_path_factory.mktemp("own-process-run"), tiny_embed_model,
                            timeout_s=900, output=lines, env={"SBI_NO_JARS": "1"})
    return result, lines


@pytest.fixture(scope="session")
def tiny_classify_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-classify", kind="classify")


@pytest.fixture
def drill():
    """``drill(settings)`` activates fault injection in this process (as a Spark task does); cleared after."""
    from pipeline.core import faults

    yield faults.activate
    faults.activate(None)


@pytest.fixture(scope="session")
def spark():
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    os.environ.pop(CONNECT_MODE, None)
    if CONNECTOR_RUN:
        from pipeline.spark.jars import jars

        missing = [g for g in ("delta", "s3") if not jars(g)]
        assert not missing, f"the connector run needs the cached jars of {missing}: run `make jars` first"
    session = get_session(SparkConfig(
        # local[N,F]: up to F attempts per task, so retry tests see real retries
        master="local[2,3]", app_name="pipeline-tests", arrow_max_records_per_batch=1000, shuffle_partitions=4,
        conf={"spark.default.parallelism": "2", "spark.task.maxFailures": "2", **DELTA_TEST_CONFS,
              # running tasks' metrics reach the driver's status store every second (10 s by default)
              "spark.executor.heartbeatInterval": "1s",
              # a task killed with its failed job keeps its Python worker 10 s (2 s by default) before Spark
              # kills it, so the late_close drill's task outlives the abort on a slow machine too
              "spark.python.task.killTimeout": "10s"},
    ))
    if CONNECTOR_RUN:
        from pipeline.io.sources import has_delta_connector

        assert has_delta_connector(session), "the connector run's session has no Delta connector"
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory):
    """A Spark Connect server (``local[2,3]``, like the classic fixture) in its own process; yields its URL.

    Not ``SparkSession.builder.remote("local[2]")``: that starts the server inside
    this process through the classic SparkContext (so it cannot sit beside the
    ``spark`` fixture) on the fixed port 15002 (which other test runs on the
    machine would share). Its Python workers import this checkout's ``pipeline``.
    """
    from pipeline.io.local_server import free_port, local_server

    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop(CONNECT_MODE, None)
    env.pop("SPARK_REMOTE", None)
    confs = {
        "spark.connect.grpc.binding.port": str(port), "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.ui.enabled": "false", "spark.log.level": "WARN", "spark.sql.session.timeZone": "UTC",
        "spark.python.worker.reuse": "true", "spark.default.parallelism": "2", "spark.task.maxFailures": "2",
        "spark.python.daemon.module": "pipeline.spark.daemon",
        # progress reports every 100 ms (default 2 s), so short test queries report their stages too
        "spark.connect.progress.reportInterval": "100ms",
        **DELTA_TEST_CONFS,
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
    }
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2,3]", "--driver-memory", "2g",
           "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "pipeline-tests-connect"]
    if CONNECTOR_RUN:
        from pipeline.spark.jars import spark_submit_args

        cmd += spark_submit_args(local=True)  # a local master: the jars on the driver's class path
    for key, value in confs.items():
        cmd += ["--conf", f"{key}={value}"]
    with local_server(cmd, port=port, name="the Spark Connect server", env=env, cwd=REPO, log=log,
                      start_timeout_s=300, poll_s=1, stop_timeout_s=60):
        yield f"sc://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def spark_connect(connect_server: str):
    """A Spark Connect session on :func:`connect_server`, with the classic fixture's runtime settings."""
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    try:
        session = get_session(SparkConfig(remote=connect_server, arrow_max_records_per_batch=1000,
                                          shuffle_partitions=4))
    finally:
        os.environ.pop(CONNECT_MODE, None)  # the classic fixture's tests need classic columns
    yield session
    try:
        session.stop()
    except Exception:  # noqa: BLE001 - the server goes away with the fixture anyway
        pass


@pytest.fixture(params=["classic", "connect"])
def any_spark(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """The test runs twice: on the classic ``spark`` session and on the ``spark_connect`` session.

    pyspark builds Connect or classic columns depending on ``SPARK_CONNECT_MODE_ENABLED``,
    so it is set for exactly the Connect runs.
    """
    if request.param == "classic":
        monkeypatch.delenv(CONNECT_MODE, raising=False)
        return request.getfixturevalue("spark")
    session = request.getfixturevalue("spark_connect")
    monkeypatch.setenv(CONNECT_MODE, "1")
    return session


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests where torch sees no CUDA device (run them on a GPU machine: bench/gpu.sh).

    ``connector``-marked tests run only in the connector run (``SBI_TEST_CONNECTOR=1``, which runs nothing
    else but ``beside`` tests): elsewhere they are skipped with a note saying how to run them. A ``beside`` test
    must not use a session fixture: in the connector run that session has the jars.
    """
    for item in items:
        shared = sorted(SESSION_FIXTURES & set(getattr(item, "fixturenames", ())))
        if "beside" in item.keywords and shared:
            raise pytest.UsageError(f"{item.nodeid} is marked `beside` (it may run in the connector run) but uses "
                                    f"the session fixtures {shared}: give it a Spark of its own or drop the mark")
    if CONNECTOR_RUN:
        kept = [item for item in items if "connector" in item.keywords or "beside" in item.keywords]
        if len(kept) < len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
    else:
        skip_connector = pytest.mark.skip(reason="a connector test: it runs in the connector session "
                                                 "(make test runs it; or SBI_TEST_CONNECTOR=1 pytest -m connector)")
        for item in items:
            if "connector" in item.keywords:
                item.add_marker(skip_connector)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
