"""What makes two runs the same run: every identity a run carries, computed here and nowhere else.

A nightly job is retried (the driver died, the scheduler ran it again), rerun (the day was deleted)
and changed (a new model). Each of the names below answers one question about that:

- the **run id** (``run.run_id``, else a fresh one): which *try* this is; every try gets its own;
- the **run key** (:func:`run_key`): which *logical run* this is: the same for every retry of it (the
  Delta transaction id of its commits, the name of its staged output), different for another day,
  another source version, another model revision or another result-changing setting;
- the **task fingerprint** (:func:`pipeline.config.fingerprint.task_fingerprint`): what a *row's output*
  depends on (model revision and result-changing settings, not the run date);
- the **config hash** (:func:`config_hash`): which *settings* a run used, for the runs table;
- the **plan key** (:func:`plan_key`): which *staged plan* a rerun may resume (the run key, the
  source version, the fingerprint, the rows and tasks planned, the fault drills).

What each leaves out is written once, in :data:`RUN_KEY_IGNORES` and :data:`CONFIG_HASH_IGNORES`.
The relations, as a retry, a rerun and a change see them:

>>> from pipeline.config import build_config
>>> raw = {"job": "j", "source": {"path": "/d"}, "model": {"path": "/m"}, "task": {"kind": "embed"},
...        "sink": {"path": "/out"}, "run": {"ds": "2026-11-29"}}
>>> def ident(data, *, revision="r1", snapshot="delta:t:3", try_id="t1"):
...     return run_identity(build_config(data), model_revision=revision, source_snapshot=snapshot, try_id=try_id)
>>> first, retry = ident(raw), ident(raw, try_id="t2")
>>> retry.run_key == first.run_key, retry.run_id != first.run_id, retry.try_id != first.try_id
(True, True, True)
>>> ident({**raw, "run": {"ds": "2026-11-29", "progress": False}}).run_key == first.run_key  # not a result
True
>>> ident({**raw, "run": {"ds": "2026-11-29", "accept_drift": True}}).run_key == first.run_key  # publishes what was staged
True
>>> ident({**raw, "run": {"ds": "2026-11-29", "submit_only": True}}).run_key == first.run_key  # collected by the next
True
>>> ident(raw, snapshot="delta:t:4").run_key == first.run_key, ident(raw, revision="r2").run_key == first.run_key
(False, False)
>>> ident({**raw, "run": {"ds": "2026-11-30"}}).run_key == first.run_key  # another day
False
>>> ident({**raw, "run": {"ds": "2026-11-30"}}).task_fingerprint == first.task_fingerprint  # same outputs
True
>>> first.retry_of_gone_rows().app_id == f"{first.run_key}-{first.run_id}"  # its rows went: its own commit
True

This module is pure (no pyspark, no I/O).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.config import JobConfig
from pipeline.config.fingerprint import drop_keys, task_fingerprint

__all__ = [
    "CONFIG_HASH_IGNORES", "RUN_KEY_IGNORES", "RunIdentity", "config_hash", "new_id", "plan_key", "run_identity",
    "run_key", "run_settings",
]

# settings two tries of one logical run may differ in without changing what it writes (None: the whole section)
RUN_KEY_IGNORES: Mapping[str, frozenset[str] | None] = {
    "spark": None,
    "storage": None,  # how the store is reached (keys rotate), not what is written
    "run": frozenset({"run_id", "progress", "progress_interval_s", "sample_rows", "log_format", "summary_path",
                      "faults", "runs_path", "report_path", "mlflow", "staging", "staging_path",
                      "staging_max_age_hours", "min_rows_fraction", "allow_empty", "max_tokens", "quality",
                      "accept_drift", "record", "submit_only"}),
}
# what the runs table's config hash leaves out: the run's date and try, how the store is reached, and how the
# run's lines look (a nightly job switched to JSON lines keeps its hash)
CONFIG_HASH_IGNORES: Mapping[str, frozenset[str] | None] = {
    "storage": None,
    "run": frozenset({"ds", "run_id", "log_format", "accept_drift", "submit_only"}),
}


def new_id() -> str:
    """A fresh 16-hex-digit id (a run id or a try id)."""
    return uuid.uuid4().hex[:16]


def _without(settings: Mapping[str, Any], ignores: Mapping[str, frozenset[str] | None]) -> dict[str, Any]:
    dumped = dict(settings)
    for section, keys in ignores.items():
        if keys is None:
            dumped.pop(section, None)
        elif isinstance(dumped.get(section), dict):
            dumped[section] = {k: v for k, v in dumped[section].items() if k not in keys}
    return dumped


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def run_settings(config: JobConfig) -> dict[str, Any]:
    """The config as JSON without the settings two tries of one run may differ in: :data:`RUN_KEY_IGNORES`,
    and the task's own per-try settings (a served model's address and limits: ``per_try_settings``)."""
    per_try = [f"task.{p}" for p in getattr(type(config.task), "per_try_settings", ())]
    return _without(drop_keys(config.model_dump(mode="json"), per_try), RUN_KEY_IGNORES)


def run_key(job: str, settings: Mapping[str, Any], *, model_revision: str, source_snapshot: str | None) -> str:
    """The key of one LOGICAL run: ``sbi-<job>-<hash>``, the same for every retry of it, different otherwise.

    A hash of ``settings`` (:func:`run_settings`: the job, the output location, the run date and every
    result-changing setting), the model revision and the source snapshot (``None`` where unknown).
    It is the Delta transaction id of the run's commits and names its staged output.
    """
    key = {"config": _without(settings, RUN_KEY_IGNORES), "model_revision": model_revision,
           "source_snapshot": source_snapshot}
    return f"sbi-{job}-{_digest(key)[:32]}"


def config_hash(redacted: Mapping[str, Any]) -> str:
    """sha256 (16 hex digits) of the redacted config without :data:`CONFIG_HASH_IGNORES`: same settings, same hash.

    >>> config_hash({"job": "a", "run": {"ds": "2026-01-01"}}) == config_hash({"job": "a", "run": {"ds": "2026-01-02"}})
    True
    """
    data = json.loads(json.dumps(redacted, default=str))
    return hashlib.sha256(json.dumps(_without(data, CONFIG_HASH_IGNORES), sort_keys=True).encode()).hexdigest()[:16]


def plan_key(run_key: str, source_version: str | None, fingerprint: str, *, rows: int, tasks: int,
             drills: str = "") -> str:
    """The name of a staged plan's folder: a hash of every value a reuse of its output depends on.

    >>> a = plan_key("sbi-j-1", "delta:3", "fp", rows=10, tasks=2)
    >>> len(a), a == plan_key("sbi-j-1", "delta:4", "fp", rows=10, tasks=2), a == plan_key("sbi-j-1", "delta:3", "fp", rows=10, tasks=2)
    (24, False, True)
    """
    fields = [run_key, source_version, fingerprint, rows, tasks, drills]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class RunIdentity:
    """One try of one logical run, named every way the run needs (see the module's docstring).

    ``app_id`` is the Delta transaction id its commits carry: the run key, or, once the rows a landed
    commit of this run stood for are gone from the output (:meth:`retry_of_gone_rows`), the run key
    with this try's run id, so the missing rows are committed rather than skipped as already there.
    ``txn_version`` is the transaction's version: 0 for a run; a stream's micro-batch carries its query's
    app id and its batch id (:meth:`micro_batch`), so a micro-batch run again after a crash commits nothing
    twice.
    """

    job: str
    run_id: str
    ds: dt.date
    run_key: str
    app_id: str
    task_fingerprint: str
    source_snapshot: str | None
    try_id: str
    txn_version: int = 0

    def retry_of_gone_rows(self) -> RunIdentity:
        return dataclasses.replace(self, app_id=f"{self.run_key}-{self.run_id}")

    def micro_batch(self, *, app_id: str, batch_id: int, run_id: str, ds: dt.date) -> RunIdentity:
        """Micro-batch ``batch_id`` of a stream whose query commits as ``app_id``, recorded under ``run_id``.

        >>> from pipeline.config import build_config
        >>> raw = {"job": "j", "source": {"path": "/d"}, "model": {"path": "/m"}, "task": {"kind": "embed"},
        ...        "sink": {"path": "/out"}}
        >>> stream = run_identity(build_config(raw), model_revision="r1", source_snapshot=None, try_id="t1")
        >>> b = stream.micro_batch(app_id="sbi-j-stream-q1", batch_id=7, run_id="r", ds=dt.date(2026, 12, 1))
        >>> b.app_id, b.txn_version, b.run_key, b.task_fingerprint == stream.task_fingerprint
        ('sbi-j-stream-q1', 7, 'sbi-j-stream-q1-7', True)
        """
        return dataclasses.replace(self, app_id=app_id, txn_version=batch_id, run_key=f"{app_id}-{batch_id}",
                                   run_id=run_id, ds=ds)


def run_identity(config: JobConfig, *, model_revision: str, source_snapshot: str | None,
                 try_id: str | None = None) -> RunIdentity:
    """The identity of this try of ``config``'s run (``run.run_id`` and ``run.ds`` as given, else fresh/today)."""
    key = run_key(config.job, run_settings(config), model_revision=model_revision, source_snapshot=source_snapshot)
    return RunIdentity(job=config.job, run_id=config.run.resolved_run_id(), ds=config.run.resolved_ds(),
                       run_key=key, app_id=key, task_fingerprint=task_fingerprint(config, revision=model_revision),
                       source_snapshot=source_snapshot, try_id=try_id or new_id())
