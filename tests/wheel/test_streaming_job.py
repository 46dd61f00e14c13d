"""A streaming job with read limits from the installed wheel: ``run_job`` over a Delta table read as a stream.

On the classic jar-free session, so through the jar-free Delta stream reader on every line: Spark 4.2 and later
hand it the read limit; on 4.0 and 4.1 it keeps the micro-batch's start and applies the limit itself, and the
available-now run goes on micro-batch by micro-batch to the version the table had when it started
(``pipeline.io.streams.OpenStream``). Either way: one micro-batch per commit, each row once, then it stops; the
next run reads on from the checkpoint.
"""

from __future__ import annotations

import pytest
from deltalake import write_deltalake

from pipeline import run_job
from pipeline.config import build_config
from tests.support.data import make_documents
from tests.wheel.jobs import embed_job, read, read_if_any

pytestmark = pytest.mark.wheel


def _each_once(tmp_path, n: int) -> None:
    ids = [r["doc_id"] for r in read(tmp_path / "scores").to_pylist() + read_if_any(tmp_path / "scores_quarantine")]
    assert sorted(ids) == [f"d{i:05d}" for i in range(n)], "each id once, output or quarantine"


@pytest.mark.entry("run_job")
def test_an_available_now_stream_reads_one_commit_per_micro_batch(spark, tmp_path, tiny_embed_model):
    docs = make_documents(24, with_bad_rows=False)
    data = embed_job(tmp_path, tiny_embed_model, writer="deltalake", rows=None,
                     source={"stream": {"checkpoint_path": str(tmp_path / "chk"), "starting_version": 0,
                                        "max_files_per_trigger": 1}})
    for n, start in enumerate((0, 8, 14)):
        write_deltalake(str(tmp_path / "docs"), docs.slice(start, 8 if n == 0 else 6), mode="append")
    config = build_config(data)
    first = run_job(config, spark=spark)
    assert (first.rows_in, first.stream["micro_batches"], first.stream["batch_ids"]) == (20, 3, [0, 2]), \
        "the limit of one file: the three commits in three micro-batches, then the run stopped"
    _each_once(tmp_path, 20)

    write_deltalake(str(tmp_path / "docs"), docs.slice(20), mode="append")
    second = run_job(config, spark=spark)
    assert (second.rows_in, second.stream["batch_ids"]) == (4, [3, 3]), "read on from the checkpoint"
    third = run_job(config, spark=spark)
    assert (third.rows_in, third.stream["micro_batches"]) == (0, 0)
    _each_once(tmp_path, 24)
