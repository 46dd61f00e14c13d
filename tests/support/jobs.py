"""The test jobs' configs and what they wrote: ``job_config`` (a small embed job over ``tmp_path``), ``read_scores``.

The job reads ``tmp_path/docs`` (``doc_id``, ``text``, ``source``: :func:`tests.support.data.make_documents`)
and appends to ``tmp_path/scores`` on the running test's writer; a section given replaces or extends the default.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from pipeline.config import build_config
from tests.support.data import current_writer

__all__ = ["D1", "D2", "job_config", "read_scores"]

D1, D2 = "2026-11-28", "2026-11-29"


def job_config(tmp_path: Path, model: Path, **sections):
    data = {
        "job": "score_test",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id",
                   "text_column": "text", "keep_columns": ["source"]},
        "model": {"path": str(model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "batching": {"batch_size": 16, "max_length": 256},
        "sink": {"path": str(tmp_path / "scores"), "mode": "append", "writer": current_writer()},
        "run": {"progress": False, "ds": D1},
    }
    for key, value in sections.items():
        data[key] = value if key == "task" else {**data.get(key, {}), **value}
    return build_config(data)


def read_scores(tmp_path: Path) -> pa.Table:
    return pa.table(DeltaTable(str(tmp_path / "scores")).to_pyarrow_table())
