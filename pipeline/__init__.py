"""Spark batch inference: score tables with Hugging Face / torch models on executors, write Delta.

The public surface is small: a job that owns its read and its commit, or a DataFrame the caller owns::

    from pipeline import load_config, run_job
    summary = run_job(load_config("conf/score_documents.yaml"))

    from pipeline import score
    scored = score(docs, "embed", model="/models/all-MiniLM-L6-v2", text_column="text", id_column="doc_id")
"""

from __future__ import annotations

from pipeline import tasks  # noqa: F401 - the built-in task kinds register themselves before any config is validated
from pipeline.compat import library_version
from pipeline.config import ConfigError, JobConfig, load_config
from pipeline.dataframe import register_function, score
from pipeline.summary import RunSummary
from pipeline.runner import JobError, run_job

__all__ = ["ConfigError", "JobConfig", "JobError", "RunSummary", "load_config", "register_function", "run_job",
           "score"]
# one version source: pyproject.toml's, as the installed package's metadata carries it
__version__ = library_version()
