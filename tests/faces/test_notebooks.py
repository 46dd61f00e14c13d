from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))


def test_there_is_a_notebook_per_job():
    # prepare_/train_ scripts make demo data and models; demo_ scripts drive a demo (demo_s3: a local S3 around
    # the score_documents job): none is a job to schedule
    jobs = {p.stem for p in (REPO / "jobs").glob("*.py") if not p.stem.startswith(("prepare_", "train_", "demo_"))}
    assert jobs and jobs <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_databricks_source_and_calls_the_library(path):
    text = path.read_text()
    assert text.startswith("# Databricks notebook source\n")
    cells = text.split("# COMMAND ----------")
    assert len(cells) >= 3
    assert "declare_widgets(dbutils" in cells[1], "widgets are declared in the first code cell"
    ast.parse(text)  # valid Python
    last = cells[-1]
    assert "from pipeline" in last and "(" in last, "the last cell calls one library function"
    assert "sys.path" not in text, "notebooks import the installed package"


class _Widgets:
    def __init__(self, values):
        self.values = values

    def text(self, name, default, label):
        self.values.setdefault(name, default)

    def get(self, name):
        if name not in self.values:
            raise KeyError(name)
        return self.values[name]


class _DbUtils:
    def __init__(self, **values):
        self.widgets = _Widgets(values)


def test_read_widgets_validates_and_builds_overrides():
    from pipeline.config import ConfigError
    from pipeline.notebook import read_widgets

    args = read_widgets(_DbUtils(config="conf/score_documents.yaml", overlay="conf/env/databricks.yaml",
                                 overrides="source.limit=10; batching.batch_size=8\n", ds="2026-11-29"))
    assert args.overlays == ["conf/env/databricks.yaml"]
    assert args.overrides_with_run() == ["source.limit=10", "batching.batch_size=8", "run.ds=2026-11-29"]
    with pytest.raises(ConfigError, match="'config' widget is empty"):
        read_widgets(_DbUtils(config=" "))
    with pytest.raises(ConfigError, match="not a date"):
        read_widgets(_DbUtils(config="c.yaml", ds="29/11/2026"))
    with pytest.raises(ConfigError, match="key.path=value"):
        read_widgets(_DbUtils(config="c.yaml", overrides="batch_size 8"))


def test_declared_widgets_are_the_ones_read():
    from pipeline.notebook import declare_widgets, read_widgets

    dbutils = _DbUtils()
    declare_widgets(dbutils, config="conf/generate_text.yaml")
    assert set(dbutils.widgets.values) == {"config", "overlay", "overrides", "ds", "run_id"}
    args = read_widgets(dbutils)
    assert args.config_path == "conf/generate_text.yaml" and args.overrides_with_run() == []


def test_preview_scores_shows_the_jobs_first_rows_scored_and_writes_nothing(spark, tmp_path, tiny_embed_model):
    import yaml

    from pipeline.notebook import NotebookArgs, preview_scores
    from tests.support.data import make_documents, write_delta

    write_delta(tmp_path / "docs", make_documents(12))
    config = {
        "job": "preview_test",
        "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id",
                   "keep_columns": ["source"]},
        "model": {"path": str(tiny_embed_model), "name": "tiny-bert"},
        "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
        "batching": {"batch_size": 4},
        "sink": {"path": str(tmp_path / "scores"), "mode": "append"},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config))
    shown = preview_scores(NotebookArgs(str(tmp_path / "job.yaml")), spark=spark, rows=5)
    assert shown.columns[:3] == ["doc_id", "text", "source"] and "task_fingerprint" in shown.columns
    rows = shown.collect()
    assert len(rows) == 5 and {r["model_name"] for r in rows} == {"tiny-bert"}
    assert {r["status"] for r in rows} <= {"ok", "skipped_null", "skipped_empty"} and rows[0]["label"] in ("pos", "neg")
    assert not (tmp_path / "scores").exists() and not (tmp_path / "scores_runs").exists()
