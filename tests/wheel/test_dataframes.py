"""``score(df)`` and the SQL function from the installed wheel: batch and streaming DataFrames, classic and Connect.

The same rows, statuses and values as ``run_job`` on this line, and the same embeddings as on every other line of
the run: each line writes its ``score(df)`` and SQL function rows to the shared folder
(``$SBI_WHEEL_SHARED/embeddings``, on the same tiny model's weights) and compares its own with those written before
it, to float32 tolerance. On Spark 4.0
these go through the pandas column function, from 4.1 through the Arrow one (``pipeline.spark.column_udf``).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import register_function, score
from pipeline.core.compat import installed_pyspark
from tests.support.scoring import EMBED, SCORE_SETTINGS, assert_same_as_run_job, documents, run_job_rows

pytestmark = pytest.mark.wheel

ATOL = 1e-5  # float32 tolerance: other builds of the same torch may sum a matrix product in another order
STATUSES = sorted(["ok"] * 37 + ["skipped_null", "skipped_empty", "invalid_id"])


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory, tiny_embed_model):
    """``(parquet of the documents, run_job's rows by id)``: the job run once on the classic jar-free session."""
    folder = tmp_path_factory.mktemp("reference")
    parquet = documents(folder)
    return parquet, run_job_rows(spark, folder, tiny_embed_model)


def _score(df, model: Path, **kwargs):
    settings = {**EMBED, **SCORE_SETTINGS, **kwargs}
    return score(df, settings.pop("task"), model={"path": str(model), "name": "tiny-bert"}, **settings)


def _rows_by_id(rows) -> dict[str, dict]:
    return {str(r["doc_id"]): r.asDict(recursive=True) if hasattr(r, "asDict") else r for r in rows}


def _compare_with_other_lines(shared: Path, rows: dict[str, dict], what: str = "score") -> list[str]:
    """Write this line's rows of ``what`` (``score``, ``sql``), then compare them with every line's before it;
    returns the lines compared."""
    folder = shared / "embeddings" / what
    folder.mkdir(parents=True, exist_ok=True)
    tag = f"pyspark-{installed_pyspark()}-py{platform.python_version()}"
    mine = {k: {"status": r["status"], "model_revision": r["model_revision"], "embedding": r["embedding"]}
            for k, r in rows.items()}
    compared = []
    for path in sorted(folder.glob("*.json")):
        if path.stem == tag:
            continue
        theirs = json.loads(path.read_text())
        assert sorted(theirs) == sorted(mine), f"the same rows as {path.stem}"
        for key, row in mine.items():
            other = theirs[key]
            assert (row["status"], row["model_revision"]) == (other["status"], other["model_revision"]), \
                f"{key}: {path.stem} differs"
            if row["embedding"] is None or other["embedding"] is None:
                assert row["embedding"] is other["embedding"] is None, f"{key}: {path.stem} differs"
                continue
            np.testing.assert_allclose(np.float32(row["embedding"]), np.float32(other["embedding"]), rtol=0,
                                       atol=ATOL, err_msg=f"{key}: the embedding of {path.stem}")
        compared.append(path.stem)
    partial = folder / f".{tag}.json.part"  # renamed whole: a line beside this one never reads half a file
    partial.write_text(json.dumps(mine))
    partial.replace(folder / f"{tag}.json")
    return compared


@pytest.mark.entry("score")
def test_score_gives_run_jobs_rows_and_every_lines_embeddings(spark, reference, tiny_embed_model, shared):
    parquet, reference = reference
    docs = spark.read.parquet(str(parquet)).repartition(3)
    scored = _score(docs, tiny_embed_model, id_column="doc_id")
    rows = scored.collect()
    assert assert_same_as_run_job(rows, reference) == 40
    assert sorted(r["status"] for r in rows) == STATUSES
    compared = _compare_with_other_lines(shared, _rows_by_id(rows))
    print(f"score(df) embeddings compared with: {compared or 'no line before this one'}")


@pytest.mark.entry("score")
def test_a_streaming_dataframe_scored_into_a_parquet_sink(spark, reference, tmp_path, tiny_embed_model):
    parquet, reference = reference
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    table = pq.read_table(parquet)
    for n, start in enumerate(range(0, table.num_rows, 15)):  # the rows arrive as three files
        pq.write_table(table.slice(start, 15), incoming / f"part-{n}.parquet")
    stream = spark.readStream.schema(spark.read.parquet(str(parquet)).schema).parquet(str(incoming))
    scored = _score(stream, tiny_embed_model, id_column="doc_id")
    assert scored.isStreaming
    (scored.writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
     .trigger(availableNow=True).start(str(tmp_path / "out")).awaitTermination())
    assert assert_same_as_run_job(pq.read_table(tmp_path / "out").to_pylist(), reference) == 40


@pytest.mark.entry("register_function")
def test_the_sql_function_gives_run_jobs_rows_and_every_lines_embeddings(spark, reference, tiny_embed_model, shared):
    parquet, reference = reference
    spark.read.parquet(str(parquet)).createOrReplaceTempView("wheel_docs")
    settings = {k: v for k, v in EMBED.items() if k != "task"}
    register_function(spark, "wheel_embed", "embed", model={"path": str(tiny_embed_model), "name": "tiny-bert"},
                      **SCORE_SETTINGS, **settings)
    rows = spark.sql("SELECT doc_id, source, r.* FROM (SELECT doc_id, source, wheel_embed(text) AS r "
                     "FROM wheel_docs)").collect()
    # no id in a SQL call: the row run_job quarantines for its null id is scored
    assert assert_same_as_run_job(rows, reference, skip_null_id=True) == 39
    assert [r["status"] for r in rows if r["doc_id"] is None] == ["ok"]
    compared = _compare_with_other_lines(shared, _rows_by_id(rows), "sql")
    print(f"SQL function embeddings compared with: {compared or 'no line before this one'}")


@pytest.mark.entry("score", "register_function")
def test_score_and_the_sql_function_on_spark_connect(on_connect, reference, tiny_embed_model):
    parquet, reference = reference
    docs = on_connect.read.parquet(str(parquet))
    rows = _score(docs, tiny_embed_model, id_column="doc_id").collect()
    assert assert_same_as_run_job(rows, reference) == 40
    assert sorted(r["status"] for r in rows) == STATUSES
    docs.createOrReplaceTempView("connect_docs")
    settings = {k: v for k, v in EMBED.items() if k != "task"}
    register_function(on_connect, "connect_embed", "embed", model={"path": str(tiny_embed_model), "name": "tiny-bert"},
                      **SCORE_SETTINGS, **settings)
    sql = on_connect.sql("SELECT doc_id, source, r.* FROM (SELECT doc_id, source, connect_embed(text) AS r "
                         "FROM connect_docs)").collect()
    assert assert_same_as_run_job(sql, reference, skip_null_id=True) == 39
