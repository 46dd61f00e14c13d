"""The runner's guarantees, checked and not counted: identity-level completeness, the error budget,
quarantine rows one per failed row, quarantine committed before the output, the read back at this run's version."""

from __future__ import annotations

import datetime as dt
import io
import re
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline.errors import InjectedFaultError, JobError
from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import D1, job_config, read_scores


def _table(path) -> pa.Table:
    return pa.table(DeltaTable(str(path)).to_pyarrow_table())


def _with_texts(docs: pa.Table, changes: dict[int, str]) -> pa.Table:
    texts = docs["text"].to_pylist()
    for i, text in changes.items():
        texts[i] = text
    return docs.set_column(1, "text", pa.array(texts, pa.string()))


# ---------------------------------------------------------------- the checks themselves


def test_identity_check_names_lost_and_duplicated_keys_null_safe(spark):
    from pipeline.spark.checks import identity_check, key_counts

    schema = "id string, content_hash string, status string"
    inputs = spark.createDataFrame([("a", "h1", None), ("b", "h2", None), (None, "h3", None), (None, "h3", None),
                                    ("c", "h4", None)], schema)
    # a is lost, b duplicated, one of the two null-id rows lost, c scored under another hash (a changed row)
    scored = spark.createDataFrame([("b", "h2", "ok"), ("b", "h2", "ok"), (None, "h3", "error"),
                                    ("c", "hX", "ok")], schema)
    check = identity_check(key_counts(inputs, id_column="id"),
                           key_counts(scored, id_column="id", status_column="status"))
    assert not check.ok
    assert (check.rows_in, check.rows_out, check.keys_in, check.keys_out) == (5, 4, 4, 3)
    assert (check.missing, check.extra, check.duplicated_keys, check.errors) == (3, 2, 1, 1)
    assert {(s["id"], s["content_hash"], s["rows_in"], s["rows_out"]) for s in check.sample} == {
        (None, "h3", 2, 1), ("a", "h1", 1, 0), ("b", "h2", 1, 2), ("c", "h4", 1, 0), ("c", "hX", 0, 1)}
    assert "'a' (in 1, scored 0)" in check.describe() and "'b' (in 1, scored 2)" in check.describe()

    same = identity_check(key_counts(inputs, id_column="id"), key_counts(inputs, id_column="id"))
    assert same.ok and same.sample == [] and (same.rows_in, same.keys_in) == (5, 4)


def test_error_budget_limits():
    from pipeline.spark.checks import error_budget

    assert not error_budget(1, 20, max_fraction=0.05, max_errors=None).exceeded  # at the limit: within
    assert error_budget(2, 20, max_fraction=0.05, max_errors=None).exceeded
    assert error_budget(3, 1000, max_fraction=0.05, max_errors=2).exceeded
    assert not error_budget(20, 20, max_fraction=None, max_errors=None).exceeded
    assert not error_budget(0, 0, max_fraction=0.0, max_errors=0).exceeded


# ---------------------------------------------------------------- the runner


def test_a_lost_and_a_duplicated_row_fail_the_job_before_any_commit(spark, tmp_path, tiny_embed_model, writer):
    """Rows in = rows out although one row is lost and another written twice: a count says OK, keys do not."""
    write_delta(tmp_path / "docs", make_documents(20))
    config = job_config(tmp_path, tiny_embed_model, source={"repartition": 2},
                        run={"faults": {"lose_and_duplicate_partitions": [0]}})
    with pytest.raises(JobError) as caught:
        run_job(config, spark=spark, out=io.StringIO())
    message = str(caught.value)
    assert "nothing was committed" in message
    assert "20 rows in (20 distinct (id, content_hash) keys) but 20 scored (19 distinct)" in message
    assert "1 input row(s) missing, 1 extra row(s)" in message
    lost = re.findall(r"'(d\d{5})' \(in 1, scored 0\)", message)
    doubled = re.findall(r"'(d\d{5})' \(in 1, scored 2\)", message)
    assert len(lost) == 1 and len(doubled) == 1 and lost != doubled, message
    assert not (tmp_path / "scores").exists() and not (tmp_path / "scores_quarantine").exists()


