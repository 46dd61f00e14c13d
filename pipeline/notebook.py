"""Databricks notebook helpers: declare, read and validate the standard job widgets, then run the job.

Every job notebook declares the same widgets (``config``, ``overlay``,
``overrides``, ``ds``, ``run_id``) in its first cell (:func:`declare_widgets`),
reads them into checked values in the second (:func:`read_widgets`, so a typo
fails there, not an hour into a run) and runs the job in the last
(:func:`run_notebook`)::

    declare_widgets(dbutils, config="conf/score_documents.yaml")
    args = read_widgets(dbutils)
    summary = run_notebook(args, spark=spark)

A notebook that reads and displays scores the rows it shows with :func:`pipeline.score` instead
(:func:`preview_scores`: the job's first rows, its settings, nothing written).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import ConfigError, parse_overrides

__all__ = ["NotebookArgs", "declare_widgets", "preview_scores", "read_widgets", "run_notebook"]

WIDGETS = {
    "config": "Config YAML",
    "overlay": "Overlay YAML (optional)",
    "overrides": "Overrides: key.path=value, one per line or ';'-separated",
    "ds": "Run date YYYY-MM-DD (empty: today)",
    "run_id": "Run id (empty: a new one)",
}


@dataclass(frozen=True)
class NotebookArgs:
    config_path: str
    overlays: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    ds: str | None = None
    run_id: str | None = None

    def overrides_with_run(self) -> list[str]:
        """The overrides plus ``run.ds`` / ``run.run_id`` from their widgets, for :func:`load_config`."""
        extra = [f"run.ds={self.ds}"] if self.ds else []
        extra += [f"run.run_id={self.run_id}"] if self.run_id else []
        return [*self.overrides, *extra]


def declare_widgets(dbutils: Any, *, config: str) -> None:
    """Declare the standard widgets; ``config`` is the job's YAML, the others start empty."""
    for name, label in WIDGETS.items():
        dbutils.widgets.text(name, config if name == "config" else "", label)


def run_notebook(args: NotebookArgs, *, spark: Any) -> Any:
    """Load the config the widgets name and run it on the notebook's session; returns the run summary."""
    from pipeline.config import load_config
    from pipeline.runner import run_job

    config = load_config(args.config_path, overlays=args.overlays, overrides=args.overrides_with_run())
    return run_job(config, spark=spark)


def preview_scores(args: NotebookArgs, *, spark: Any, rows: int = 20) -> Any:
    """The first ``rows`` rows of the job's source, scored with the job's task, model and batching, to display.

    A lazy DataFrame (:func:`pipeline.score`): the id, the columns the task reads and ``source.keep_columns``,
    then the task's columns; nothing is written and no run is recorded. The job itself: :func:`run_notebook`.
    """
    from pipeline.config import load_config
    from pipeline.dataframe import score
    from pipeline.io.sources import read_source
    from pipeline.registry import kind_and_task

    config = load_config(args.config_path, overlays=args.overlays, overrides=args.overrides_with_run())
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
    """The widget values, validated: a config path, a well-formed date, ``key.path=value`` overrides."""
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
    return NotebookArgs(config_path, [overlay] if overlay else [], overrides, ds, _get(dbutils, "run_id") or None)
