"""Loading a job config: YAML files, overlays and ``key.path=value`` overrides, ``${VAR}`` expanded.

Unknown keys and bad values raise :class:`ConfigError` naming the key path and
what is allowed. ``${VAR}`` / ``${VAR:-default}`` in string values read the
environment, so secrets stay out of YAML.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from pipeline.config.kinds import task_config_class
from pipeline.config.models import JobConfig
from pipeline.errors import ConfigError

__all__ = ["build_config", "load_config", "merged_config_data", "parse_overrides"]


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# keys whose value is text however YAML reads it: a run id of 20261129 (a scheduler's ds_nodash) is an int to
# YAML, 2026-11-29 a date, 0123 the octal 83 and 12:30 the number 750; these keep the characters as written
TEXT_KEYS: tuple[tuple[str, ...], ...] = (("run", "run_id"),)


def _expand_env(value: Any, where: str, found: dict[str, str] | None = None) -> Any:
    """``value`` with ``${VAR}`` expanded; the key paths that held one are added to ``found`` with their text."""
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else str(k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]", found) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    if found is not None and _ENV.search(value):
        found[where] = value

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")

    return _ENV.sub(sub, value)


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=[x, y]"]`` into a nested dict; values are parsed as YAML scalars/lists."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key.path=value (e.g. batching.batch_size=128)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        node = tree
        parts = key.split(".")
        if tuple(parts) in TEXT_KEYS and not isinstance(value, (str, type(None))):
            value = raw.strip()
        if parts[:2] == ["spark", "conf"] and len(parts) > 3:
            # Spark settings are dotted themselves: spark.conf.<spark.key> is one key, a string
            parts = ["spark", "conf", ".".join(parts[2:])]
            value = raw.strip()
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return tree


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (configs live in conf/, e.g. conf/score_documents.yaml)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return _text_as_written(data, path.read_text())


def _text_as_written(data: dict[str, Any], text: str) -> dict[str, Any]:
    """``data`` with each of :data:`TEXT_KEYS` that YAML turned into another type (a number, a date) replaced
    by its scalar's characters as written in ``text``.

    >>> _text_as_written({"run": {"run_id": 83}}, "run:\\n  run_id: 0123\\n")
    {'run': {'run_id': '0123'}}
    """
    for keys in TEXT_KEYS:
        parent: Any = data
        for key in keys[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and not isinstance(parent.get(keys[-1]), (str, type(None))):
            written = _scalar_text(yaml.compose(text), keys)
            if written is not None:
                parent[keys[-1]] = written
    return data


def _scalar_text(node: Any, keys: tuple[str, ...]) -> str | None:
    """The characters of the scalar at ``keys`` in a composed YAML document (None where there is none)."""
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _allowed_keys(loc: tuple[Any, ...], data: dict[str, Any]) -> list[str] | None:
    """The field names allowed at ``loc`` (the parent of an unknown key), for the error message."""
    current: Any = JobConfig
    for part in loc:
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return None
        if part == "task" and current is JobConfig:
            current = task_config_class(str((data.get("task") or {}).get("kind")))
            if current is None:
                return None
            continue
        current = fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else None


def _format_errors(exc: ValidationError, source: str, data: dict[str, Any], *,
                   env: dict[str, str] | None = None) -> str:
    """One line per error; a value that came from ``${VAR}`` is named by its ``${VAR}`` text, never shown."""
    env = env or {}
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(tuple(err["loc"][:-1]), data)
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {path}: unknown key{hint}")
        elif err["type"] == "missing":
            lines.append(f"  {path}: required key is missing")
        elif err["type"] == "value_error":
            lines.append(f"  {path}: {err['msg'].removeprefix('Value error, ')}")
        else:
            got = f"{env[path]!r}, expanded" if path in env else repr(err.get("input"))
            lines.append(f"  {path}: {err['msg']} (got {got})")
    return f"invalid config {source}:\n" + "\n".join(lines)


def build_config(data: dict[str, Any], *, source: str = "(dict)", expand_env: bool = True) -> JobConfig:
    """Validate a plain dict (already merged) into a :class:`JobConfig`.

    ``expand_env=False`` takes string values as they are: Python callers (``score(df)``) pass values, not
    YAML text, so a ``${...}`` in a prompt template stays a ``${...}``.
    """
    found: dict[str, str] = {}
    if expand_env:
        data = _expand_env(data, "", found)
    try:
        config = JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source, data, env=found)) from None
    config._env_paths = frozenset(found)
    config._env_templates = found
    return config



def merged_config_data(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] = (),
    overlays: Iterable[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """The YAML file, then each overlay, then the overrides, with ``${VAR}`` expanded: ready to validate.

    Job families with their own config model (e.g. ``pipeline.recs``) validate this dict themselves.
    """
    return _expand_env(_merged_raw(path, overrides=overrides, overlays=overlays), "")


def _merged_raw(path: str | os.PathLike[str], *, overrides: Iterable[str],
                overlays: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    data = _read_yaml(Path(path))
    for overlay in overlays:
        data = _deep_merge(data, _read_yaml(Path(overlay)))
    return _deep_merge(data, parse_overrides(overrides))


def load_config(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] = (),
    overlays: Iterable[str | os.PathLike[str]] = (),
) -> JobConfig:
    """Load a job config: the YAML file, then each overlay file, then ``key.path=value`` overrides.

    Example::

        load_config("conf/score_documents.yaml", overlays=["conf/env/databricks.yaml"],
                    overrides=["run.ds=2026-11-29"])
    """
    # build_config expands ${VAR} itself, remembering which keys held one (redacted in the runs table)
    return build_config(_merged_raw(path, overrides=overrides, overlays=overlays), source=str(path))
