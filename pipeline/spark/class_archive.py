"""A class-data-sharing archive for the driver JVMs this library starts, so a session starts sooner.

A local session's JVM loads some ten thousand of Spark's classes before its first query, parsing and
verifying each one: most of a session's start on 2 cores. Java 17 can keep those classes, parsed, in an
archive it maps at start (AppCDS, a dynamic archive: ``-XX:ArchiveClassesAtExit`` writes it when a JVM exits,
``-XX:SharedArchiveFile`` maps it). The first session on a machine writes it when its process ends (about
180 MB in the user's cache folder, a few seconds more at that exit); every later session with the same Java,
pyspark and class path maps it. A session's start took 2.5 s instead of 5.4 s, measured with
``bench/bench_driver.py`` (docs/benchmarks_small_jobs.md, "With the driver JVM's class archive").

Safe by construction: the archive is only a speed-up. The JVM maps it with ``-Xshare:auto``, so an archive that
does not match (another Java, a changed class path, a torn file) is skipped silently and the classes load as
before. One process writes it at a time: a dump is written under a name of its own
(``<key>.<pid>.part``) and renamed into place by a later session once the writer is gone and the file is whole
(Java's dynamic-archive magic at its start, untouched for a minute); a session that finds a dump still being
written runs without an archive. Sessions this library launches get it (``get_session`` on a local or other
master it starts itself); under spark-submit the driver JVM exists before the job runs, and :func:`submit_args`
gives spark-submit's argument for it (``make demo`` passes it); on Databricks the cluster starts the driver. ``spark.class_archive: false`` turns
it off; ``$SBI_CACHE_DIR/jvm`` (else ``~/.cache/spark-batch-inference/jvm``) holds the archives.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from pipeline.core.host import pid_alive, user_cache_folder

__all__ = ["QUICK_START_JVM_OPTIONS", "archive_folder", "archive_key", "archive_options", "build", "class_path",
           "mapped_options", "submit_args"]

# A small job's driver JVM runs for seconds: compiled by C1 alone, a serial collector and a code cache that
# needs no second tier. On 2 cores a 100-row job started about 3 s sooner (bench/small_jobs.py).
# (pipeline.spark.session gives it to small jobs' JVMs; build() to the JVMs that write the archives)
QUICK_START_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m"
# Java's magic number at the start of a dynamic CDS archive (CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian)
_DYNAMIC_MAGIC = (0xF00BABA8).to_bytes(4, "little")
# a dump untouched this long, its claimant gone, is done: whole (adopted) or torn (removed)
_SETTLED_S = 60.0
# archives of other keys kept (other venvs, other Javas): the most recently used
_KEPT = 3
# the archive logs nothing: a mismatched archive is skipped, not reported on the job's output
_QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_folder() -> Path:
    """``$SBI_CACHE_DIR/jvm``, else ``$XDG_CACHE_HOME/spark-batch-inference/jvm`` (``~/.cache`` by default)."""
    return user_cache_folder("jvm")


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else (Path(w) if (w := shutil.which("java")) else None)
    return found.resolve() if found is not None and found.exists() else None


def archive_key(extra: str = "") -> str | None:
    """What an archive is valid for: the Java that runs (its path and release file), pyspark's version and its
    jars as the JVM checks them (the class path the archive records: each jar's full path, size and modification
    time, so a venv at another path or installed again gets an archive of its own), and ``extra`` (the class-path
    settings of the session); None when no Java is found (the launcher will say so itself)."""
    import pyspark

    java = _java()
    if java is None:
        return None
    release = java.parent.parent / "release"
    jars = []
    for jar in sorted((Path(pyspark.__file__).parent / "jars").resolve().glob("*.jar")):
        try:
            stat = jar.stat()
        except OSError:
            continue
        jars.append(f"{jar} {stat.st_size} {int(stat.st_mtime)}")
    digest = hashlib.sha256()
    for part in (str(java), release.read_text(errors="replace") if release.is_file() else "",
                 pyspark.__version__, pyspark.__file__, "\n".join(jars), extra):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def _archive(extra: str = "", folder: Path | None = None) -> Path | None:
    """Where the archive for this Java and class path lives (None: no Java found)."""
    key = archive_key(extra)
    return None if key is None else (folder or archive_folder()) / f"{key}.jsa"


def _whole(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == _DYNAMIC_MAGIC
    except OSError:
        return False


def _adopt(final: Path, now: float) -> bool:
    """Rename finished dumps into place, remove torn ones (of every key in the folder, so a venv gone leaves no
    dump behind); whether one of ``final``'s is claimed or being written (its claimant alive, or touched within
    :data:`_SETTLED_S`)."""
    busy = False
    for part in final.parent.glob("*.*.part"):
        try:
            key, pid = part.name.split(".")[0], int(part.name.split(".")[-2])
            age = now - part.stat().st_mtime
        except (ValueError, OSError):
            continue
        target = final.with_name(f"{key}.jsa")
        if pid_alive(pid) or age < _SETTLED_S:
            busy = busy or target == final
        elif _whole(part) and not target.exists():
            try:
                os.replace(part, target)
            except OSError:
                pass
        else:
            part.unlink(missing_ok=True)
    return busy


def _prune(final: Path) -> None:
    """Keep the :data:`_KEPT` archives last written or mapped besides ``final`` (each is some 180 MB; a venv
    installed again or moved has a key of its own); older ones go. A JVM that maps one keeps its own mapping."""
    others = []
    for jsa in final.parent.glob("*.jsa"):
        try:
            if jsa != final:
                others.append((jsa.stat().st_mtime, jsa))
        except OSError:
            continue
    for _, jsa in sorted(others, reverse=True)[_KEPT:]:
        jsa.unlink(missing_ok=True)


def archive_options(extra: str = "", *, folder: Path | None = None) -> str:
    """The driver JVM's options: map the archive for this Java and class path, else (nobody claimed one) claim it
    and write it at this JVM's exit; ``""`` when neither (no Java found, an unwritable cache folder, a dump
    claimed by a live process: the test suite's long-lived session, say). ``extra``: what else decides the class
    path (``spark.driver.extraClassPath``).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> first = archive_options(folder=folder)
    >>> first.startswith("-XX:ArchiveClassesAtExit=") and first.endswith(".part " + _QUIET)
    True
    >>> archive_options(folder=folder)  # claimed by this process, alive: nothing to map yet, no second dump
    ''
    """
    final = _archive(extra, folder)
    if final is None:
        return ""
    folder = final.parent
    try:
        if folder.is_dir() and _adopt(final, time.time()) and not final.exists():
            return ""
        if final.exists() and _whole(final):
            try:
                os.utime(final)  # mapped: the most recently used, kept by _prune
            except OSError:  # another user's archive (a shared cache folder) maps all the same
                pass
            return f"-XX:SharedArchiveFile={final} {_QUIET}"
        folder.mkdir(parents=True, exist_ok=True)
        _prune(final)
        claim = folder / f"{final.stem}.{os.getpid()}.part"
        claim.touch()  # claimed: sessions started meanwhile neither map nor write one
    except OSError:
        return ""
    return f"-XX:ArchiveClassesAtExit={claim} {_QUIET}"


def mapped_options(extra: str = "", *, folder: Path | None = None) -> str:
    """The options that map the archive when one is there, else ``""``: never a claim or a dump. For JVMs started
    outside :func:`~pipeline.spark.session.get_session` (``SPARK_SUBMIT_OPTS`` of a spark-submit or a Connect
    server), where many may start at once and none should write one."""
    final = _archive(extra, folder)
    return f"-XX:SharedArchiveFile={final} {_QUIET}" if final is not None and _whole(final) else ""


def build(folder: Path | None = None, *, groups: tuple[str, ...] = ()) -> Path | None:
    """Write the archive now (``make jvm-archive``, CI before the tests): a session in a child process writes and
    reads Parquet, shuffles, joins and runs Arrow and Python UDFs, its JVM exits and dumps, the dump is renamed
    into place; the archive's path (None when no Java is found, or ``groups`` names jars not cached). An archive
    already there is kept. ``groups``: the cached jars (:mod:`pipeline.spark.jars`) on the class path of a local
    session's JVM, as :func:`~pipeline.spark.session.get_session` puts them there; with ``delta`` the child also
    writes a Delta table, replaces one of its partitions and reads its history."""
    import subprocess
    import sys

    extra = class_path(groups)
    if groups and not extra:
        return None
    final = _archive(extra, folder)
    if final is None or _whole(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    _prune(final)
    part = final.with_name(f"{final.stem}.build-{os.getpid()}.tmp")
    # the classes a JVM loads do not depend on its JIT: C1 and the serial GC (a caller's own options after them,
    # so they win); both archives one after the other took 190 and 175 s so, against 204 and 191 s with C2
    jvm = " ".join(filter(None, [QUICK_START_JVM_OPTIONS, os.environ.get("SPARK_SUBMIT_OPTS")]))
    env = {**os.environ, "SBI_NO_JARS": "0" if groups else "1", "SPARK_SUBMIT_OPTS": jvm}
    subprocess.run([sys.executable, "-c", _BUILD, str(part), ",".join(groups)], check=True, env=env)
    if not _whole(part):
        part.unlink(missing_ok=True)
        raise RuntimeError(f"the JVM wrote no class archive at {part}")
    os.replace(part, final)
    return final


def class_path(groups: tuple[str, ...] | list[str]) -> str:
    """The driver class path a local session gets for the cached jars of ``groups`` (``""``: none, or none
    cached): what keys that session's archive."""
    if not groups:
        return ""
    from pipeline.spark.jars import session_jar_confs

    return session_jar_confs(tuple(groups), local=True).get("spark.driver.extraClassPath", "")


