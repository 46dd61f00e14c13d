"""Tables other people touch: a column they added to the output, a source they rebuilt, an upstream that came
back empty, a full staging disk, invalid bytes in a quarantined row, and a scheduler's SIGTERM."""

from __future__ import annotations

import datetime as dt
import io

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field

from pipeline.errors import SinkError
from pipeline.runner import run_job

from .conftest import make_documents, write_delta
from .test_runner import job_config, read_scores

D1, D2 = "2026-11-28", "2026-11-29"


def _add_reviewed_column(scores) -> None:
    """A downstream job's change: a nullable ``reviewed`` column, set on every row of day 1."""
    table = DeltaTable(str(scores))
    table.alter.add_columns([Field("reviewed", "boolean", nullable=True)])
    DeltaTable(str(scores)).update(updates={"reviewed": "true"}, predicate=f"ds = '{D1}'")


def test_a_column_added_downstream_survives_the_next_nights_overwrite_with_its_data(spark, tmp_path,
                                                                                   tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(40))
    scores = tmp_path / "scores"
    sink = {"mode": "overwrite_partition"}
    assert run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"ds": D1}), spark=spark,
                   out=io.StringIO()).complete
    _add_reviewed_column(scores)
    for ds in (D2, D1):  # another day, then day 1 itself replaced
        summary = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"ds": ds, "run_id": f"r-{ds}"}),
                          spark=spark, out=io.StringIO())
        assert summary.complete and summary.rows_out == 40
        rows = read_scores(tmp_path)
        assert "reviewed" in rows.column_names, f"the column someone else added is still in the schema after {ds}"
        if ds == D2:
            by_day = {}
            for day, reviewed in zip(rows["ds"].to_pylist(), rows["reviewed"].to_pylist()):
                by_day.setdefault(str(day), []).append(reviewed)
            assert by_day[D1] == [True] * 40, "day 1's values are intact"
            assert by_day[D2] == [None] * 40, "the rows this run wrote have nulls there"
    assert read_scores(tmp_path).num_rows == 80


def test_a_column_of_ours_the_table_holds_with_another_type_is_refused_before_any_work(spark, tmp_path,
                                                                                      tiny_embed_model, writer):
    write_delta(tmp_path / "docs", make_documents(12))
    theirs = pa.table({"doc_id": ["x"], "label": pa.array([7], pa.int64()), "ds": pa.array([dt.date(2026, 11, 1)])})
    write_delta(tmp_path / "scores", theirs, partition_by=["ds"])
    out = io.StringIO()
    with pytest.raises(SinkError, match=r"label: the table has long, this job writes string"):
        run_job(job_config(tmp_path, tiny_embed_model, sink={"partition_by": ["ds"]}), spark=spark, out=out)
    assert "scoring" not in out.getvalue(), "refused before any row was scored"
    assert DeltaTable(str(tmp_path / "scores")).version() == 0 and read_scores(tmp_path).num_rows == 1


def test_an_emptied_or_shrunk_source_does_not_replace_a_full_day_unless_allowed(spark, tmp_path, tiny_embed_model,
                                                                                 writer):
    from pipeline.cli import build_parser, config_from_args
    from pipeline.errors import JobError

    write_delta(tmp_path / "docs", make_documents(40))
    sink = {"mode": "overwrite_partition"}
    assert run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "full"}), spark=spark,
                   out=io.StringIO()).rows_out == 40
    for rows in (0, 12):  # the upstream emptied the source; then it came back with less than half the day
        write_delta(tmp_path / "docs", make_documents(rows), mode="overwrite")
        out = io.StringIO()
        with pytest.raises(JobError, match=rf"the source gives {rows} row\(s\) where it holds 40 now "
                                           r"\(run.min_rows_fraction 0.5 needs at least 20\).*--allow-empty"):
            run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": f"shrunk-{rows}"}), spark=spark,
                    out=out)
        assert "scoring" not in out.getvalue(), "refused before any work"
        assert sorted(set(read_scores(tmp_path)["run_id"].to_pylist())) == ["full"] and read_scores(tmp_path).num_rows == 40
    write_delta(tmp_path / "docs", make_documents(25), mode="overwrite")  # over half the day: a normal night
    assert run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "25"}), spark=spark,
                   out=io.StringIO()).rows_out == 25
    write_delta(tmp_path / "docs", make_documents(0), mode="overwrite")
    args = build_parser().parse_args(["run", "conf/score_documents.yaml", "--allow-empty"])
    assert config_from_args(args).run.allow_empty, "--allow-empty sets run.allow_empty"
    summary = run_job(job_config(tmp_path, tiny_embed_model, sink=sink, run={"run_id": "empty", "allow_empty": True}),
                      spark=spark, out=io.StringIO())
    assert summary.complete and summary.rows_out == 0 and read_scores(tmp_path).num_rows == 0, "allowed: replaced"
