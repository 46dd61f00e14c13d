"""The driver JVM's class archive (pipeline.spark.class_archive): one process claims and writes it, later sessions
map it, a torn or foreign one costs nothing but the speed-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.spark import class_archive
from pipeline.spark.class_archive import _DYNAMIC_MAGIC, archive_key, archive_options, mapped_options

REPO = Path(__file__).resolve().parents[2]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _aged(path: Path, seconds: float) -> Path:
    then = time.time() - seconds
    os.utime(path, (then, then))
    return path


def test_one_claim_a_finished_dump_adopted_a_torn_one_removed(tmp_path: Path) -> None:
    """A finished dump (its writer gone, untouched for a minute, Java's magic at its start) is renamed into place and
    mapped; a torn one is removed and claimed again; a claim of a live process or a dump touched within the minute
    means no archive and no second dump."""
    key = archive_key()
    final = tmp_path / f"{key}.jsa"
    assert mapped_options(folder=tmp_path) == ""

    live = tmp_path / f"{key}.{os.getppid()}.part"  # a live claimant (this test's parent), nothing written yet
    live.touch()
    assert archive_options(folder=tmp_path) == "" and live.exists()
    live.unlink()

    writing = tmp_path / f"{key}.{_dead_pid()}.part"  # its claimant gone, but the JVM still writing it
    writing.write_bytes(_DYNAMIC_MAGIC + b"half")
    assert archive_options(folder=tmp_path) == ""

    _aged(writing, 120)  # settled: whole, adopted
    options = archive_options(folder=tmp_path)
    assert options.startswith(f"-XX:SharedArchiveFile={final} ") and "-Xshare:auto" in options, options
    assert not writing.exists() and final.read_bytes().startswith(_DYNAMIC_MAGIC)
    assert mapped_options(folder=tmp_path) == options

    final.unlink()
    torn = tmp_path / f"{key}.{_dead_pid()}.part"
    torn.write_bytes(b"\0\0")  # a JVM killed while it wrote
    _aged(torn, 120)
    options = archive_options(folder=tmp_path)
    claim = tmp_path / f"{key}.{os.getpid()}.part"
    assert not torn.exists() and not final.exists()
    assert options.startswith(f"-XX:ArchiveClassesAtExit={claim} ") and claim.exists(), options
    assert mapped_options(folder=tmp_path) == ""  # JVMs outside get_session never claim or dump


def test_the_key_follows_the_jars_the_jvm_checks_their_path_size_and_time(tmp_path: Path, monkeypatch) -> None:
    """The JVM refuses an archive whose class path moved or changed (a venv at another path, installed again: CI's
    checkout and a copied cache folder); each gets a key of its own, so a stale archive is never the one mapped."""
    import pyspark

    def venv(where: Path) -> Path:
        (where / "jars").mkdir(parents=True)
        for name in ("spark-core_2.13-4.2.0.jar", "scala-library-2.13.16.jar"):
            (where / "jars" / name).write_bytes(name.encode())
        return where

    first = venv(tmp_path / "a" / "pyspark")
    monkeypatch.setattr(pyspark, "__file__", str(first / "__init__.py"))
    key = archive_key()
    assert archive_key() == key and archive_key("extra") != key
    moved = venv(tmp_path / "b" / "pyspark")
    monkeypatch.setattr(pyspark, "__file__", str(moved / "__init__.py"))
    assert archive_key() != key
    monkeypatch.setattr(pyspark, "__file__", str(first / "__init__.py"))
    _aged(first / "jars" / "scala-library-2.13.16.jar", 3600)  # installed again
    assert archive_key() != key


def test_leftovers_of_other_keys_go_and_only_the_recent_archives_stay(tmp_path: Path) -> None:
    """A dump of another key whose writer is gone is adopted or removed, whatever key it has; of the other keys'
    archives the three most recently used stay (each is some 180 MB), the rest go when one is claimed."""
    torn = tmp_path / f"{'0' * 20}.{_dead_pid()}.part"
    torn.write_bytes(b"\0")
    whole = tmp_path / f"{'1' * 20}.{_dead_pid()}.part"
    whole.write_bytes(_DYNAMIC_MAGIC)
    for n in range(2, 7):  # archives of keys 2..6, key 2 the most recently used
        (tmp_path / f"{str(n) * 20}.jsa").write_bytes(_DYNAMIC_MAGIC)
        _aged(tmp_path / f"{str(n) * 20}.jsa", 1000 * n)
    _aged(torn, 120)
    _aged(whole, 120)
    assert archive_options(folder=tmp_path).startswith("-XX:ArchiveClassesAtExit=")
    assert not torn.exists() and not whole.exists()
    left = sorted(p.name[0] for p in tmp_path.glob("*.jsa"))
    assert left == ["1", "2", "3"], left  # key 1's dump adopted (the newest), 2 and 3 kept; 4, 5 and 6 gone


def test_a_cache_folder_that_cannot_be_written_gives_no_options(tmp_path: Path, monkeypatch) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert archive_options(folder=blocked / "jvm") == ""
    monkeypatch.setattr(class_archive, "_java", lambda: None)
    assert archive_options(folder=tmp_path) == "" and mapped_options(folder=tmp_path) == ""


_MAPS = """
import json, os, sys
from pipeline.config import SparkConfig
from pipeline.spark.session import get_session
conf, archive = json.loads(sys.argv[1]), sys.argv[2] == "on"
spark = get_session(SparkConfig(master="local[1]", app_name="archive-test", conf=conf, class_archive=archive),
                    object_stores=False)
args = list(spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
print("RESULT " + json.dumps({"args": args, "sum": spark.range(10).selectExpr("sum(id)").first()[0]}))
"""


@pytest.mark.beside  # two JVMs of their own, in subprocesses
def test_a_session_started_here_maps_the_archive_spark_classes_and_all(tmp_path: Path) -> None:
    """A session get_session starts passes the archive to its JVM; the archive maps with Spark's class path (under
    -Xshare:on a JVM that cannot map it does not start), and a session with spark.class_archive off passes none."""
    cache = class_archive.archive_folder().parent  # make jvm-archive built it there; else one built here
    if not mapped_options():
        cache = tmp_path / "cache"
        class_archive.build(cache / "jvm")
    final = cache / "jvm" / f"{archive_key()}.jsa"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SBI_NO_JARS": "1",
           "SBI_CACHE_DIR": str(cache)}
    for key in ("SPARK_SUBMIT_OPTS", "SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_GATEWAY_PORT"):
        env.pop(key, None)

    def start(archive: str, **more_env: str) -> dict:
        done = subprocess.run([sys.executable, "-c", _MAPS, "{}", archive], env={**env, **more_env},
                              capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])

    # _JAVA_OPTIONS come after the command line's options: -Xshare:on overrides the session's -Xshare:auto, so a
    # JVM that cannot map the archive get_session passed does not start
    mapped = start("on", _JAVA_OPTIONS="-Xshare:on")
    assert f"-XX:SharedArchiveFile={final}" in mapped["args"] and mapped["sum"] == 45, mapped["args"]
    assert mapped["args"].index("-Xshare:on") > mapped["args"].index("-Xshare:auto"), mapped["args"]
    off = start("off")
    assert not [a for a in off["args"] if "SharedArchiveFile" in a or "ArchiveClassesAtExit" in a], off["args"]


def test_spark_submit_gets_one_word_that_maps_the_archive(tmp_path: Path, monkeypatch) -> None:
    """spark-submit starts its driver's JVM itself: make demo passes this word (no quoting survives make's $(...))."""
    monkeypatch.setenv("SBI_CACHE_DIR", str(tmp_path))
    assert class_archive.submit_args() == ""
    final = tmp_path / "jvm" / f"{archive_key()}.jsa"
    final.parent.mkdir()
    final.write_bytes(_DYNAMIC_MAGIC + b"...")
    assert class_archive.submit_args() == f"--driver-java-options=-XX:SharedArchiveFile={final}"
    assert len(class_archive.submit_args().split()) == 1


def test_a_class_path_of_jars_not_cached_gets_no_archive(tmp_path, monkeypatch):
    """The archive of a connector session's class path exists only for jars that are cached: with none, neither a
    build nor spark-submit's argument names one (a JVM would map a jar-free archive against another class path)."""
    monkeypatch.setenv("SBI_NO_JARS", "1")
    assert class_archive.class_path(("delta",)) == "" and class_archive.class_path(()) == ""
    assert class_archive.build(tmp_path, groups=("delta",)) is None and not list(tmp_path.iterdir())
    assert class_archive.submit_args(("delta",)) == ""
    assert archive_key("/jars/delta-spark.jar") != archive_key(""), "each class path has an archive of its own"