def test_every_row_failing_is_over_the_error_budget_and_commits_nothing(spark, tmp_path, tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(20))  # 18 texts (every one holds an "a") + a null + a blank
    config = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                        run={"faults": {"poison_marker": "a"}})
    with pytest.raises(JobError) as caught:
        run_job(config, spark=spark, out=io.StringIO())
    message = str(caught.value)
    assert "18 of 20 rows failed (90.0%), over the error budget (run.max_error_fraction 0.05)" in message
    assert 'most common errors: 18 x "InjectedFaultError: injected poison row (text contains \'a\')"' in message
    assert "Nothing was committed" in message
    assert not (tmp_path / "scores").exists() and not (tmp_path / "scores_quarantine").exists()


def test_errors_within_the_budget_commit_and_beyond_max_errors_do_not(spark, tmp_path, tiny_embed_model, writer):
    write_delta(tmp_path / "docs", _with_texts(make_documents(20), {7: "a POISON row"}))
    base = dict(sink={"mode": "overwrite_partition"})
    config = job_config(tmp_path, tiny_embed_model, **base,
                        run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 0.1})
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete and (summary.rows_out, summary.rows_quarantined) == (19, 1)
    assert _table(tmp_path / "scores_quarantine")["doc_id"].to_pylist() == ["d00007"]

    strict = job_config(tmp_path, tiny_embed_model, **base,
                        run={"faults": {"poison_marker": "POISON"}, "max_errors": 0, "run_id": "strict"})
    with pytest.raises(JobError, match=r"1 of 20 rows failed \(5.0%\), over the error budget "
                                        r"\(run.max_error_fraction 0.05, run.max_errors 0\)"):
        run_job(strict, spark=spark, out=io.StringIO())
    assert "strict" not in set(read_scores(tmp_path)["run_id"].to_pylist())  # the earlier run's rows stay
    assert DeltaTable(str(tmp_path / "scores")).version() == 0


def test_duplicate_failing_rows_give_one_quarantine_row_each(spark, tmp_path, tiny_embed_model, writer):
    """unique_ids false: a key read twice and failed twice is quarantined twice, not four times."""
    docs = make_documents(12)
    ids = docs["doc_id"].to_pylist()
    texts = docs["text"].to_pylist()
    ids[4] = ids[5] = ids[6] = "dup3"  # the same id and text three times
    ids[8] = ids[9] = "dup2"
    ids[10] = None
    for i in (4, 5, 6, 8, 9, 10):
        texts[i] = f"POISON {ids[i]}"
    write_delta(tmp_path / "docs", pa.table({"doc_id": pa.array(ids, pa.string()), "text": pa.array(texts),
                                             "source": docs["source"]}))
    config = job_config(tmp_path, tiny_embed_model, source={"unique_ids": False},
                        run={"faults": {"poison_marker": "POISON"}, "max_error_fraction": 1.0})
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete and (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (12, 6, 6)
    quarantine = _table(tmp_path / "scores_quarantine").to_pylist()
    assert Counter(r["doc_id"] for r in quarantine) == {"dup3": 3, "dup2": 2, None: 1}
    assert {r["input_text"] for r in quarantine} == {"POISON dup3", "POISON dup2", "POISON None"}


def test_a_crash_between_the_quarantine_and_the_output_commit_is_repaired_by_a_rerun(
        spark, tmp_path, tiny_embed_model, writer):
    write_delta(tmp_path / "docs", _with_texts(make_documents(40), {10: "a POISON review"}))
    poison = {"poison_marker": "POISON"}
    crash = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                       run={"faults": {**poison, "fail_after_quarantine_commit": True}, "run_id": "crashed"})
    with pytest.raises(InjectedFaultError, match="after the quarantine commit"):
        run_job(crash, spark=spark, out=io.StringIO())
    # the crash left the quarantine committed and no output
    assert _table(tmp_path / "scores_quarantine")["doc_id"].to_pylist() == ["d00010"]
    assert not (tmp_path / "scores").exists()

    rerun = job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                       run={"faults": poison, "run_id": "rerun"})
    summary = run_job(rerun, spark=spark, out=io.StringIO())
    assert summary.complete and (summary.rows_out, summary.rows_quarantined) == (39, 1)
    output, quarantine = read_scores(tmp_path).to_pylist(), _table(tmp_path / "scores_quarantine").to_pylist()
    held = [r["doc_id"] for r in output + quarantine]
    assert sorted(held) == [f"d{i:05d}" for i in range(40)]  # every id exactly once, over both tables
    assert {r["run_id"] for r in output + quarantine} == {"rerun"}


