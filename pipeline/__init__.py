"""Spark batch inference: score tables with Hugging Face / torch models on executors, write Delta.

The public surface is small: a job that owns its read and its commit, or a DataFrame the caller owns::

    from pipeline import load_config, run_job
    summary = run_job(load_config("conf/score_documents.yaml"))

    from pipeline import score
    scored = score(docs, "embed", model="/models/all-MiniLM-L6-v2", text_column="text", id_column="doc_id")

Every name the docs use is here (``__all__``): the jobs and DataFrames above, the error tree
(``PipelineError``, the rest in ``pipeline.errors``), what a task kind of your own registers with
(``register_task``, ``TaskConfig``, ``TaskJob``, ``STATUS_FIELDS``), the runs table and the logs
(``read_runs``, ``JsonFormatter``), and the two entry modules (``pipeline.cli``, ``pipeline.notebook``).
Other modules are the machinery: their names may move between releases.
"""

from __future__ import annotations

# every import here is cheap (none pulls in pyspark, torch or transformers): `import pipeline` takes what it took
# when it exported eight names
from pipeline import tasks  # noqa: F401 - the built-in task kinds register themselves before any config is validated
from pipeline import cli, errors, notebook
from pipeline.core.compat import library_version
from pipeline.config import ConfigError, JobConfig, TaskConfig, load_config
from pipeline.dataframe import register_function, score
from pipeline.errors import PipelineError
from pipeline.core.logs import JsonFormatter
from pipeline.registry import register_task
from pipeline.core.rows import STATUS_FIELDS
from pipeline.records.runs import read_runs
from pipeline.core.run_summary import RunSummary
from pipeline.runner import JobError, run_job
from pipeline.tasks.job import TaskJob

__all__ = ["ConfigError", "JobConfig", "JobError", "JsonFormatter", "PipelineError", "RunSummary", "STATUS_FIELDS",
           "TaskConfig", "TaskJob", "cli", "errors", "load_config", "notebook", "read_runs", "register_function",
           "register_task", "run_job", "score"]
# one version source: pyproject.toml's, as the installed package's metadata carries it
__version__ = library_version()
