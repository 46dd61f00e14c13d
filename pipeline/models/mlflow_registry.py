"""Models from an MLflow model registry: ``model.path: models:/<name>/<version>`` or ``models:/<name>@<alias>``.

A registry model is downloaded once per machine into a cache folder keyed by
registry, name and version (``$SBI_MODEL_CACHE``, default
``~/.cache/sbi/registry``), and loaded from there like any model folder; the
driver pins an alias to its version before the job starts
(:func:`pin_registry_model`), so every worker loads the same weights even if
the alias moves during the run. ``mlflow`` is imported only when a
``model.path`` starts with ``models:/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import RegistryError

if TYPE_CHECKING:
    from pipeline.config import JobConfig

__all__ = ["REGISTRY_PREFIX", "parse_registry_uri", "pin_registry_model", "resolve_registry_model"]

REGISTRY_PREFIX = "models:/"
_REGISTRY = re.compile(r"^models:/(?P<name>[^/@]+?)(?:/(?P<version>\d+)|@(?P<alias>[A-Za-z0-9_.-]+))/?$")


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise RegistryError(
            "mlflow is not installed here; pip install mlflow-skinny (pinned in requirements.lock), "
            "or point model.path at a model folder"
        ) from None
    return mlflow


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
