"""MLflow: log each run's params, metrics and report (loading ``models:/`` paths: ``pipeline.models.mlflow_registry``).

Both are optional. ``mlflow`` (``mlflow-skinny`` is enough; a SQLite store
also needs SQLAlchemy and alembic, all pinned in requirements.lock) is
imported only when ``run.mlflow`` is set or a ``model.path`` starts with
``models:/``. Logging goes through an explicit ``MlflowClient`` so that no
global MLflow state (active run, tracking URI) leaks into the caller.

The registry names are re-exported here for the callers that know them by
this module.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from pipeline.errors import RegistryError
from pipeline.io.outputs import read_output
from pipeline.core.locations import is_local, local_path
from pipeline.models.mlflow_registry import (
    REGISTRY_PREFIX, _mlflow, parse_registry_uri, pin_registry_model, resolve_registry_model,
)

if TYPE_CHECKING:
    from pipeline.config import MlflowConfig

__all__ = ["REGISTRY_PREFIX", "RegistryError", "log_run", "parse_registry_uri", "pin_registry_model", "resolve_registry_model"]

_METRICS = ("rows_in", "rows_out", "rows_flagged", "rows_quarantined", "tokens", "padded_tokens",
            "padding_efficiency", "batches", "docs_per_s", "tokens_per_s", "model_loads", "workers", "seconds",
            "delta_version")
_PARAMS = ("job", "run_id", "ds", "outcome", "task_kind", "model_name", "model_revision", "precision",
           "config_hash", "output", "writer", "spark_app_id", "spark_master", "error_class")


# ------------------------------------------------------------------ logging a run


def log_run(row: Mapping[str, Any], config: "MlflowConfig", *, report_path: str | None = None) -> str | None:
    """Log one runs-table row to MLflow as a finished (or failed) run; returns the MLflow run id.

    Params: identity, model and the redacted config flattened (``config.batching.batch_size``);
    metrics: counts, throughput, padding, ``status.<name>`` row counts and the drift gate's statistics
    (``quality.<measure>.<test>``, ``quality.moved``; tag ``sbi.quality``: passed, warned, refused, accepted);
    artifacts: ``config.json``, ``batch_metrics.json``, ``drift.json`` and the HTML report.
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
    drift = json.loads(row.get("drift") or "{}")
    metrics.update(quality_metrics(drift))
    now = int(time.time() * 1000)
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
        client.log_batch(run_id, params=items[start : start + 100])
    tags = [RunTag("sbi.model", f"{row.get('model_name')}@{row.get('model_revision')}")]
    if drift:
        tags.append(RunTag("sbi.quality", str(drift.get("action") or "passed")))
    client.log_batch(run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()], tags=tags)
    client.log_text(run_id, row.get("config_json") or "{}", "config.json")
    client.log_text(run_id, row.get("batch_metrics") or "{}", "batch_metrics.json")
    if drift:
        client.log_text(run_id, json.dumps(drift, indent=1), "drift.json")
    if report_path and is_local(report_path):
        client.log_artifact(run_id, local_path(report_path))
    elif report_path:  # an object (s3://): its text, under its own name
        client.log_text(run_id, read_output(report_path).decode("utf-8"), report_path.rstrip("/").rsplit("/", 1)[-1])
    ended = row.get("ended_at")
    client.set_terminated(run_id, status="FINISHED" if row.get("outcome") == "ok" else "FAILED",
                          end_time=int(ended.timestamp() * 1000) if ended else None)
    return run_id


def quality_metrics(drift: Mapping[str, Any]) -> dict[str, float]:
    """The drift verdict as MLflow metrics: each test's statistic, and how many measures moved.

    >>> quality_metrics({"findings": [{"measure": "status", "test": "PSI", "value": 1.8, "flagged": True},
    ...                               {"measure": "embedding", "test": "centroid shift", "value": 0.1}]})
    {'quality.status.psi': 1.8, 'quality.embedding.centroid_shift': 0.1, 'quality.moved': 1.0}
    """
    findings = drift.get("findings") or []
    out = {f"quality.{f['measure']}.{f['test'].lower().replace(' ', '_')}": float(f["value"]) for f in findings
           if isinstance(f.get("value"), (int, float)) and abs(float(f["value"])) != float("inf")}
    if findings:
        out["quality.moved"] = float(len({f["measure"] for f in findings if f.get("flagged") and not f.get("ignored")}))
    return out


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
