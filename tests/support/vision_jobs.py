"""The image rows of the vision tests on Spark: a photos table, scored by a job and by ``score(df)``.

Six rows: four good photos (``PHOTOS``), one that is not an image and one null; the same rows go through
``run_job`` (read back from Delta) and ``score(df)``, on whichever backend the task names
(``tests/generation/test_vision.py``, ``test_vision_vllm.py``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.support import image_samples as samples

PHOTOS = [samples.jpeg(0), samples.png(1), samples.jpeg(2), samples.png(3)]


def photos_table(tmp_path: Path) -> tuple[list[str], list[bytes | None]]:
    """``(ids, photos)`` of the Delta table written at ``tmp_path / "photos"``: ``PHOTOS``, junk bytes, a null."""
    from tests.support.data import write_delta

    ids = [f"p{i}" for i in range(6)]
    photos = [*PHOTOS, b"not an image", None]
    write_delta(tmp_path / "photos", pa.table({"photo_id": ids, "photo": pa.array(photos, pa.binary())}))
    return ids, photos


def job_and_score(spark: Any, tmp_path: Path, task: dict, model: dict, *,
                  job: str = "vision_test") -> tuple[dict[str, dict], dict[str, dict]]:
    """``{id: row}`` from ``run_job`` (read back from Delta) and from ``score(df)`` on the same rows."""
    from deltalake import DeltaTable

    from pipeline import score
    from pipeline.config import build_config
    from pipeline.runner import run_job

    ids, photos = photos_table(tmp_path)
    config = build_config({
        "job": job, "model": model, "task": task,
        "source": {"format": "delta", "path": str(tmp_path / "photos"), "id_column": "photo_id"},
        "sink": {"path": str(tmp_path / "out"), "mode": "overwrite_partition"},
        "run": {"progress": False, "ds": "2026-12-06"},
    })
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete and summary.rows_in == summary.rows_out == len(ids)
    job_rows = {r["photo_id"]: r for r in DeltaTable(str(tmp_path / "out")).to_pyarrow_table().to_pylist()}
    df = spark.createDataFrame([(i, bytearray(p) if p is not None else None) for i, p in zip(ids, photos)],
                               "photo_id string, photo binary")
    scored = {r["photo_id"]: r.asDict(recursive=True)
              for r in score(df, task, model=model, id_column="photo_id").collect()}
    assert set(job_rows) == set(scored) == set(ids)
    assert job_rows["p4"]["status"] == "invalid_image" and job_rows["p5"]["status"] == "skipped_null"
    return job_rows, scored