# the child of build(): its session's JVM dumps at exit, which this waits for
_BUILD = """
import sys
from pathlib import Path
from pyspark import SparkContext
from pyspark.sql import functions as F
from pipeline.config import SparkConfig
from pipeline.spark import class_archive
from pipeline.spark.session import get_session

groups = [g for g in sys.argv[2].split(",") if g]
class_archive.archive_options = lambda *a, **k: class_archive._dump_options(Path(sys.argv[1]))
spark = get_session(SparkConfig(master="local[2]", app_name="sbi-class-archive"), object_stores="s3" in groups)
# what a job's JVM loads: Parquet written and read, a shuffle, a join, Arrow to Python workers and back
folder = Path(sys.argv[1] + ".data")
rows = spark.range(2000).selectExpr("id", "cast(id as string) as text", "current_date() as ds")
rows.write.mode("overwrite").partitionBy("ds").parquet(str(folder))
back = spark.read.parquet(str(folder))
back.mapInArrow(lambda batches: batches, back.schema).groupBy((F.col("id") % 7).alias("k")).count().collect()
back.join(back.select("id"), "id").select(F.udf(lambda x: x + 1, "long")("id").alias("x")).agg(F.sum("x")).collect()
back.select(F.pandas_udf(lambda s: s.str.len(), "long")("text").alias("n")).agg(F.max("n")).collect()
if "delta" in groups:  # and what a connector job loads: a Delta table made, a partition replaced, its history
    table = str(folder / "delta")
    rows.write.format("delta").partitionBy("ds").save(table)
    (rows.where("id < 10").write.format("delta").mode("overwrite").option("replaceWhere", "ds = current_date()")
     .option("userMetadata", "{}").save(table))
    spark.read.format("delta").load(table).groupBy("ds").count().collect()
    spark.sql(f"DESCRIBE HISTORY delta.`{table}`").collect()
import shutil
shutil.rmtree(folder, ignore_errors=True)
proc = SparkContext._gateway.proc
spark.stop()
proc.stdin.close()  # the JVM exits on its stdin's end, writing the archive
proc.wait()
"""


