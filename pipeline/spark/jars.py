"""The JVM artifacts a session needs beyond Spark's own: the Delta connector and the S3A file system.

Fetched once from Maven Central into a cache folder (``make jars``, which ``make venv`` calls), not per
job: Spark's own Ivy resolves each group's coordinates with their dependencies, exactly as
``--packages`` (and delta-spark's ``configure_spark_with_delta_pip``) would, and the jars Spark already
ships are dropped (Spark's copy wins on its classpath anyway; a second Hadoop or Jackson beside it only
invites conflicts). Sessions this library builds add what the cache holds (:func:`session_jar_confs`),
so ``sink.writer: auto`` picks the connector wherever the jars are.

Groups:

- ``delta``: ``io.delta:delta-spark_<spark>_2.13:<delta-spark>`` (with ``delta-storage`` and the
  kernel jars it depends on), matching the installed pyspark and delta-spark.
- ``s3``: ``org.apache.hadoop:hadoop-aws:<Spark's Hadoop>`` with the AWS SDK v2 bundle it pins
  (about 690 MB), for ``s3a://`` paths through Spark.

The cache: ``$SBI_JARS_DIR``, else ``~/.cache/spark-batch-inference/jars``; one folder per group,
complete only when its ``coordinates.txt`` is there (written last).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

__all__ = ["GROUPS", "cache_dir", "coordinates", "fetch", "jars", "main", "session_jar_confs", "spark_submit_args"]

GROUPS = ("delta", "s3")
DELTA_CONFS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
_MANIFEST = "coordinates.txt"
# Ivy's file names: <org>_<artifact>-<version>.jar; Spark's own: <artifact>-<version>.jar
_VERSIONED = re.compile(r"^(?P<name>.+?)-(?P<version>\d[\w.\-]*)\.jar$")


def cache_dir() -> Path:
    """Where fetched jars live: ``$SBI_JARS_DIR``, else ``~/.cache/spark-batch-inference/jars``."""
    configured = os.environ.get("SBI_JARS_DIR")
    if configured:
        return Path(configured).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "spark-batch-inference" / "jars"


def _spark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def hadoop_version() -> str:
    """The Hadoop version Spark ships (``hadoop-client-api-X.jar`` in pyspark's jars)."""
    for jar in sorted(_spark_jars_dir().glob("hadoop-client-api-*.jar")):
        return jar.name[len("hadoop-client-api-"):-len(".jar")]
    raise RuntimeError(f"no hadoop-client-api jar in {_spark_jars_dir()}: is pyspark installed whole?")


def coordinates(group: str) -> list[str]:
    """The Maven coordinates of ``group``, matching the installed pyspark / delta-spark.

    >>> coordinates("delta")  # doctest: +ELLIPSIS
    ['io.delta:delta-spark_4.2_2.13:4.4.0']
    """
    if group == "delta":
        from pipeline.core.sessions import delta_package

        package = delta_package()
        return [package] if package else []  # no Delta release for this Spark line: nothing to fetch
    if group == "s3":
        return [f"org.apache.hadoop:hadoop-aws:{hadoop_version()}"]
    raise ValueError(f"unknown jar group {group!r}; one of {', '.join(GROUPS)}")


def _artifact(jar_name: str) -> str:
    """``jackson-core`` for ``com.fasterxml.jackson.core_jackson-core-2.13.5.jar`` and ``jackson-core-2.20.jar``.

    >>> _artifact("com.fasterxml.jackson.core_jackson-core-2.13.5.jar"), _artifact("jackson-core-2.20.0.jar")
    ('jackson-core', 'jackson-core')
    >>> _artifact("io.delta_delta-spark_4.2_2.13-4.4.0.jar")
    'delta-spark_4.2_2.13'
    """
    match = _VERSIONED.match(jar_name)
    name = match.group("name") if match else jar_name[:-4]
    head, sep, tail = name.partition("_")
    return tail if sep and "." in head else name


def jars(group: str) -> list[Path]:
    """The cached jars of ``group`` when it was fetched for today's coordinates; [] otherwise."""
    folder = cache_dir() / group
    manifest = folder / _MANIFEST
    try:
        wanted = coordinates(group)
    except Exception:  # noqa: BLE001 - pyspark missing or unusual: treat as not fetched
        return []
    if not manifest.is_file() or manifest.read_text().split() != wanted:
        return []
    return sorted(folder.glob("*.jar"))


def session_jar_confs(groups: Iterable[str] = GROUPS, *, local: bool = False) -> dict[str, str]:
    """Static confs for a session Python starts: the cached jars and, with Delta, its two session confs. Empty
    when nothing is cached. ``$SBI_NO_JARS=1`` turns this off (a jar-free session).

    On a cluster the jars are ``spark.jars``: Spark ships them to the executors. On a ``local`` master, where the
    executor is the driver's JVM, they go on that JVM's class path (``spark.driver.extraClassPath``) instead:
    nothing is copied to an executor folder at start (``spark.jars`` copied the 690 MB of S3A to each new local
    session), and the classes load through the application class loader, which the JVM's class archive
    covers (:mod:`pipeline.spark.class_archive`; a connector session started in 3.2-3.5 s with it, 8 s before:
    docs/benchmarks_small_jobs.md).
    """
    if os.environ.get("SBI_NO_JARS") == "1":
        return {}
    found = {g: jars(g) for g in groups}
    paths = [str(p) for g in groups for p in found[g]]
    if not paths:
        return {}
    confs = {"spark.driver.extraClassPath": os.pathsep.join(paths)} if local else {"spark.jars": ",".join(paths)}
    if found.get("delta"):
        confs.update(DELTA_CONFS)
    return confs


def spark_submit_args(groups: Iterable[str] = GROUPS, *, local: bool = False) -> list[str]:
    """``--jars ... --conf ...`` for spark-submit (the driver's JVM starts before our code runs); with ``local`` (a
    local master) ``--driver-class-path ...`` in place of ``--jars`` (:func:`session_jar_confs`)."""
    confs = session_jar_confs(groups, local=local)
    if not confs:
        return []
    args = (["--driver-class-path", confs.pop("spark.driver.extraClassPath")] if local else
            ["--jars", confs.pop("spark.jars")])
    for key, value in confs.items():
        args += ["--conf", f"{key}={value}"]
    return args


def fetch(group: str, *, out=sys.stderr) -> list[Path]:
    """Resolve ``group`` from Maven Central with Spark's Ivy into the cache; returns its jars.

    Nothing is fetched when the cache already holds it. A failure names the coordinate and Ivy's
    own last lines (an artifact Maven Central does not serve shows there as ``not found``).
    """
    have = jars(group)
    if have:
        print(f"jars: {group}: cached ({len(have)} jars in {cache_dir() / group})", file=out, flush=True)
        return have
    wanted = coordinates(group)
    if not wanted:
        from pipeline.core.compat import installed_pyspark

        print(f"jars: {group}: no release is built for Spark {installed_pyspark()}; nothing fetched (sessions run "
              "jar-free: sink.writer auto picks the deltalake writer)", file=out, flush=True)
        return []
    target = cache_dir() / group
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and not (target / _MANIFEST).is_file() and any(target.iterdir()):
        # the fetch replaces the folder: only one an earlier fetch wrote (its manifest says so) may go
        raise RuntimeError(f"{target} exists and was not written by a jar fetch (no {_MANIFEST}); nothing was "
                           f"replaced. Point SBI_JARS_DIR at an empty or new folder, or remove {target} yourself")
    ivy = cache_dir() / f".ivy-{group}"  # Ivy's own cache, one per group: its jars/ holds this group's only
    print(f"jars: {group}: fetching {', '.join(wanted)} from Maven Central ...", file=out, flush=True)
    with tempfile.TemporaryDirectory(prefix="sbi-jars-") as tmp:
        noop = Path(tmp) / "noop.py"
        noop.write_text("")
        submit = Path(sys.executable).parent / "spark-submit"
        cmd = [str(submit) if submit.exists() else "spark-submit", "--packages", ",".join(wanted),
               "--conf", f"spark.jars.ivy={ivy}", str(noop)]
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
            raise RuntimeError(f"fetching {', '.join(wanted)} failed (exit {done.returncode}); Ivy said:\n{tail}")
        resolved = sorted((ivy / "jars").glob("*.jar"))
        spark_own = {_artifact(p.name) for p in _spark_jars_dir().glob("*.jar")}
        keep = [p for p in resolved if _artifact(p.name) not in spark_own]
        staging = Path(tempfile.mkdtemp(prefix=f".{group}-", dir=target.parent))
        for jar in keep:
            shutil.copy2(jar, staging / jar.name)
        (staging / _MANIFEST).write_text("\n".join(wanted) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    have = jars(group)
    size = sum(p.stat().st_size for p in have) / 1e6
    print(f"jars: {group}: {len(have)} jars, {size:.0f} MB in {target}", file=out, flush=True)
    return have


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.spark.jars [fetch|submit-args [--local]|path] [GROUP ...]``."""
    args = list(argv if argv is not None else sys.argv[1:])
    verb = args.pop(0) if args else "fetch"
    local = "--local" in args
    args = [a for a in args if a != "--local"]
    groups = args or list(GROUPS)
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        print(f"error: unknown jar group(s) {unknown}; choose from {', '.join(GROUPS)}", file=sys.stderr)
        return 2
    if verb == "fetch":
        for group in groups:
            try:
                fetch(group)
            except RuntimeError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        return 0
    if verb == "submit-args":
        print(" ".join(spark_submit_args(groups, local=local)))
        return 0
    if verb == "path":
        print(cache_dir())
        return 0
    print(f"error: unknown verb {verb!r}; fetch, submit-args or path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
