"""MLflow: log each run's params, metrics and report; load ``models:/`` paths from the model registry.

Both are optional. ``mlflow`` (``mlflow-skinny`` is enough; a SQLite store
also needs SQLAlchemy and alembic, all pinned in requirements.lock) is
imported only when ``run.mlflow`` is set or a ``model.path`` starts with
``models:/``. Logging goes through an explicit ``MlflowClient`` so that no
global MLflow state (active run, tracking URI) leaks into the caller.

``model.path: models:/<name>/<version>`` or ``models:/<name>@<alias>`` is
downloaded once per machine into a cache folder keyed by registry, name and
version (``$SBI_MODEL_CACHE``, default ``~/.cache/sbi/registry``), and loaded
from there like any model folder; the driver pins an alias to its version
before the job starts (:func:`pin_registry_model`), so every worker loads the
same weights even if the alias moves during the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pipeline.errors import RegistryError

if TYPE_CHECKING:
    from pipeline.config import JobConfig, MlflowConfig

__all__ = ["REGISTRY_PREFIX", "RegistryError", "log_run", "parse_registry_uri", "pin_registry_model", "resolve_registry_model"]

REGISTRY_PREFIX = "models:/"
_REGISTRY = re.compile(r"^models:/(?P<name>[^/@]+?)(?:/(?P<version>\d+)|@(?P<alias>[A-Za-z0-9_.-]+))/?$")
_METRICS = ("rows_in", "rows_out", "rows_flagged", "rows_quarantined", "tokens", "padded_tokens",
            "padding_efficiency", "batches", "docs_per_s", "tokens_per_s", "model_loads", "workers", "seconds",
            "delta_version")
_PARAMS = ("job", "run_id", "ds", "outcome", "task_kind", "model_name", "model_revision", "precision",
           "config_hash", "output", "writer", "spark_app_id", "spark_master", "error_class")


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise RegistryError(
            "mlflow is not installed here; pip install mlflow-skinny (pinned in requirements.lock), "
            "or point model.path at a model folder"
        ) from None
    return mlflow


# ------------------------------------------------------------------ logging a run


def log_run(row: Mapping[str, Any], config: "MlflowConfig", *, report_path: str | None = None) -> str | None:
    """Log one runs-table row to MLflow as a finished (or failed) run; returns the MLflow run id.

    Params: identity, model and the redacted config flattened (``config.batching.batch_size``);
    metrics: counts, throughput, padding and ``status.<name>`` row counts;
    artifacts: ``config.json``, ``batch_metrics.json`` and the HTML report.
    Returns ``None`` (nothing logged) when mlflow is not installed.
    """
    try:
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param, RunTag
    except ImportError:
        return None
    client = MlflowClient(tracking_uri=config.tracking_uri, registry_uri=config.registry_uri or config.tracking_uri)
    experiment_id = _experiment_id(client, config.experiment or str(row["job"]), config.tracking_uri)
    started = row.get("started_at")
    start_ms = int(started.timestamp() * 1000) if started else int(time.time() * 1000)
    run = client.create_run(
        experiment_id, start_time=start_ms, run_name=f"{row['job']} {row['ds']}",
        tags={"sbi.run_id": str(row["run_id"]), "sbi.job": str(row["job"]), "sbi.ds": str(row["ds"]),
              "sbi.outcome": str(row["outcome"])},
    )
    run_id = run.info.run_id
    params = {k: row.get(k) for k in _PARAMS if row.get(k) is not None}
    params.update(_flatten(json.loads(row.get("config_json") or "{}"), "config"))
    metrics = {k: float(row[k]) for k in _METRICS if isinstance(row.get(k), (int, float))}
    metrics.update({f"status.{k}": float(v) for k, v in json.loads(row.get("status_counts") or "{}").items()})
    now = int(time.time() * 1000)
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[start : start + 100])
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                     tags=[RunTag("sbi.model", f"{row.get('model_name')}@{row.get('model_revision')}")])
    client.log_text(run_id, row.get("config_json") or "{}", "config.json")
    client.log_text(run_id, row.get("batch_metrics") or "{}", "batch_metrics.json")
    if report_path:
        client.log_artifact(run_id, report_path)
    ended = row.get("ended_at")
    client.set_terminated(run_id, status="FINISHED" if row.get("outcome") == "ok" else "FAILED",
                          end_time=int(ended.timestamp() * 1000) if ended else None)
    return run_id


def _experiment_id(client: Any, name: str, tracking_uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if tracking_uri.startswith("sqlite:///"):
        # beside the database, as `mlflow server` does; MLflow's default (./mlruns) depends on the cwd
        location = (Path(tracking_uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # noqa: BLE001 - another run created it meanwhile
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _flatten(data: Any, prefix: str) -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}.{key}"))
        return out
    return {prefix: json.dumps(data) if isinstance(data, list) else data}


# ------------------------------------------------------------------ loading registered models


def parse_registry_uri(spec: str) -> tuple[str, str | None, str | None]:
    """``(name, version, alias)`` of ``models:/<name>/<version>`` or ``models:/<name>@<alias>``.

    >>> parse_registry_uri("models:/minilm/3"), parse_registry_uri("models:/minilm@champion")
    (('minilm', '3', None), ('minilm', None, 'champion'))
    """
    match = _REGISTRY.match(spec)
    if not match:
        raise RegistryError(
            f"model.path {spec!r} is not a registry model; use models:/<name>/<version> or models:/<name>@<alias>"
        )
    return match["name"], match["version"], match["alias"]


def _client(registry_uri: str | None) -> Any:
    mlflow = _mlflow()
    # the tracking URI too: MLflow's default one is ./mlflow.db, a database in whatever the cwd is
    return mlflow.MlflowClient(tracking_uri=registry_uri, registry_uri=registry_uri) if registry_uri         else mlflow.MlflowClient()


def _version(client: Any, spec: str) -> tuple[str, str]:
    name, version, alias = parse_registry_uri(spec)
    if version is None:
        try:
            version = str(client.get_model_version_by_alias(name, alias).version)
        except Exception as exc:  # noqa: BLE001 - the registry's own error says more
            raise RegistryError(f"model.path {spec!r}: alias {alias!r} of model {name!r} not found in the registry "
                                f"({type(exc).__name__}: {exc}); check model.registry_uri") from None
    return name, version


def pin_registry_model(config: "JobConfig") -> "JobConfig":
    """``config`` with ``models:/<name>@<alias>`` replaced by the version the alias points at now."""
    spec = config.model.path
    if not spec.startswith(REGISTRY_PREFIX) or "@" not in spec:
        return config
    name, version = _version(_client(config.model.registry_uri), spec)
    model = config.model.model_copy(update={"path": f"{REGISTRY_PREFIX}{name}/{version}",
                                            "name": config.model.name or name})
    return config.model_copy(update={"model": model})


def resolve_registry_model(spec: str, *, registry_uri: str | None = None) -> Path:
    """The local folder of registry model ``spec``, downloaded once per machine into the cache.

    The download goes to a temporary folder renamed into place, so workers
    racing on one machine never load a half-written model.
    """
    mlflow = _mlflow()
    client = _client(registry_uri)
    name, version = _version(client, spec)
    registry = registry_uri or mlflow.get_registry_uri()
    root = Path(os.environ.get("SBI_MODEL_CACHE", Path.home() / ".cache" / "sbi" / "registry"))
    key = hashlib.sha256(str(registry).encode()).hexdigest()[:10]
    folder = root / key / name / version / name  # ends in the model's name: the default model.name
    if (folder.parent / ".complete").is_file():
        return folder
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=folder.parent.parent))
    try:
        try:
            source = client.get_model_version_download_uri(name, version)
            # the artifact folder lands under its own name (e.g. "model") inside dst_path
            local = mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(staging / ".download"),
                                                        tracking_uri=registry_uri)
        except Exception as exc:  # noqa: BLE001
            raise RegistryError(f"model.path {spec!r}: could not download version {version} of {name!r} from "
                                f"{registry} ({type(exc).__name__}: {exc})") from None
        if not Path(local).is_dir():
            raise RegistryError(f"model.path {spec!r}: version {version} of {name!r} is a single file ({source}); "
                                "register the model folder (config, weights, tokenizer) as the version's source")
        os.rename(local, staging / name)
        (staging / ".complete").write_text(json.dumps({"spec": spec, "version": version, "registry": str(registry)}))
        try:
            os.rename(staging, folder.parent)
        except OSError:
            if not (folder.parent / ".complete").is_file():  # not another worker's finished copy: a real error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
