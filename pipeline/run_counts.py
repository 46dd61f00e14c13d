"""The merged worker counts of a run, typed: one attribute per counter, so a misspelt name fails loudly.

Executors count into plain dicts keyed by name (:class:`pipeline.metrics.WorkerCounts`),
because those travel as JSON with the data and merge by adding up. On the
driver a string key read with ``counts.get("tokns", 0)`` would quietly read 0;
:meth:`RunCounts.from_merged` instead reads every key once, into a frozen
dataclass, and refuses a key nobody declared, naming it and the known ones.

The counters every kind's workers emit (the worker loop, batching, model
loads, retries, generation and the endpoint client) are fields of
:class:`RunCounts`; a kind with counters of its own declares them as a
:class:`TaskCounts` subclass (``OcrCounts``, ``RecommendCounts``, ...) and
passes it as ``task=``; they are then read from ``counts.task``. Pure Python:
no pyspark import.

>>> counts = RunCounts.from_merged({"rows": 3, "status": {"ok": 3}, "tokens": 40})
>>> counts.rows, counts.status, counts.tokens, counts.batches
(3, {'ok': 3}, 40, 0)
>>> RunCounts.from_merged({"tokns": 40})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: unknown counter 'tokns' in the merged worker counts; known: adaptive_splits, batch_rows, ...
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

__all__ = ["RunCounts", "TaskCounts"]


@dataclass(frozen=True)
class TaskCounts:
    """Base of a kind's own counters: subclass it with one defaulted field per counter its workers emit.

    >>> @dataclass(frozen=True)
    ... class DemoCounts(TaskCounts):
    ...     pages: int = 0
    >>> RunCounts.from_merged({"pages": 2, "rows": 2}, task=DemoCounts).task.pages
    2
    """


@dataclass(frozen=True)
class RunCounts:
    """The counters of one run, summed over the tasks whose rows were written (zeros where nothing counted)."""

    # rows and their statuses
    rows: int = 0
    chunks: int = 0
    status: dict[str, int] = field(default_factory=dict)
    row_errors: int = 0
    # batches: totals, histogram of sizes, per-batch metrics (pipeline.metrics.batch_metrics reads those)
    batches: int = 0
    batch_rows: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    batch_sizes: dict[str, int] = field(default_factory=dict)
    by_length: dict[str, Any] = field(default_factory=dict)
    timeline: dict[str, Any] = field(default_factory=dict)
    timeline_bucket_s: dict[str, int] = field(default_factory=dict)
    slow_batches: dict[str, Any] = field(default_factory=dict)
    # workers and tasks
    tasks_per_worker: dict[str, int] = field(default_factory=dict)
    rows_per_worker: dict[str, int] = field(default_factory=dict)
    torch_threads: dict[str, int] = field(default_factory=dict)
    progress_rows: int = 0
    progress_tokens: int = 0
    # model loads and what each chose
    model_loads: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0
    infer_seconds: float = 0.0
    # sketching the output as it was scored (pipeline.sketches), summed over tasks: what the profile costs
    profile_seconds: float = 0.0
    precision_used: dict[str, int] = field(default_factory=dict)
    precision_fallbacks: dict[str, int] = field(default_factory=dict)
    precision_checks: dict[str, int] = field(default_factory=dict)
    precision_auto: dict[str, int] = field(default_factory=dict)
    generation_backend: dict[str, int] = field(default_factory=dict)
    # what went wrong and was recovered
    task_retries: int = 0
    oom_splits: int = 0
    adaptive_splits: int = 0
    poison_bisections: int = 0
    staging_errors: int = 0
    # a rerun of a killed run: tasks and rows reused from staged output
    resumed_tasks: int = 0
    rows_reused: int = 0
    # generation and served models
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generate_seconds: float = 0.0
    generate_batch_failures: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    endpoint: dict[str, float] = field(default_factory=dict)
    # the output's profile: mergeable sketches of what the rows say (pipeline.sketches), compared before the commit
    profile: dict[str, Any] = field(default_factory=dict)
    # the kind's own counters (a TaskCounts subclass; the base has none)
    task: TaskCounts = field(default_factory=TaskCounts)

    _NOT_COUNTERS: ClassVar[frozenset[str]] = frozenset({"task"})

    @classmethod
    def known(cls, task: type[TaskCounts] = TaskCounts) -> list[str]:
        """Every counter name a run of a kind with ``task`` counters may carry, sorted."""
        return sorted({**_counter_fields(cls, exclude=cls._NOT_COUNTERS), **_counter_fields(task)})

    @classmethod
    def from_merged(cls, merged: Mapping[str, Any], *, task: type[TaskCounts] = TaskCounts) -> "RunCounts":
        """The typed counts of ``merged`` (:func:`pipeline.metrics.merge_counts` of the tasks' counts).

        Raises ``ValueError`` for a key that is neither a field here nor one of ``task``'s, or that
        holds the wrong shape (a number where a mapping belongs, or the other way round).
        """
        own = _counter_fields(cls, exclude=cls._NOT_COUNTERS)
        theirs = _counter_fields(task)
        both = own.keys() & theirs.keys()
        if both:
            raise ValueError(f"{task.__name__} declares counters that every run has already: "
                             f"{', '.join(sorted(both))}; rename them")
        values: dict[str, dict[str, Any]] = {"own": {}, "task": {}}
        for key, value in merged.items():
            if key in own:
                values["own"][key] = _typed(key, value, own[key])
            elif key in theirs:
                values["task"][key] = _typed(key, value, theirs[key])
            else:
                raise ValueError(f"unknown counter {key!r} in the merged worker counts; known: "
                                 f"{', '.join(sorted({**own, **theirs}))} (a kind declares its own counters "
                                 "in a TaskCounts subclass)")
        return cls(**values["own"], task=task(**values["task"]))


def _counter_fields(cls: type, *, exclude: frozenset[str] = frozenset()) -> dict[str, str]:
    """``{name: declared type}`` of a dataclass's fields (types as written: ``int``, ``float``, ``dict[...]``)."""
    return {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            for f in dataclasses.fields(cls) if f.name not in exclude}


def _typed(key: str, value: Any, declared: str) -> Any:
    """``value`` as its field declares it: a mapping copied, a number as int or float."""
    if declared.startswith(("dict", "Mapping")):
        if not isinstance(value, Mapping):
            raise ValueError(f"counter {key!r} should be a mapping of numbers, got {value!r}")
        return dict(value)
    if isinstance(value, Mapping) or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"counter {key!r} should be a number, got {value!r}")
    return float(value) if declared == "float" else value
