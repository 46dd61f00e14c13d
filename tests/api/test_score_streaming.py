"""``score(df)`` on a streaming DataFrame (a file source), into the caller's own ``writeStream``.

The same rows, statuses and values as ``run_job``: to Parquet, and to Delta (jar-free: ``foreachBatch`` with
the deltalake library; the connector run: the connector's streaming sink).
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pipeline import score
from tests.support.load_log import loads_by_worker
from tests.support.scoring import EMBED, SCORE_SETTINGS, assert_same_as_run_job, documents


def _delta_writer(path: str):
    """The caller's micro-batch write to Delta with the deltalake library (pickled by value for Connect)."""

    def write(batch, batch_id):
        from deltalake import write_deltalake

        write_deltalake(path, batch.toArrow(), mode="append")

    return write


def test_a_streaming_dataframe_scored_into_the_callers_sinks(embed_reference, any_spark, tmp_path,
                                                             tiny_embed_model, writer):
    parquet, reference = embed_reference
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


@pytest.fixture
def load_log_kind():
    from pipeline.registry import unregister_task
    from tests.support import load_log

    load_log.register()
    yield load_log.KIND
    unregister_task(load_log.KIND)  # a test kind: never part of the docs' config reference


def test_the_model_stays_loaded_in_the_workers_between_micro_batches(spark, tmp_path, tiny_embed_model,
                                                                     load_log_kind):
    """Three micro-batches of one task each on local[2]: each Python worker loads the model once, for the query's
    life, and some worker scores more than one micro-batch with it."""
    incoming, log = tmp_path / "incoming", tmp_path / "loads"
    incoming.mkdir()
    log.mkdir()
    table = pq.read_table(documents(tmp_path, n=24))
    for n in range(3):
        pq.write_table(table.slice(8 * n, 8), incoming / f"part-{n}.parquet")
    stream = spark.readStream.schema(spark.read.parquet(str(incoming)).schema).option("maxFilesPerTrigger", 1) \
        .parquet(str(incoming))
    scored = score(stream, load_log_kind, model=str(tiny_embed_model), id_column="doc_id", load_log=str(log),
                   **SCORE_SETTINGS)
    query = scored.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(availableNow=True).start()
    query.awaitTermination()
    micro_batches = [p for p in query.recentProgress if p.numInputRows]
    assert len(micro_batches) == 3 and sum(p.numInputRows for p in micro_batches) == 24
    loads = loads_by_worker(log)
    assert loads and set(loads.values()) == {1}, f"a worker loaded the model again: {loads}"
    assert len(loads) < len(micro_batches), f"every micro-batch had a worker of its own: {loads}"
