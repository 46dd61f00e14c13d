"""The jar cache (pipeline.spark.jars): what a session gets from it, and when it counts as fetched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.spark import jars as jars_mod


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SBI_JARS_DIR", str(tmp_path / "jars"))
    monkeypatch.delenv("SBI_NO_JARS", raising=False)
    return tmp_path / "jars"


def _fake_group(cache: Path, group: str, names: list[str], coordinates: list[str] | None = None) -> None:
    folder = cache / group
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(b"PK")
    (folder / "coordinates.txt").write_text("\n".join(coordinates or jars_mod.coordinates(group)) + "\n")


def test_the_coordinates_follow_the_installed_pyspark_and_delta_spark():
    from importlib.metadata import version

    spark_mm = ".".join(version("pyspark").split(".")[:2])
    assert jars_mod.coordinates("delta") == [f"io.delta:delta-spark_{spark_mm}_2.13:{version('delta-spark')}"]
    hadoop = jars_mod.hadoop_version()
    assert jars_mod.coordinates("s3") == [f"org.apache.hadoop:hadoop-aws:{hadoop}"]
    assert hadoop.split(".")[0] == "3"
    with pytest.raises(ValueError, match="unknown jar group 'gcs'"):
        jars_mod.coordinates("gcs")


def test_a_session_gets_the_cached_jars_and_deltas_settings(cache):
    assert jars_mod.session_jar_confs() == {}, "nothing cached: a jar-free session"
    _fake_group(cache, "delta", ["io.delta_delta-spark_4.2_2.13-4.4.0.jar", "io.delta_delta-storage-4.4.0.jar"])
    confs = jars_mod.session_jar_confs()
    assert confs["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert confs["spark.jars"].split(",") == [str(cache / "delta" / n) for n in
                                             ("io.delta_delta-spark_4.2_2.13-4.4.0.jar",
                                              "io.delta_delta-storage-4.4.0.jar")]
    args = jars_mod.spark_submit_args()
    assert args[:2] == ["--jars", confs["spark.jars"]]
    assert "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog" in args
    # a local master: the same jars on the driver's class path, nothing in spark.jars
    local = jars_mod.session_jar_confs(local=True)
    assert "spark.jars" not in local and local["spark.sql.extensions"] == confs["spark.sql.extensions"]
    assert local["spark.driver.extraClassPath"].split(os.pathsep) == confs["spark.jars"].split(",")
    args = jars_mod.spark_submit_args(local=True)
    assert args[:2] == ["--driver-class-path", local["spark.driver.extraClassPath"]] and "--jars" not in args


def test_a_cache_for_other_versions_or_a_half_fetched_one_does_not_count(cache, monkeypatch):
    _fake_group(cache, "delta", ["io.delta_delta-spark_4.2_2.13-4.3.0.jar"],
                coordinates=["io.delta:delta-spark_4.2_2.13:4.3.0"])  # fetched before the lock moved
    _fake_group(cache, "s3", ["org.apache.hadoop_hadoop-aws-3.5.0.jar"])
    (cache / "s3" / "coordinates.txt").unlink()  # the manifest is written last: without it, a fetch died midway
    assert jars_mod.jars("delta") == [] and jars_mod.jars("s3") == []
    assert jars_mod.session_jar_confs() == {}


def test_sbi_no_jars_gives_a_jar_free_session(cache, monkeypatch):
    _fake_group(cache, "delta", ["io.delta_delta-spark_4.2_2.13-4.4.0.jar"])
    monkeypatch.setenv("SBI_NO_JARS", "1")
    assert jars_mod.session_jar_confs() == {}


def test_the_cli_refuses_an_unknown_group_and_verb(capsys):
    assert jars_mod.main(["fetch", "gcs"]) == 2
    assert "unknown jar group(s) ['gcs']" in capsys.readouterr().err
    assert jars_mod.main(["download"]) == 2


def test_a_fetch_never_replaces_a_folder_it_did_not_write(cache):
    """The fetch replaces its group's folder whole: one without the fetch's manifest (someone's own folder
    where ``$SBI_JARS_DIR/<group>`` points) is refused before any download, and stays byte for byte."""
    (cache / "s3").mkdir(parents=True)
    (cache / "s3" / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match=r"was not written by a jar fetch \(no coordinates.txt\); nothing was replaced"):
        jars_mod.fetch("s3")
    assert [p.name for p in (cache / "s3").iterdir()] == ["notes.txt"]
    assert (cache / "s3" / "notes.txt").read_text() == "mine"
