"""``score(df)`` on a streaming DataFrame (a file source), into the caller's own ``writeStream``.

The same rows, statuses and values as ``run_job``: to Parquet, and to Delta (jar-free: ``foreachBatch`` with
the deltalake library; the connector run: the connector's streaming sink).
"""

from __future__ import annotations

import pyarrow.parquet as pq
from deltalake import DeltaTable

from pipeline import score
from tests.support.scoring import EMBED, SCORE_SETTINGS, assert_same_as_run_job, documents, run_job_rows


def _delta_writer(path: str):
    """The caller's micro-batch write to Delta with the deltalake library (pickled by value for Connect)."""

    def write(batch, batch_id):
        from deltalake import write_deltalake

        write_deltalake(path, batch.toArrow(), mode="append")

    return write


def test_a_streaming_dataframe_scored_into_the_callers_sinks(any_spark, tmp_path, tiny_embed_model, writer):
    parquet = documents(tmp_path)
    reference = run_job_rows(any_spark, tmp_path, tiny_embed_model)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    table = pq.read_table(parquet)
    for n, start in enumerate(range(0, table.num_rows, 15)):  # the rows arrive as three files
        pq.write_table(table.slice(start, 15), incoming / f"part-{n}.parquet")

    stream = any_spark.readStream.schema(any_spark.read.parquet(str(parquet)).schema).parquet(str(incoming))
    settings = {**EMBED, **SCORE_SETTINGS}
    scored = score(stream, settings.pop("task"), model={"path": str(tiny_embed_model), "name": "tiny-bert"},
                   id_column="doc_id", **settings)
    assert scored.isStreaming

    to_parquet = (scored.writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck_parquet"))
                  .trigger(availableNow=True).start(str(tmp_path / "user_parquet")))
    to_parquet.awaitTermination()
    assert assert_same_as_run_job(pq.read_table(tmp_path / "user_parquet").to_pylist(), reference) == 40

    delta = str(tmp_path / "user_delta")
    sink = scored.writeStream.option("checkpointLocation", str(tmp_path / "ck_delta")).trigger(availableNow=True)
    if writer == "delta":
        query = sink.format("delta").start(delta)
    else:
        query = sink.foreachBatch(_delta_writer(delta)).start()
    query.awaitTermination()
    rows = DeltaTable(delta).to_pyarrow_table().to_pylist()
    assert assert_same_as_run_job(rows, reference) == 40
