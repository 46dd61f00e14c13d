"""What the ``score(df)`` tests compare against: ``run_job`` on the same rows, read back from its two tables.

The input is the suite's documents (:func:`tests.support.data.make_documents`: a null and a blank text) with
one null id, written as the job's Delta source and as Parquet for the caller's own read. ``run_job`` writes
the output and the quarantine (the null id goes there, ``invalid_id``); :func:`run_job_rows` reads both back
by id, and :func:`assert_same_as_run_job` compares a ``score(df)`` result with them value by value.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pipeline.core.rows import QUARANTINED_STATUSES
from pipeline.runner import run_job
from tests.support.data import make_documents, write_delta
from tests.support.jobs import job_config

__all__ = ["EMBED", "NULL_ID_ROW", "SCORE_SETTINGS", "assert_same_as_run_job", "assert_same_value", "documents",
           "run_job_rows", "untouchable_frame", "user_write"]

NULL_ID_ROW = 5
# score(df)'s arguments for the test job's task, model and batching (tests/support/jobs.job_config)
EMBED = {"task": "embed", "labels": {"pos": "good great", "neg": "bad awful"}}
SCORE_SETTINGS = {"batching": {"batch_size": 16, "max_length": 256}}
# the run's own columns and what score(df) leaves to the caller: not compared
RUN_ONLY = {"run_id", "scored_at", "ds", "content_hash"}
LINEAGE_AND_STATUS = ("status", "error", "model_name", "model_revision", "task_fingerprint")
# Floats (embeddings, scores) agree to this, not to the bit: run_job deals the rows to its tasks by length, while
# score(df) keeps the DataFrame's partitions, so a row meets other rows in its batch. Padding is masked, but the
# batch's shape changes how the matrix products sum: a few float32 ulps (3.7e-9 at most on the suite's rows).
ATOL = 1e-6


def documents(tmp_path: Path, n: int = 40) -> Path:
    """The test documents with a null id in row :data:`NULL_ID_ROW`: ``tmp_path/docs`` (Delta, the job's
    source) and ``tmp_path/docs.parquet`` (the caller's read); returns the Parquet path."""
    table = make_documents(n)
    ids = table["doc_id"].to_pylist()
    ids[NULL_ID_ROW] = None
    table = table.set_column(0, "doc_id", pa.array(ids, pa.string()))
    write_delta(tmp_path / "docs", table)
    pq.write_table(table, tmp_path / "docs.parquet")
    return tmp_path / "docs.parquet"


def run_job_rows(spark: Any, tmp_path: Path, model_dir: Path | str, *, model_name: str | None = None,
                 **sections: Any) -> dict[Any, dict[str, Any]]:
    """``run_job`` over ``tmp_path/docs`` (the test job, ``sections`` over it; ``model_name``: the lineage name
    instead of ``tiny-bert``): every row it wrote, output and quarantine, by id (the null id under None)."""
    config = job_config(tmp_path, model_dir, **sections)
    if model_name:
        config = config.model_copy(update={"model": config.model.model_copy(update={"name": model_name})})
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete, summary
    rows = DeltaTable(str(tmp_path / "scores")).to_pyarrow_table().to_pylist()
    rows += DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table().to_pylist()
    by_id = {r["doc_id"]: r for r in rows}
    assert len(by_id) == len(rows), "run_job wrote an id twice"
    return by_id


def untouchable_frame(spark: Any, marker: Path) -> Any:
    """Three rows (``doc_id``, ``text``, ``n``, ``status_note``) that touch ``marker`` whenever a Spark job
    computes them, whatever columns the job reads: the rows pass a Python filter, which no plan prunes (a
    column function on ``text`` would not run for a ``count()``, which reads no column)."""
    from pyspark.sql import functions as F

    path = str(marker)

    @F.udf("boolean")
    def computed(n):  # noqa: ANN001 - hints would make pyspark guess another UDF kind
        import pathlib

        pathlib.Path(path).touch()
        return True

    return spark.range(3).where(computed("id")).select(
        F.col("id").cast("string").alias("doc_id"), F.concat(F.lit("text "), F.col("id").cast("string")).alias("text"),
        F.col("id").cast("int").alias("n"), F.lit("x").alias("status_note"))


def user_write(scored: Any, path: Path, writer: str) -> pa.Table:
    """The caller's own write of ``scored`` to Delta (``writer``: ``delta``, the connector's ``save``; else the
    deltalake library over ``toArrow()``), read back."""
    if writer == "delta":
        scored.write.format("delta").mode("append").save(str(path))
    else:
        from deltalake import write_deltalake

        write_deltalake(str(path), scored.toArrow(), mode="append")
    return DeltaTable(str(path)).to_pyarrow_table()


def _pairs(value: Any) -> bool:
    """A map read back by deltalake or pyarrow: a list of (key, value) pairs."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], tuple)


def assert_same_value(ours: Any, theirs: Any, where: str) -> None:
    """Two values equal: floats (embeddings, scores) to :data:`ATOL`, maps as dicts, the rest exactly."""
    _same(ours, theirs, where)


def _same(ours: Any, theirs: Any, where: str) -> None:
    ours, theirs = (dict(v) if _pairs(v) else v for v in (ours, theirs))
    if isinstance(theirs, dict) or isinstance(ours, dict):
        assert ours is not None and theirs is not None and sorted(ours) == sorted(theirs), where
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}[{key}]")
    elif isinstance(theirs, list) and not all(isinstance(v, (int, float)) for v in theirs):  # lists of structs
        assert isinstance(ours, list) and len(ours) == len(theirs), f"{where}: {ours!r} != {theirs!r}"
        for n, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{n}]")
    elif isinstance(theirs, (list, float)):
        np.testing.assert_allclose(np.asarray(ours, dtype=np.float32), np.asarray(theirs, dtype=np.float32),
                                   rtol=0, atol=ATOL, err_msg=where)
    else:
        assert ours == theirs, f"{where}: {ours!r} != {theirs!r}"


def assert_same_as_run_job(rows: Iterable[dict[str, Any]], reference: dict[Any, dict[str, Any]], *,
                           id_column: str = "doc_id", skip_null_id: bool = False) -> int:
    """Every row of a ``score(df)`` result has ``run_job``'s status, error and lineage for its id and, where
    ``run_job`` wrote it to the output, the same value in every column both have. Returns the rows compared."""
    rows = [r.asDict(recursive=True) if hasattr(r, "asDict") else r for r in rows]
    expected = {k: v for k, v in reference.items() if not (skip_null_id and k is None)}
    got = [r for r in rows if not (skip_null_id and r[id_column] is None)]
    assert sorted(map(str, (r[id_column] for r in got))) == sorted(map(str, expected))
    for row in got:
        ref = expected[row[id_column]]
        for key in LINEAGE_AND_STATUS:
            _same(row[key], ref[key], f"{row[id_column]}.{key}")
        if ref["status"] in QUARANTINED_STATUSES:
            continue
        shared = (set(row) & set(ref)) - RUN_ONLY
        assert {"n_tokens", "truncated"} <= shared, shared
        for key in sorted(shared):
            _same(row[key], ref[key], f"{row[id_column]}.{key}")
    return len(got)