def _dump_options(path: Path) -> str:
    """What :func:`build`'s child passes its JVM in place of :func:`archive_options`: write the dump at ``path``."""
    return f"-XX:ArchiveClassesAtExit={path} {_QUIET}"


def submit_args(groups: tuple[str, ...] = ()) -> str:
    """spark-submit's argument that maps the archive (``--driver-java-options=-XX:SharedArchiveFile=...``), one word
    with no quoting needed (``""`` without an archive, or where its path has a space). spark-submit starts the
    driver's JVM before the job's code runs, so a job launched that way passes it itself:
    ``spark-submit $(python -m pipeline.spark.class_archive submit-args) ...``. ``groups``: the cached jars on
    its class path, as ``python -m pipeline.spark.jars submit-args --local GROUP ...`` puts them there (make
    demo: ``submit-args delta`` beside ``--driver-class-path`` of the Delta jars)."""
    extra = class_path(groups)
    if groups and not extra:
        return ""
    final = _archive(extra)
    if final is None or not _whole(final) or any(c.isspace() for c in str(final)):
        return ""
    return f"--driver-java-options=-XX:SharedArchiveFile={final}"


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["submit-args"]:
        print(submit_args(tuple(sys.argv[2:])))
    else:  # only a speed-up: a JVM that writes none (an older Java, say) leaves sessions to start as before
        from concurrent.futures import ThreadPoolExecutor

        from pipeline.spark.jars import jars

        def _one(chosen: tuple[str, ...]) -> None:
            try:
                print(build(groups=chosen) or "no Java found: no class archive", flush=True)
            except Exception as exc:  # noqa: BLE001 - said, not raised: make test goes on without it
                print(f"no class archive{' with ' + ', '.join(chosen) if chosen else ''} "
                      f"({type(exc).__name__}: {exc}); sessions start without one", file=sys.stderr, flush=True)

        # jar-free, and with the Delta jars on the class path when they are cached (a local connector session):
        # side by side (on 2 cores 119 and 114 s against 190 and 175 s one after the other: docs/development.md)
        chosen = [()] + ([("delta",)] if os.environ.get("SBI_NO_JARS") != "1" and jars("delta") else [])
        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            list(pool.map(_one, chosen))
