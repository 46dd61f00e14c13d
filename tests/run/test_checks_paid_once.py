"""Every guarantee paid for once: the key checks from the scoring pass's tallies and the commits' own log
entries, the sweep only when a marker asks for it, a stream's micro-batches reading no more as its table grows;
and each cheap form shown to catch what it guards (a row swapped at the commit, a torn write's leftovers).

Spark jobs are counted by the tags every job of a run carries (:mod:`pipeline.spark.job_labels`), on the
suite's classic session.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.errors import JobError
from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import job_config, read_scores


def _stage_jobs(spark, job: str, run_id: str, stage: str) -> int:
    """Spark jobs run ``run_id`` started in ``stage`` (the job labels' tags, once the listener bus drained)."""
    from pipeline.spark.job_labels import describe_tag

    sc = spark.sparkContext._jsc.sc()
    sc.listenerBus().waitUntilEmpty()
    return len(sc.statusTracker().getJobIdsForTag(describe_tag(job, run_id, stage)))


def _stage_events(text: str) -> dict[str, dict]:
    return {e["stage"]: e for e in map(json.loads, text.splitlines()) if e.get("event") == "stage"}


def _with_poison(n: int, at: int) -> pa.Table:
    docs = make_documents(n)
    texts = docs["text"].to_pylist()
    texts[at] = "a POISON review"
    return docs.set_column(1, "text", pa.array(texts, pa.string()))


def test_the_key_tally_spark_computes_is_the_one_a_writer_computes(spark):
    """The scoring pass tallies keys in Spark, the deltalake writer in Python: the same keys, the same tally
    (string, integer and null ids); one key more, less or changed, another."""
    from pipeline.core.rows import KeyTally
    from pipeline.spark.checks import observe_input_tally

    ids, hashes = ["d1", None, "d3", "d3", "ä"], ["h1", "h2", "h3", "h3", "h5"]
    for arrow_ids, schema in ((pa.array(ids), "id string, content_hash string"),
                              (pa.array([1, None, 3, 3, 5]), "id long, content_hash string")):
        frame = spark.createDataFrame(list(zip(arrow_ids.to_pylist(), hashes)), schema)
        observed, tally = observe_input_tally(frame)
        observed.count()
        python = KeyTally.of_keys(arrow_ids, pa.array(hashes))
        assert tally.get() == python and python.rows == 5
        assert python != KeyTally.of_keys(arrow_ids.slice(1), pa.array(hashes[1:]))
        assert python != KeyTally.of_keys(arrow_ids, pa.array([*hashes[:4], "changed"]))


def test_a_clean_run_checks_keys_without_a_join_and_reads_back_from_its_log_entries(spark, tmp_path,
                                                                                  tiny_embed_model, writer):
    """No row lost or doubled: the tallies agree, so the input is read once (no join) and the read-back reads
    the two commits' log entries, no table (no Spark job of its own); every id is still there once."""
    write_delta(tmp_path / "docs", _with_poison(30, 7))
    config = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                        run={"run_id": "clean", "log_format": "json", "faults": {"poison_marker": "POISON"},
                             "max_error_fraction": 0.1})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (30, 29, 1)
    stages = _stage_events(out.getvalue())
    assert stages["inference and check"]["exact"] is False and stages["read-back"]["scanned"] is False, stages
    assert _stage_jobs(spark, "score_test", "clean", "read-back") == 0
    assert _stage_jobs(spark, "score_test", "clean", "summary") == 0
    assert sorted(read_scores(tmp_path)["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(30) if i != 7]
    assert summary.samples and all(s["status"] != "error" for s in summary.samples)


def test_a_commit_that_swaps_a_row_for_another_fails_the_read_back_by_key(spark, tmp_path, tiny_embed_model,
                                                                          writer):
    """The output commit leaves one row out and writes another twice (drill ``swap_row_at_commit``): as many
    rows as it was sent, so its log entry's row count agrees; its key tally does not (the deltalake writer's
    record, the connector's rows as handed to it), the read-back reads the table and names both ids."""
    write_delta(tmp_path / "docs", make_documents(12))
    config = job_config(tmp_path, tiny_embed_model, run={"run_id": "swapped", "log_format": "json",
                                                         "faults": {"swap_row_at_commit": ["d00004", "d00009"]}})
    out = io.StringIO()
    with pytest.raises(JobError, match=r"read back after the commit: .*1 input row\(s\) missing, 1 extra row\(s\).*"
                                       r"'d00004' \(in 1, written 0\), 'd00009' \(in 1, written 2\)"):
        run_job(config, spark=spark, out=out)
    assert _stage_events(out.getvalue())["read-back"]["scanned"] is True
    written = sorted(read_scores(tmp_path)["doc_id"].to_pylist())
    assert len(written) == 12 and "d00004" not in written and written.count("d00009") == 2


def _marker_facts(table: Path) -> list[dict]:
    """The finished markers of ``table``'s writes, oldest first."""
    folder = table / "_sbi_jobs"
    found = sorted(folder.glob("*.finished"), key=lambda p: p.stat().st_mtime)
    return [json.loads(p.read_text()) for p in found]


def test_a_commit_sweeps_only_when_a_marker_says_a_write_was_torn(spark, tmp_path):
    """A commit reads the table's log to sweep leftovers only when the markers ask: the second write (others
    finished, no sweep yet), a write after a torn one (its ``running`` marker left by a dead process); then
    not again. The torn write's file is swept; the writes between read no log entry."""
    from pyspark.sql import functions as F

    from pipeline.io.delta.markers import MARKER_DIR
    from pipeline.io.delta.sink import write_sink
    from tests.support.data import sink_config

    table = tmp_path / "t"
    sink = sink_config(path=str(table), mode="append", writer="deltalake", partition_by=[])

    def write(n: int) -> None:
        write_sink(spark.range(n * 10, n * 10 + 10).withColumn("v", F.lit(n)), sink, partition_values=None)

    for n in range(3):
        write(n)
    swept = [m.get("swept") or {} for m in _marker_facts(table)]
    assert [bool(s) for s in swept] == [False, True, False], swept
    assert swept[1]["log_entries"] >= 2, "the one sweep read the log"

    dead = "d" * 32
    leftover = table / f"part-00000-a0-{dead}-0123456789ab.snappy.parquet"
    leftover.write_bytes(b"PAR1 a torn write's file")
    marker = table / MARKER_DIR / f"{dead}.running"
    marker.write_text(json.dumps({"host": "gone", "pid": 1, "started": 0, "table_version": 2}))
    os.utime(marker, (time.time() - 3600, time.time() - 3600))  # silent for an hour: past the grace
    write(3)
    assert not leftover.exists(), "the torn write's file is swept"
    write(4)
    swept = [m.get("swept") or {} for m in _marker_facts(table)]
    assert swept[-2].get("why", "").startswith(f"write {dead} is running") and swept[-2]["files"] == 1, swept[-2]
    assert swept[-1] == {}, "nothing torn any more: the next commit reads no log entry"


def test_a_streams_micro_batches_read_nothing_more_as_its_table_grows(spark, tmp_path, tiny_embed_model):
    """Six arrivals, a micro-batch each: every micro-batch is read back from its own commit's log entry (no
    Spark job, however many versions the table has), the output's log is swept once (its second commit),
    and each micro-batch starts as many Spark jobs as the first."""
    from pipeline.spark.job_labels import run_tag

    for n in range(6):
        write_delta(tmp_path / "docs", make_documents(10 * (n + 1)).slice(10 * n), mode="append" if n else "overwrite")
    config = job_config(tmp_path, tiny_embed_model, source={"stream": {
        "checkpoint_path": str(tmp_path / "checkpoint"), "starting_version": 0, "max_files_per_trigger": 1}},
        run={"run_id": "stream"}, sink={"writer": "deltalake"})
    sc = spark.sparkContext._jsc.sc()
    jobs: list[int] = []

    class Lines(io.StringIO):
        def write(self, text: str) -> int:
            if re.search(r"\] micro-batch \d+: [\d,]+ rows in", text):
                sc.listenerBus().waitUntilEmpty()
                jobs.append(len(sc.statusTracker().getJobIdsForTag(run_tag("stream"))))
            return super().write(text)

    summary = run_job(config, spark=spark, out=Lines())
    assert summary.complete and summary.rows_out == 60 and summary.stream["micro_batches"] == 6
    assert sorted(read_scores(tmp_path)["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(60)]
    assert _stage_jobs(spark, "score_test", "stream", "read-back") == 0
    per_batch = [b - a for a, b in zip([0, *jobs], jobs)]
    assert len(per_batch) == 6 and len(set(per_batch[1:])) == 1 and per_batch[-1] <= per_batch[0], per_batch
    sweeps = [m["swept"] for m in _marker_facts(tmp_path / "scores") if m.get("swept")]
    assert len(sweeps) == 1, sweeps
