"""Tables shaped as Databricks makes them by default (deletion vectors, column mapping) are read right.

The deltalake-backed reader cannot honour those features (a row deleted through a deletion vector would come
back), so a job whose source uses them must read it through the Delta connector: a small job, which would build
a jar-free light session, leaves such a source to the connector's session instead of refusing it.
"""

from __future__ import annotations

import io

import pytest
from deltalake import DeltaTable

from pipeline.config import build_config
from pipeline.runner import run_job
from pipeline.stages.small_jobs import small_job
from tests.support.data import make_documents

pytestmark = pytest.mark.connector


def _databricks_shaped_table(spark, path: str, rows: int) -> None:
    """A table as a Databricks runtime creates it: deletion vectors and column mapping on, a row deleted."""
    spark.sql(f"CREATE TABLE delta.`{path}` (doc_id STRING, text STRING, source STRING) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', 'delta.columnMapping.mode' = 'name', "
              "'delta.minReaderVersion' = '3', 'delta.minWriterVersion' = '7')")
    spark.createDataFrame(make_documents(rows, with_bad_rows=False).to_pandas()).write.format("delta") \
        .mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE doc_id = 'd00003'")


def test_a_source_with_deletion_vectors_and_column_mapping_is_read_through_the_connector(spark, tmp_path,
                                                                                          tiny_embed_model):
    source = str(tmp_path / "docs")
    _databricks_shaped_table(spark, source, 12)
    protocol = DeltaTable(source).protocol()
    assert "deletionVectors" in (protocol.reader_features or []), protocol
    config = build_config({
        "job": "dbx_shaped", "source": {"format": "delta", "path": source, "id_column": "doc_id", "limit": 100},
        "model": {"path": str(tiny_embed_model)}, "task": {"kind": "embed"},
        "sink": {"path": str(tmp_path / "scores"), "writer": "deltalake"},
        "spark": {"master": "local[2]"}, "run": {"progress": False, "ds": "2026-12-01"},
    })
    decided = small_job(config, environ={}, active_session=False)
    assert not decided and decided.why == ("the source uses columnMapping, deletionVectors, which only the Delta "
                                           "connector reads")
    summary = run_job(config, spark=spark, out=io.StringIO())
    out = DeltaTable(str(tmp_path / "scores")).to_pyarrow_table()
    ids = sorted(out["doc_id"].to_pylist())
    assert summary.rows_in == 11 and ids == sorted(f"d{i:05d}" for i in range(12) if i != 3)