def test_read_back_is_at_this_runs_version_and_says_who_replaced_it(spark, tmp_path, tiny_embed_model, writer):
    """Run a's rows, replaced by run b's in the same partition: a's commit still checks out at its version."""
    from pipeline.core.run_summary import RunSummary
    from pipeline.stages.inputs import prepare_inputs
    from pipeline.stages.verify import check_written, rows_written
    from pipeline.io.delta.tables import replaced_by
    from pipeline.spark.checks import key_counts

    write_delta(tmp_path / "docs", make_documents(10))
    base = dict(sink={"mode": "overwrite_partition"})
    config_a = job_config(tmp_path, tiny_embed_model, **base, run={"run_id": "a"})
    first = run_job(config_a, spark=spark, out=io.StringIO())
    second = run_job(job_config(tmp_path, tiny_embed_model, **base, run={"run_id": "b"}), spark=spark,
                     out=io.StringIO())
    assert (first.delta_version, second.delta_version) == (0, 1) and second.replaced is None
    day = dt.date.fromisoformat(D1)
    path = str(tmp_path / "scores")

    # the input keys as the runner compares them, against what run a committed at its own version
    in_keys = key_counts(prepare_inputs(spark, config_a, revision=first.model_revision), id_column="id")
    check = check_written(in_keys, rows_written(spark, path, "a", day, version=first.delta_version), None,
                           "doc_id")
    assert check.ok and (check.rows_in, check.rows_out, check.keys_out) == (10, 10, 10)
    assert rows_written(spark, path, "a", day).count() == 0  # latest: gone, which is not a loss

    assert replaced_by(spark, path, run_id="a", version=first.delta_version, partition={"ds": day}) \
        == "replaced by run b (version 1)"
    assert replaced_by(spark, path, run_id="b", version=second.delta_version, partition={"ds": day}) is None
    rendered = RunSummary(**{**first.__dict__, "replaced": "replaced by run b (version 1)"}).render()
    assert "since then              : replaced by run b (version 1) (this run's commit landed" in rendered
    assert "[OK: every input row written once]" in rendered


def test_a_row_the_output_commit_loses_fails_the_read_back_check(spark, tmp_path, tiny_embed_model, writer):
    """The checks before the commit see every row; the commit loses one (drill ``lose_row_at_commit``). Only the
    read-back after the commit, at the version it made, can see that: the run fails naming the id."""
    write_delta(tmp_path / "docs", make_documents(12))
    config = job_config(tmp_path, tiny_embed_model, run={"run_id": "lossy", "faults": {"lose_row_at_commit": "d00004"}})
    out = io.StringIO()
    with pytest.raises(JobError, match=r"read back after the commit: .*1 input row\(s\) missing.*'d00004' \(in 1, "
                                       r"written 0\)"):
        run_job(config, spark=spark, out=out)
    assert "every input row written once" not in out.getvalue()
    assert sorted(read_scores(tmp_path)["doc_id"].to_pylist()) == [f"d{i:05d}" for i in range(12) if i != 4]
