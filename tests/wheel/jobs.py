"""The smoke set's small jobs and their checks: an embed job over 40 documents, every input id accounted for."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

import pipeline
from pipeline.core.compat import installed_pyspark
from tests.support.data import make_documents

ROWS = 40
NULL_ID = "d00005"  # its id is nulled: the row goes to the quarantine as invalid_id
OK_STATUSES = {"ok", "truncated"}
QUARANTINED = {"invalid_id", "error", "invalid_output"}


def documents(rows: int = ROWS) -> pa.Table:
    """The suite's documents (a null and a blank text) with one null id."""
    table = make_documents(rows)
    ids = [None if i == NULL_ID else i for i in table["doc_id"].to_pylist()]
    return table.set_column(0, "doc_id", pa.array(ids, pa.string()))


def embed_job(tmp_path: Path, model: Path, *, writer: str, rows: int | None = ROWS, **sections) -> dict:
    """The job over ``tmp_path/docs`` (written with :func:`documents` of ``rows``; None: left as it is)."""
    if rows is not None:
        write_deltalake(str(tmp_path / "docs"), documents(rows), mode="overwrite")
    data = {
        "job": "wheel_smoke",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id",
                   "keep_columns": ["source"]},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "batching": {"batch_size": 8, "max_length": 64},
        "sink": {"path": str(tmp_path / "scores"), "mode": "append", "writer": writer},
        "run": {"progress": False, "ds": "2026-12-01"},
        "spark": {"small_job_rows": 0},  # the full path: Spark's write, not the small job's driver commit
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def read(path: Path) -> pa.Table:
    return DeltaTable(str(path)).to_pyarrow_table()


def read_if_any(path: Path) -> list[dict]:
    return read(path).to_pylist() if (path / "_delta_log").is_dir() else []


def check_embed_rows(tmp_path: Path, summary, rows: int = ROWS) -> None:
    """Every input row is in the output or the quarantine, by id, once: the null id in the quarantine only, the
    rows with text scored, and the summary's counts agree with the tables."""
    out = read(tmp_path / "scores").to_pylist()
    quarantined = read_if_any(tmp_path / "scores_quarantine")
    expected = sorted(map(str, documents(rows)["doc_id"].to_pylist()))
    assert sorted(str(r["doc_id"]) for r in out + quarantined) == expected, "each input id once, output or quarantine"
    assert [r["status"] for r in quarantined] == ["invalid_id"] and quarantined[0]["doc_id"] is None
    assert (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (rows, len(out), len(quarantined))
    statuses = {r["doc_id"]: r["status"] for r in out}
    assert statuses["d00001"] == "skipped_null" and statuses["d00002"] == "skipped_empty"
    assert {s for i, s in statuses.items() if i not in ("d00001", "d00002")} <= OK_STATUSES
    assert all(len(r["embedding"]) == 32 for r in out if r["status"] in OK_STATUSES)
    assert summary.versions["spark_batch_inference"] == pipeline.__version__
    assert summary.versions["pyspark"] == installed_pyspark()
