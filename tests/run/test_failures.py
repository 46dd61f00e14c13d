"""Lose nothing, duplicate nothing: injected task failures, worker deaths, poison rows, bad input, reruns."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline.models.loading import ModelError
from pipeline.runner import JobError, run_job

from tests.support.data import make_documents, write_delta
from tests.support.drivers import at_once
from tests.support.jobs import job_config, read_scores

ATTEMPT = re.compile(r"part-(\d{5})-a(\d+)-")


def _live_files(path: Path) -> list[str]:
    return [Path(p).name for p in DeltaTable(str(path)).file_uris()]


def _all_parquet(path: Path) -> list[str]:
    return [p.name for p in path.rglob("*.parquet")]


def _assert_exactly_once(tmp_path: Path, n: int) -> pa.Table:
    table = read_scores(tmp_path)
    ids = table["doc_id"].to_pylist()
    assert len(ids) == n and len(set(ids)) == n
    return table


INFER_FAILS = {"fail_infer_partitions": [0, 1]}


@pytest.mark.parametrize("kind,faults", [
    ("classic", INFER_FAILS),
    ("classic", {"fail_write_partitions": [0, 1]}),
    ("classic", {"kill_worker_partitions": [1]}),
    ("connect", INFER_FAILS),
], ids=["inference-fails", "write-fails", "worker-dies", "connect-inference-fails"])
@pytest.mark.drills  # the retry drills
def test_failed_attempts_are_retried_and_never_committed(request, monkeypatch, tmp_path, tiny_embed_model,
                                                         kind, faults):
    if kind == "connect":
        spark = request.getfixturevalue("spark_connect")
        monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    else:
        spark = request.getfixturevalue("spark")
    write_delta(tmp_path / "docs", make_documents(300))
    config = job_config(tmp_path, tiny_embed_model, source={"repartition": 3}, run={"faults": faults})
    failing = set(faults.get("fail_infer_partitions") or faults.get("fail_write_partitions")
                  or faults.get("kill_worker_partitions"))
    if kind == "classic":
        group = f"faults-{tmp_path.name}"
        spark.sparkContext.setJobGroup(group, "fault injection test")
        try:
            summary = run_job(config, spark=spark, out=io.StringIO())
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        tracker = spark.sparkContext.statusTracker()
        failed_tasks = sum(
            tracker.getStageInfo(stage).numFailedTasks
            for job in tracker.getJobIdsForGroup(group)
            for stage in tracker.getJobInfo(job).stageIds
            if tracker.getStageInfo(stage)
        )
        assert failed_tasks == len(failing), "each injected fault failed exactly one task attempt"
    else:
        summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete and summary.rows_out == 300
    table = _assert_exactly_once(tmp_path, 300)
    # counts come from the successful attempts only: a retried task is never counted twice
    assert sum(summary.status.values()) == 300 and sum(summary.rows_per_worker.values()) == 300
    assert summary.tokens == sum(table["n_tokens"].to_pylist())
    if "fail_write_partitions" not in faults:  # write faults retry after inference (the rows are cached)
        assert summary.retries.get("task_retries") == len(failing), summary.retries
    dt_ = DeltaTable(str(tmp_path / "scores"))
    assert dt_.version() == 0, "one job, one commit"
    live = _live_files(tmp_path / "scores")
    if "fail_write_partitions" in faults:
        attempts = {(int(m.group(1)), int(m.group(2))) for m in map(ATTEMPT.search, live)}
        assert not {(p, 0) for p in failing} & attempts, f"a failed attempt's file is referenced: {attempts}"
        assert {(p, 1) for p in failing} <= attempts, "the retried attempts wrote the data"
    # inference runs in the stage that fills the scored-rows cache; the write stage reads it
    assert sorted(_all_parquet(tmp_path / "scores")) == sorted(live), "files of failed attempts are deleted"


def test_poison_rows_go_to_quarantine_and_a_clean_rerun_clears_it(any_spark, tmp_path, tiny_embed_model, writer):
    spark = any_spark
    docs = make_documents(60)
    texts = docs["text"].to_pylist()
    texts[10], texts[42] = "a POISON review", "more POISON here"
    write_delta(tmp_path / "docs", docs.set_column(1, "text", pa.array(texts, pa.string())))
    config = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                        run={"faults": {"poison_marker": "POISON"}, "run_id": "poisoned"})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (60, 58, 2)
    assert summary.complete and summary.status["error"] == 2
    assert "quarantine" in out.getvalue()
    table = _assert_exactly_once(tmp_path, 58)
    assert "error" not in table["status"].to_pylist()

    quarantine = pa.table(DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table())
    rows = {r["doc_id"]: r for r in quarantine.to_pylist()}
    assert set(rows) == {"d00010", "d00042"}
    assert rows["d00010"]["input_text"] == "a POISON review"
    assert "injected poison row" in rows["d00010"]["error"] and rows["d00010"]["run_id"] == "poisoned"
    # the output and the quarantine partition the input exactly
    assert set(table["doc_id"].to_pylist()) | set(rows) == set(docs["doc_id"].to_pylist())

    # the poison is fixed upstream; rerunning the day replaces both tables' partitions
    clean = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"}, run={"run_id": "clean"})
    write_delta(tmp_path / "docs", make_documents(60), mode="overwrite")
    summary = run_job(clean, spark=spark, out=io.StringIO())
    assert (summary.rows_out, summary.rows_quarantined) == (60, 0)
    _assert_exactly_once(tmp_path, 60)
    assert DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table().num_rows == 0


def test_bad_text_rows_are_flagged_never_dropped(spark, tmp_path, tiny_embed_model):
    texts = [
        None, "", "   \n\t ", "good " * 200_000, "control \x00\x01\x07\x1b chars good", "emoji 😀🎬👍 great",
        "mixed scripts: good Привет 日本語 مرحبا", "\u200b\u200b", "a" * 5000, "ok movie",
        "x" * 200_000, "\x00" * 50, "\ufffd" * 40,  # one [UNK]; nothing; invalid bytes decoded leniently
    ]
    ids = [f"b{i}" for i in range(len(texts))]
    write_delta(tmp_path / "docs", pa.table({"doc_id": ids, "text": pa.array(texts, pa.string()),
                                             "source": ["bad"] * len(ids)}))
    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model), spark=spark, out=out)
    assert summary.complete and summary.rows_out == len(texts) and summary.rows_quarantined == 0
    rows = {r["doc_id"]: r for r in read_scores(tmp_path).to_pylist()}
    status = {i: r["status"] for i, r in rows.items()}
    assert status["b0"] == "skipped_null" and status["b1"] == "skipped_empty" and status["b2"] == "skipped_empty"
    assert status["b3"] == "truncated"
    assert {status[f"b{i}"] for i in (4, 5, 6, 9)} == {"ok"}
    # zero-width spaces (not whitespace to Python), a 5,000- and a 200,000-char "word" (one [UNK] each),
    # NULs, U+FFFD only: not scored
    assert {status[f"b{i}"] for i in (7, 8, 10, 11, 12)} == {"skipped_no_content"}
    assert all(rows[f"b{i}"]["embedding"] is None for i in (7, 8, 10, 11, 12))
    assert summary.status == {"ok": 4, "truncated": 1, "skipped_null": 1, "skipped_empty": 2, "skipped_no_content": 5}
    assert "skipped_no_content=5" in out.getvalue()


MALFORMED_LINES = ['{"doc_id": "j2", "text": "a truncated re', "not json at all", "[1, 2]"]


def test_malformed_json_lines_are_quarantined_with_their_raw_text(spark, tmp_path, tiny_embed_model):
    import hashlib

    lines = ['{"doc_id": "j1", "text": "good movie", "source": "log"}', MALFORMED_LINES[0],
             '{"doc_id": "j3", "text": "great story", "source": "log"}', MALFORMED_LINES[1], "",
             '{"doc_id": "j5", "text": null, "source": "log"}', MALFORMED_LINES[2]]
    (tmp_path / "logs.jsonl").write_text("\n".join(lines) + "\n")
    # unique_ids: the malformed lines (no id) do not trip the id check
    # malformed lines count against the error budget (3 of 6 rows): at the limit the run commits
    config = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                        source={"format": "json", "path": str(tmp_path / "logs.jsonl"), "unique_ids": True},
                        run={"max_error_fraction": 0.5})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    # the blank line is no row (Spark skips it); every other line is in exactly one table
    assert (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (6, 3, 3) and summary.complete
    assert summary.status == {"ok": 2, "skipped_null": 1, "malformed": 3}
    output = {r["doc_id"]: r for r in read_scores(tmp_path).to_pylist()}
    assert set(output) == {"j1", "j3", "j5"} and output["j5"]["status"] == "skipped_null"
    quarantine = DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table().to_pylist()
    assert sorted(r["input_text"] for r in quarantine) == sorted(MALFORMED_LINES)
    for row in quarantine:
        assert row["status"] == "malformed" and row["doc_id"] is None and "could not parse it as JSON" in row["error"]
        assert row["content_hash"] == hashlib.sha256(row["input_text"].encode()).hexdigest()
    assert "malformed input         : 3 source line(s) could not be parsed" in out.getvalue()
    assert "malformed=3" in out.getvalue()


def test_duplicate_or_null_ids_fail_before_any_work(spark, tmp_path, tiny_embed_model):
    docs = make_documents(10)
    ids = docs["doc_id"].to_pylist()
    ids[3] = ids[4]
    write_delta(tmp_path / "docs", docs.set_column(0, "doc_id", pa.array(ids)))
    config = job_config(tmp_path, tiny_embed_model, source={"unique_ids": True})
    with pytest.raises(JobError, match=r"null or duplicate ids \('d00004' x2\)"):
        run_job(config, spark=spark, out=io.StringIO())
    assert not (tmp_path / "scores").exists()


def test_corrupt_weights_fail_before_any_work(spark, tmp_path, tiny_embed_model):
    model = tmp_path / "corrupt"
    shutil.copytree(tiny_embed_model, model)
    (model / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    write_delta(tmp_path / "docs", make_documents(5))
    with pytest.raises(ModelError, match="unreadable .* copy the model folder again"):
        run_job(job_config(tmp_path, model), spark=spark, out=io.StringIO())
    assert not (tmp_path / "scores").exists()


def test_incremental_scores_only_new_and_changed_rows(any_spark, tmp_path, tiny_embed_model, writer):
    spark = any_spark
    write_delta(tmp_path / "docs", make_documents(40))
    base = dict(sink={"mode": "overwrite_partition"})
    assert run_job(job_config(tmp_path, tiny_embed_model, **base), spark=spark, out=io.StringIO()).rows_out == 40

    docs = make_documents(45)  # 5 new rows
    texts = docs["text"].to_pylist()
    texts[0] = texts[5] = "changed text, very good"  # 2 changed rows
    write_delta(tmp_path / "docs", docs.set_column(1, "text", pa.array(texts, pa.string())), mode="overwrite")
    inc = job_config(tmp_path, tiny_embed_model, run={"incremental": True}, **base)
    summary = run_job(inc, spark=spark, out=io.StringIO())
    assert (summary.rows_in, summary.rows_out) == (7, 7)
    table = read_scores(tmp_path)
    assert table.num_rows == 47  # 40 + 5 new + 2 rescored (the old versions stay, with their hash)
    latest = {r["doc_id"]: r for r in table.to_pylist() if r["run_id"] == summary.run_id}
    assert set(latest) == {"d00000", "d00005", *(f"d{i:05d}" for i in range(40, 45))}

    # nothing changed: nothing to score, nothing duplicated
    again = run_job(inc, spark=spark, out=io.StringIO())
    assert (again.rows_in, again.rows_out) == (0, 0)
    assert read_scores(tmp_path).num_rows == 47


def test_null_ids_and_a_poison_row_are_quarantined_once_not_every_incremental_night(spark, tmp_path,
                                                                                    tiny_embed_model, writer):
    """Rows without an id are `invalid_id` (quarantined with their content, never in the output: they grew it
    from 40 to 46 rows in three nights); a known-bad row is skipped, not failing each night's error budget."""
    docs = make_documents(40)
    ids, texts = docs["doc_id"].to_pylist(), docs["text"].to_pylist()
    ids[7] = ids[8] = None
    texts[20] = "a POISON review that fails every time"
    write_delta(tmp_path / "docs", docs.set_column(0, "doc_id", pa.array(ids, pa.string()))
                .set_column(1, "text", pa.array(texts, pa.string())))

    def night(n: int, **run) -> object:
        config = job_config(tmp_path, tiny_embed_model, source={"unique_ids": False},
                            run={"incremental": True, "run_id": f"night-{n}", "ds": f"2026-11-2{n + 1}",
                                 "faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1, **run})
        return run_job(config, spark=spark, out=io.StringIO())

    first = night(0)
    assert (first.rows_in, first.rows_out, first.rows_quarantined) == (40, 37, 3) and first.complete
    assert (first.status["invalid_id"], first.status["error"]) == (2, 1)
    table = read_scores(tmp_path)
    assert table.num_rows == 37 and table["doc_id"].null_count == 0
    quarantine = pa.table(DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table()).to_pylist()
    invalid = [r for r in quarantine if r["status"] == "invalid_id"]
    assert len(quarantine) == 3 and len(invalid) == 2
    assert {r["input_text"] for r in invalid} == {texts[7], texts[8]} and all(r["doc_id"] is None for r in invalid)
    assert "source column 'doc_id' is null" in invalid[0]["error"]

    # two new rows arrive; the three known-bad rows are skipped and counted, the budget sees the new rows only
    more = make_documents(42).slice(40)
    write_delta(tmp_path / "docs", more, mode="append")
    second = night(1)
    assert (second.rows_in, second.rows_out, second.rows_quarantined) == (2, 2, 0)
    assert second.details["known-bad rows skipped"].startswith("3 (quarantined earlier")
    assert read_scores(tmp_path).num_rows == 39
    assert pa.table(DeltaTable(str(tmp_path / "scores_quarantine")).to_pyarrow_table()).num_rows == 3

    # asked to retry them, they are scored again (and fail the budget again: nothing is committed)
    with pytest.raises(JobError, match="3 of 3 rows failed"):
        night(2, retry_quarantined=True)
    assert read_scores(tmp_path).num_rows == 39


@pytest.mark.drills  # a race: writers at a barrier
def test_concurrent_overwrites_of_one_partition_never_mix(spark, tmp_path):
    import datetime as dt

    from pyspark.sql import functions as F

    from pipeline.config import SinkConfig
    from pipeline.errors import SinkError
    from pipeline.io.delta.sink import write_sink

    path = tmp_path / "scores"
    day = dt.date(2026, 11, 29)
    sink = SinkConfig(path=str(path), mode="overwrite_partition", partition_by=["ds"])
    seed = spark.range(5).withColumn("writer", F.lit("seed")).withColumn("ds", F.lit(day))
    write_sink(seed, sink, partition_values={"ds": day})

    def write(name: str, n: int) -> object:
        df = spark.range(n).withColumn("writer", F.lit(name)).withColumn("ds", F.lit(day)).repartition(4)
        return write_sink(df, sink, partition_values={"ds": day})

    outcomes = at_once({"a": lambda: write("a", 100), "b": lambda: write("b", 70)}, expected=(SinkError,))
    table = pa.table(DeltaTable(str(path)).to_pyarrow_table())
    writers = set(table["writer"].to_pylist())
    assert len(writers) == 1, f"mixed result from {writers}"
    winner = writers.pop()
    assert table.num_rows == {"a": 100, "b": 70}[winner]
    assert sorted(table["id"].to_pylist()) == list(range(table.num_rows))
    # the winner's write succeeded; the other either committed first and was replaced, or failed clearly
    assert not isinstance(outcomes[winner], SinkError)
    for exc in (o for o in outcomes.values() if isinstance(o, SinkError)):
        assert "conflict" in str(exc).lower() or "concurrent" in str(exc).lower(), exc
    # no stray files: each Parquet file on disk is one some version adds (the seed's stay for time travel)
    logged = {Path(json.loads(line)["add"]["path"]).name for commit in (path / "_delta_log").glob("*.json")
              for line in commit.read_text().splitlines() if line.strip() and "add" in json.loads(line)}
    assert sorted(_all_parquet(path)) == sorted(logged)
