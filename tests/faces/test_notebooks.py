from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

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


def _project(tmp_path, job: dict | None = None):
    """A repository as Databricks checks it out: conf/job.yaml naming relative paths, notebooks/, the demo's data."""
    import yaml

    from tests.support.data import make_documents, write_delta

    repo = tmp_path / "repo"
    (repo / "conf" / "env").mkdir(parents=True)
    (repo / "notebooks").mkdir()
    (repo / "conf" / "env" / "platform.yaml").write_text("run: {progress: false}\n")
    write_delta(repo / "warehouse" / "docs", make_documents(12))
    (repo / "models").mkdir()
    job = job or {"job": "nb_test",
                  "source": {"format": "delta", "path": "warehouse/docs", "id_column": "doc_id"},
                  "model": {"path": "models/tiny", "name": "tiny-bert"},
                  "task": {"kind": "embed", "labels": {"pos": "good great", "neg": "bad awful"}},
                  "batching": {"batch_size": 4},
                  "sink": {"path": "warehouse/scores", "mode": "append"},
                  "run": {"state_path": "state"}}
    (repo / "conf" / "job.yaml").write_text(yaml.safe_dump(job))
    return repo


def test_read_widgets_validates_and_builds_overrides(tmp_path, monkeypatch, tiny_embed_model):
    from pipeline.config import ConfigError
    from pipeline.notebook import read_widgets

    repo = _project(tmp_path)
    monkeypatch.chdir(repo)
    args = read_widgets(_DbUtils(config="conf/job.yaml", overlay="conf/env/platform.yaml",
                                 overrides=f"model.path={tiny_embed_model}; batching.batch_size=8\n",
                                 ds="2026-11-29"))
    assert args.overlays == [str(repo / "conf" / "env" / "platform.yaml")]
    assert args.overrides_with_run() == [f"model.path={tiny_embed_model}", "batching.batch_size=8", "run.ds=2026-11-29"]
    with pytest.raises(ConfigError, match="'config' widget is empty"):
        read_widgets(_DbUtils(config=" "))
    with pytest.raises(ConfigError, match="not a date"):
        read_widgets(_DbUtils(config="c.yaml", ds="29/11/2026"))
    with pytest.raises(ConfigError, match="key.path=value"):
        read_widgets(_DbUtils(config="c.yaml", overrides="batch_size 8"))
    with pytest.raises(ConfigError, match=r"the 'overlay' widget names conf/env/nope.yaml, which is in neither the "
                                          r"working folder .* nor any folder above it; give the file's absolute path"):
        read_widgets(_DbUtils(config="conf/job.yaml", overlay="conf/env/nope.yaml"))


def test_declared_widgets_are_the_ones_read(tmp_path, monkeypatch, tiny_embed_model):
    from pipeline.notebook import declare_widgets, read_widgets

    repo = _project(tmp_path)
    monkeypatch.chdir(repo / "notebooks")
    dbutils = _DbUtils(overrides=f"model.path={tiny_embed_model}")
    declare_widgets(dbutils, config="conf/job.yaml")
    assert set(dbutils.widgets.values) == {"config", "overlay", "overrides", "ds", "run_id"}
    args = read_widgets(dbutils)
    assert args.config_path == str(repo / "conf" / "job.yaml") and args.root == str(repo)
    assert args.overrides_with_run() == [f"model.path={tiny_embed_model}"]


def test_a_notebook_in_notebooks_runs_the_repositorys_config_with_the_repositorys_paths(spark, tmp_path, monkeypatch,
                                                                                        tiny_embed_model):
    """On Databricks a notebook's working folder is notebooks/: the default config widget (a repository path) is
    found above it, and the relative paths the YAML names are the repository's, so the job reads and writes where
    it does from the repository's root (the CLI's working folder), not under notebooks/."""
    from deltalake import DeltaTable

    from pipeline.notebook import declare_widgets, read_widgets, run_notebook
    from pipeline.records.runs import read_runs

    repo = _project(tmp_path)
    monkeypatch.chdir(repo / "notebooks")
    dbutils = _DbUtils(overrides=f"model.path={tiny_embed_model}", ds="2026-11-29")
    declare_widgets(dbutils, config="conf/job.yaml")
    args = read_widgets(dbutils)
    config = args.load()
    assert config.source.path == str(repo / "warehouse" / "docs") and config.sink.path == str(repo / "warehouse" / "scores")
    assert config.resolved_runs_path() == str(repo / "state" / "nb_test" / "runs")
    summary = run_notebook(args, spark=spark)
    assert summary.complete and summary.rows_in == 12
    assert DeltaTable(str(repo / "warehouse" / "scores")).to_pyarrow_table().num_rows == summary.rows_out
    assert [r["outcome"] for r in read_runs(str(repo / "state" / "nb_test" / "runs"))] == ["ok"]
    assert not (repo / "notebooks" / "warehouse").exists() and not (repo / "notebooks" / "state").exists()


def test_a_notebook_names_the_inputs_to_give_when_the_yaml_names_the_demos(tmp_path, monkeypatch, tiny_embed_model):
    """The shipped YAMLs name the demo's tables and models, which a workspace lacks: the validation cell names each
    key to set in overrides, before any work; given them, it passes."""
    from pipeline.config import ConfigError
    from pipeline.notebook import read_widgets

    job = yaml.safe_load((REPO / "conf" / "score_documents.yaml").read_text())
    job["model"]["path"] = "package:sbi_no_such_model_package"
    repo = _project(tmp_path, job)
    monkeypatch.chdir(repo / "notebooks")
    with pytest.raises(ConfigError) as caught:
        read_widgets(_DbUtils(config="conf/job.yaml"))
    assert str(caught.value) == (
        f"the job reads what is not there: source.path {repo}/warehouse/demo/documents; model.path "
        "package:sbi_no_such_model_package (a model in a wheel: pip install sbi-no-such-model-package). Give yours "
        "in the 'overrides' widget, e.g. source.path=/Volumes/<catalog>/<schema>/<volume>/...; "
        "model.path=/Volumes/<catalog>/<schema>/<volume>/... (the shipped YAMLs name the demo's tables and models)")
    given = f"source.path={repo}/warehouse/docs; model.path={tiny_embed_model}; sink.path=/Volumes/main/sbi/scores"
    args = read_widgets(_DbUtils(config="conf/job.yaml", overrides=given))
    assert args.load().sink.path == "/Volumes/main/sbi/scores"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_notebooks_default_config_is_found_from_its_own_folder(path):
    """The config a notebook declares by default is found from notebooks/ (its working folder on Databricks), and
    every path it names is then the repository's, absolute."""
    import re

    from pipeline.notebook import NotebookArgs, find_config_file

    [default] = re.findall(r'declare_widgets\(dbutils, config="([^"]+)"\)', path.read_text())
    found = find_config_file(default, widget="config", start=REPO / "notebooks")
    assert found == REPO / default
    locations = NotebookArgs(str(found), root=str(REPO)).load().locations()
    assert locations and all(v.startswith((str(REPO), "package:")) for v in locations.values()), locations


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
