"""The merged worker counts of a run, typed: one attribute per counter, so a misspelt name fails loudly.

Executors count into plain dicts keyed by name (:class:`pipeline.core.metrics.WorkerCounts`),
because those travel as JSON with the data and merge by adding up. On the
driver a string key read with ``counts.get("tokns", 0)`` would quietly read 0;
:meth:`RunCounts.from_merged` instead reads every key once, into a frozen
dataclass, and refuses a key nobody declared, naming it and the known ones.

The counters every kind's workers emit (the worker loop, batching, model
loads, retries, generation and the endpoint client) are fields of
:class:`RunCounts`, each declared once, in one line, with :func:`counter`: how it
merges, whether it counts the work of scoring (what a task reused from staged
output did not do: :data:`WORK_KEYS`, which :func:`pipeline.core.metrics.reused_counts`
drops) and which field of the end-of-run summary it fills
(:meth:`RunCounts.summary_fields`, read by the one summary builder of batch runs
and streams alike). A kind with counters of its own declares them as a
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
from typing import Any, ClassVar, Literal, Mapping

__all__ = ["BY_KEY", "SUM", "WORK_KEYS", "RunCounts", "TaskCounts", "counter"]

# how the tasks' values of a counter add up (pipeline.core.metrics.merge_counts): a number summed, or a mapping
# summed key by key (its leaves numbers, or mappings summed the same way, or lists of numbers summed as vectors)
SUM = "sum"
BY_KEY = "by-key"
Merge = Literal["sum", "by-key"]


def counter(merge: Merge = SUM, *, work: bool = False, summary: str | None = None, default: float = 0) -> Any:
    """A counter field of :class:`RunCounts` (or of a :class:`TaskCounts` subclass): the whole declaration.

    The field's name is the key the workers count under (:class:`pipeline.core.metrics.WorkerCounts`). ``work`` and
    ``summary`` are read on :class:`RunCounts`' own counters; a kind's counters reach the summary through its
    job's ``summary_lines``, and are kept for a reused task.

    Args:
        merge: :data:`SUM` (a number; ``default`` when nothing counted) or :data:`BY_KEY` (a mapping; empty).
        work: it counts the work of scoring, which a task reused from staged output did not do in this run
            (:data:`WORK_KEYS`); the counts of rows and what they say are not work.
        summary: the :class:`~pipeline.core.run_summary.RunSummary` field it fills, None: none (read otherwise, e.g. by
            :func:`pipeline.core.metrics.batch_metrics`); several counters naming one field fill it as a mapping of
            those that counted, by counter name, in the order declared. The summary declares its field from
            this (:meth:`RunCounts.summary_types`): a new ``summary=`` is a new summary field.
        default: a number counter's zero (``0.0`` for seconds).

    >>> @dataclass(frozen=True)
    ... class DemoCounts(TaskCounts):
    ...     pages: int = counter()
    ...     page_sizes: dict[str, int] = counter(BY_KEY)
    >>> RunCounts.from_merged({"page_sizes": {"a4": 2}}, task=DemoCounts).task
    DemoCounts(pages=0, page_sizes={'a4': 2})
    """
    meta = {"merge": merge, "work": work, "summary": summary}
    if merge == BY_KEY:
        return field(default_factory=dict, metadata=meta)
    if merge != SUM:
        raise ValueError(f"counter merge {merge!r}: use {SUM!r} or {BY_KEY!r}")
    return field(default=default, metadata=meta)


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
    """The counters of one run, summed over the tasks whose rows were written (zeros where nothing counted).

    Each field is one counter, declared once with :func:`counter`: its name is the workers' key, its ``merge``
    how the tasks' values add up, ``work`` whether it counts the work of scoring (:data:`WORK_KEYS`), and
    ``summary`` the :class:`~pipeline.core.run_summary.RunSummary` field it fills (:meth:`summary_fields`), so a batch
    run's summary and a stream's get the same fields.
    """

    # rows and their statuses
    rows: int = counter()
    chunks: int = counter()
    status: dict[str, int] = counter(BY_KEY, summary="status")
    row_errors: int = counter()
    # batches: totals, histogram of sizes, per-batch metrics (pipeline.core.metrics.batch_metrics reads those)
    batches: int = counter(work=True, summary="batches")
    batch_rows: int = counter(work=True)
    tokens: int = counter(work=True, summary="tokens")
    padded_tokens: int = counter(work=True, summary="padded_tokens")
    batch_sizes: dict[str, int] = counter(BY_KEY, work=True, summary="batch_sizes")
    by_length: dict[str, Any] = counter(BY_KEY, work=True)
    timeline: dict[str, Any] = counter(BY_KEY, work=True)
    timeline_bucket_s: dict[str, int] = counter(BY_KEY, work=True)
    slow_batches: dict[str, Any] = counter(BY_KEY, work=True)
    # workers and tasks (rows_per_worker: the rows each Python worker scored)
    tasks_per_worker: dict[str, int] = counter(BY_KEY, work=True)
    rows_per_worker: dict[str, int] = counter(BY_KEY, work=True, summary="rows_per_worker")
    torch_threads: dict[str, int] = counter(BY_KEY, work=True)
    progress_rows: int = counter(work=True)
    progress_tokens: int = counter()
    # model loads and what each chose; seconds summed over workers: loading models, and running the task on chunks
    model_loads: dict[str, int] = counter(BY_KEY, work=True, summary="model_loads")
    load_seconds: float = counter(work=True, summary="load_seconds", default=0.0)
    infer_seconds: float = counter(work=True, summary="infer_seconds", default=0.0)
    # sketching the output as it was scored (pipeline.core.sketches), summed over tasks: what the profile costs
    profile_seconds: float = counter(work=True, summary="profile_seconds", default=0.0)
    # model loads per precision actually used, accuracy-gate fallbacks with their reason, the gate's measured
    # figures per check ("int8: mean cosine ..., on 256 run rows (pass)": loads), what model.precision auto chose
    # ("auto -> int8": loads), and per generation backend and batching mode ({"vllm (continuous)": 2})
    precision_used: dict[str, int] = counter(BY_KEY, work=True, summary="precision_used")
    precision_fallbacks: dict[str, int] = counter(BY_KEY, work=True, summary="precision_fallbacks")
    precision_checks: dict[str, int] = counter(BY_KEY, work=True, summary="precision_checks")
    precision_auto: dict[str, int] = counter(BY_KEY, work=True, summary="precision_auto")
    generation_backend: dict[str, int] = counter(BY_KEY, work=True, summary="generation_backend")
    # what went wrong and was recovered (the summary's retries: those that happened, in this order)
    oom_splits: int = counter(work=True, summary="retries")
    adaptive_splits: int = counter(work=True, summary="retries")
    poison_bisections: int = counter(work=True, summary="retries")
    task_retries: int = counter(work=True, summary="retries")
    staging_errors: int = counter()
    # a rerun of a killed run: tasks and rows reused from staged output
    resumed_tasks: int = counter(summary="resumed_tasks")
    rows_reused: int = counter(summary="rows_reused")
    # generation and embedding: the rows' token usage (for a served model, what its server reported per row,
    # answers replayed from an earlier try included); endpoint: what this try's requests did (requests, replayed,
    # retries by cause, lost_answers, failed_rows; the summary adds tokens_paid)
    prompt_tokens: int = counter(summary="prompt_tokens")
    completion_tokens: int = counter(summary="completion_tokens")
    generate_seconds: float = counter(default=0.0)
    generate_batch_failures: int = counter()
    finish_reasons: dict[str, int] = counter(BY_KEY)
    endpoint: dict[str, float] = counter(BY_KEY, work=True, summary="endpoint")
    # the output's profile: mergeable sketches of what the rows say (pipeline.core.sketches), compared before the commit
    profile: dict[str, Any] = counter(BY_KEY)
    # the kind's own counters (a TaskCounts subclass; the base has none)
    task: TaskCounts = field(default_factory=TaskCounts)

    _NOT_COUNTERS: ClassVar[frozenset[str]] = frozenset({"task"})

    @classmethod
    def known(cls, task: type[TaskCounts] = TaskCounts) -> list[str]:
        """Every counter name a run of a kind with ``task`` counters may carry, sorted."""
        return sorted({**_counter_fields(cls, exclude=cls._NOT_COUNTERS), **_counter_fields(task)})

    @classmethod
    def work_keys(cls) -> frozenset[str]:
        """The counters declared ``work=True``: what a task's counts say about the work of scoring.

        >>> {"tokens", "model_loads", "precision_checks"} <= RunCounts.work_keys(), "status" in RunCounts.work_keys()
        (True, False)
        """
        return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("work"))

    @classmethod
    def summary_targets(cls) -> dict[str, list[str]]:
        """``{RunSummary field: [the counters that fill it]}``, in the order declared.

        >>> RunCounts.summary_targets()["retries"]
        ['oom_splits', 'adaptive_splits', 'poison_bisections', 'task_retries']
        """
        targets: dict[str, list[str]] = {}
        for f in dataclasses.fields(cls):
            if f.metadata.get("summary"):
                targets.setdefault(f.metadata["summary"], []).append(f.name)
        return targets

    @classmethod
    def summary_types(cls) -> dict[str, str]:
        """``{RunSummary field: its type}`` as :meth:`summary_fields` fills it: a counter's own type, or for a field
        that several counters fill, a mapping of theirs by name. :class:`~pipeline.core.run_summary.RunSummary` declares
        these fields from here, so a counter's summary field is declared once, on the counter.

        >>> types = RunCounts.summary_types()
        >>> types["status"], types["tokens"], types["load_seconds"], types["retries"]
        ('dict[str, int]', 'int', 'float', 'dict[str, int]')
        """
        declared = {f.name: _type_name(f.type) for f in dataclasses.fields(cls)}
        return {target: declared[target] if names == [target] else f"dict[str, {declared[names[0]]}]"
                for target, names in cls.summary_targets().items()}

    def summary_fields(self) -> dict[str, Any]:
        """The :class:`~pipeline.core.run_summary.RunSummary` fields these counts fill (each counter's ``summary``), as
        the summary keeps them: a number as its field declares it, a mapping of counts with int values; a field
        that several counters fill is the mapping of those that counted, by name, in the order declared.

        >>> fields = RunCounts.from_merged({"status": {"ok": 2}, "oom_splits": 1, "task_retries": 2}).summary_fields()
        >>> fields["status"], fields["retries"], fields["load_seconds"]
        ({'ok': 2}, {'oom_splits': 1, 'task_retries': 2}, 0.0)
        """
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            target = f.metadata.get("summary")
            if not target:
                continue
            value = _summary_value(getattr(self, f.name), _type_name(f.type))
            if target == f.name:
                out[target] = value
            else:
                gathered = out.setdefault(target, {})
                if value:
                    gathered[f.name] = value
        return out

    @classmethod
    def from_merged(cls, merged: Mapping[str, Any], *, task: type[TaskCounts] = TaskCounts) -> "RunCounts":
        """The typed counts of ``merged`` (:func:`pipeline.core.metrics.merge_counts` of the tasks' counts).

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


# what a task's counts say about the work of scoring (not about its output rows): a task reused from
# staged output did none of it in this run (pipeline.core.metrics.reused_counts drops them)
WORK_KEYS = RunCounts.work_keys()


def _type_name(declared: Any) -> str:
    """A field's type as written: ``int``, ``float``, ``dict[str, int]``."""
    return declared if isinstance(declared, str) else getattr(declared, "__name__", str(declared))


def _counter_fields(cls: type, *, exclude: frozenset[str] = frozenset()) -> dict[str, dataclasses.Field]:
    """``{name: field}`` of a dataclass's counters."""
    return {f.name: f for f in dataclasses.fields(cls) if f.name not in exclude}


def _merge(declared: dataclasses.Field) -> str:
    """How a counter merges: as :func:`counter` declared it, else as its type says (a mapping by key)."""
    return declared.metadata.get("merge") or (
        BY_KEY if _type_name(declared.type).startswith(("dict", "Mapping")) else SUM)


def _typed(key: str, value: Any, declared: dataclasses.Field) -> Any:
    """``value`` as its field declares it: a mapping copied, a number as int or float."""
    if _merge(declared) == BY_KEY:
        if not isinstance(value, Mapping):
            raise ValueError(f"counter {key!r} should be a mapping of numbers, got {value!r}")
        return dict(value)
    if isinstance(value, Mapping) or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"counter {key!r} should be a number, got {value!r}")
    return float(value) if _type_name(declared.type) == "float" else value


def _summary_value(value: Any, declared: str) -> Any:
    """A counter's value as the summary keeps it: ``int``/``float`` as declared, ``dict[str, int]`` with int
    values, any other mapping copied."""
    if declared == "dict[str, int]":
        return {k: int(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return dict(value)
    return float(value) if declared == "float" else int(value)
