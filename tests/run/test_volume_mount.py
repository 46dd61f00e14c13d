"""The runs table, staging and drift history on a mount that refuses what a Unity Catalog Volume refuses.

A Volume is a FUSE mount on the driver and the executors; it refuses hard links and renames ("Function not
implemented", os error 38), and delta-rs's commits there fail (delta-io/delta-rs#2540). Each test runs in a
child process whose links and renames under one folder fail the same way (tests/support/volume.py: the calls
made fail with ENOSYS; Spark's JVM goes without it, as on Databricks it reaches a Volume through the cloud store).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.data import make_documents, write_delta
from tests.support.volume import build_shim, run_on_volume


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_shim(tmp_path_factory.mktemp("shim"))
    if built is None:
        pytest.skip("no C compiler here to build the Volume-like mount's shim (tests/support/volume_mount.c)")
    return built


def _volume(tmp_path: Path) -> Path:
    root = tmp_path / "Volumes" / "main" / "sbi"
    root.mkdir(parents=True)
    return root


def test_the_mount_refuses_what_a_volume_refuses_and_reads_work(shim: Path, tmp_path: Path) -> None:
    """The shim is what the other tests stand on: links and renames under the folder fail with ENOSYS (38) and
    deltalake cannot write a table there, as on a Volume; reads and everything outside the folder work."""
    root = _volume(tmp_path)
    write_delta(root / "written_from_outside", make_documents(5))  # this process has no shim
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    found = run_on_volume(shim, root, {"what": "probe", "outside": str(tmp_path / "out"),
                                       "table": str(root / "written_from_outside")}, timeout_s=120)
    assert (found["link"], found["rename"], found["replace"], found["outside"]) == (38, 38, 38, "ok")
    assert "Function not implemented (os error 38)" in found["deltalake_write"]
    assert found["deltalake_read"] == 5


def test_staging_is_written_and_reused_on_a_mount_without_renames(shim: Path, tmp_path: Path) -> None:
    """A staged task's rows and marker, the plan and the owner file are written in place where renames are
    refused; the task is reused; a marker torn half-way does not parse and is read as missing."""
    root = _volume(tmp_path)
    found = run_on_volume(shim, root, {"what": "staging"}, timeout_s=120)
    assert found["failed"] is False and found["staged"] == [0, 1]
    assert found["reused_rows"] == 3 and found["counts"] == {"status": {"ok": 3}}
    assert found["torn"] is None and found["again"] == {"v": 3}
    assert not [f for f in found["files"] if f.endswith(".json.tmp") or f.startswith(".plan")], found["files"]
    assert any(f.startswith(".task-0.") and f.endswith(".arrow.tmp") for f in found["files"]), found["files"]


def _job(tmp_path: Path, model: Path, root: Path, *, writer: str, ds: str, run_id: str, **run: object) -> dict:
    return {
        "job": "score_documents",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id", "text_column": "text"},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "batching": {"batch_size": 16},
        "sink": {"path": str(root / "warehouse" / "document_scores"), "writer": writer},
        "run": {"progress": False, "ds": ds, "run_id": run_id, "state_path": str(root / "state"), **run},
    }


@pytest.mark.beside
def test_without_the_connector_a_run_it_cannot_record_there_fails_before_any_work(shim: Path, tmp_path: Path,
                                                                                   tiny_embed_model: Path) -> None:
    """deltalake cannot commit the runs table on the mount and a jar-free session cannot write it through the
    connector: under run.record: required the run stops before any work, naming os error 38 and what to do.
    best_effort runs unrecorded and says so; its executors stage through the mount (rows and markers written in
    place), so a rerun of a run that died before its commit reuses every task."""
    root = _volume(tmp_path)
    write_delta(tmp_path / "docs", make_documents(20))
    runs = root / "state" / "score_documents" / "runs"
    required = _job(tmp_path, tiny_embed_model, root / "required", writer="deltalake", ds="2026-11-29", run_id="r1")
    died, rerun = (_job(tmp_path, tiny_embed_model, tmp_path, writer="deltalake", ds="2026-11-29", run_id=run_id,
                        record="best_effort", state_path=str(root / "state"), **faults)
                   for run_id, faults in (("died", {"faults": {"fail_before_commit": True}}), ("rerun", {})))
    died["source"]["repartition"] = rerun["source"]["repartition"] = 2
    found = run_on_volume(shim, root, {"what": "jobs", "jobs": [required, died, rerun], "runs_path": str(runs),
                                       "executors_on_volume": True}, timeout_s=560, env={"SBI_NO_JARS": "1"})
    refused, failed, resumed = found["results"]
    assert refused["ok"] is False and refused["error"] == "RecordError", refused
    assert "could not write the 'started' row of run r1 to the runs table" in refused["message"]
    assert "the mount refused deltalake's commit (DeltaError: " in refused["message"]
    assert "os error 38" in refused["message"] and "which this session lacks" in refused["message"]
    assert "Nothing was run" in refused["message"] and not (root / "required" / "warehouse").exists()
    # the executors staged both tasks through the mount (the rows file under its temp name), the rerun reused them
    assert failed["error"] == "InjectedFaultError", failed
    staged = failed["staged"]
    assert len([f for f in staged if f.endswith(".done.json")]) == 2, staged
    assert len([f for f in staged if f.endswith(".arrow.tmp")]) == 2, staged
    assert resumed["ok"] is True and resumed["rows_out"] == 20 and resumed["resumed_tasks"] == 2, resumed
    assert "staging off" not in resumed["log"]
    assert f"runs table              : not recorded at {runs}" in resumed["log"]
    assert not (runs / "_delta_log").is_dir()


@pytest.mark.connector
def test_the_runs_table_is_written_and_read_back_on_the_volume_like_mount(shim: Path, tmp_path: Path,
                                                                          tiny_embed_model: Path) -> None:
    """A job whose output, runs table and staging are on the mount (the bundle's layout on a Volume) records both
    nights through the session's Delta connector; the runs table reads back with deltalake through the mount, and
    the second night's drift gate has the first as its history."""
    root = _volume(tmp_path)
    write_delta(tmp_path / "docs", make_documents(20))
    runs = root / "state" / "score_documents" / "runs"
    jobs = [_job(tmp_path, tiny_embed_model, root, writer="delta", ds=ds, run_id=run_id)
            for ds, run_id in (("2026-11-29", "night1"), ("2026-11-30", "night2"))]
    for job in jobs:  # one task: one worker loads the model (two side by side on 2 cores took 11 s); it stages alike
        job["source"]["repartition"] = 1
    found = run_on_volume(shim, root, {"what": "jobs", "jobs": jobs, "runs_path": str(runs),
                                       "executors_on_volume": True}, timeout_s=560)
    first, second = found["results"]
    assert first["ok"] and second["ok"], found["results"]
    assert [(r["run_id"], r["outcome"]) for r in found["runs"]] == [("night1", "ok"), ("night2", "ok")], found["runs"]
    assert f"runs table              : {runs} (version" in second["log"]
    assert second["drift"]["history"] == ["night1"], second["drift"]
    assert "staging off" not in first["log"] + second["log"]
