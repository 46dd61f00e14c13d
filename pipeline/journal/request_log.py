"""Answers a run paid for, kept as they arrive: no row is requested twice, and a token budget spans the tasks.

A row sent to a served model costs money the moment the server answers. The
task's staged output (:mod:`pipeline.journal.tasks`) is written when the task
ends, so a task attempt that dies half-way (a killed worker, a run stopped by
its token budget) would otherwise pay again, on its retry or on the rerun, for
every row it had been answered. So each answer is appended to the task's
journal the moment it arrives, fsynced, before the row is used:

``<plan folder>/requests/task-<n>/<attempt>.jsonl``: one JSON line per answered request,
``{"key": <sha256 of the request>, "answer": {...}, "tokens": n}``. Every attempt of task ``n``, of
every try of the plan, reads all of them first and replays what they hold. A line cut short
by a crash does not parse and is ignored (that request is sent again: its answer never
reached the row).

``<plan folder>/usage/<try id>/<task>-<attempt>.json``: what each attempt of this try has spent
and holds reserved, rewritten (atomically) as it changes, at most every ``publish_s``: the
tasks of one try read each other's to hold ``run.max_tokens`` together. A run in batch mode
(:mod:`pipeline.journal.batch_log`) adds ``usage/<try id>/batch-<12 hex>.json``: what the answers this try
collected from the provider's batch API used (:func:`record_batch_usage`).

Plain values in (a folder, ids); no Spark. The plan folder is the run's staging
folder, so the journal lives and goes with the staged output (removed once the
run's commit landed).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Mapping

__all__ = ["RequestLog", "record_batch_usage", "try_usage"]


class RequestLog:
    """One task attempt's journal of answered requests and its share of its try's token ledger.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> first = RequestLog(folder, task=0, try_id="t1")
    >>> first.record("k1", {"choices": []}, tokens=12)
    >>> retry = RequestLog(folder, task=0, try_id="t1")
    >>> sorted(retry.answered()), retry.spent_by_try()
    (['k1'], 12)
    >>> RequestLog(folder, task=1, try_id="t2").spent_by_try()   # another try's budget starts at 0
    0
    """

    def __init__(self, folder: str, *, task: int, try_id: str, publish_s: float = 0.2) -> None:
        self.task, self.try_id = task, try_id
        self.journal_dir = Path(folder) / "requests" / f"task-{task}"
        self.ledger_dir = Path(folder) / "usage" / try_id
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        name = uuid.uuid4().hex[:12]
        self._journal_path = self.journal_dir / f"{name}.jsonl"
        self._ledger_path = self.ledger_dir / f"{task}-{name}.json"
        self.spent = 0
        self.reserved = 0
        self._publish_s = publish_s
        self._published_at = 0.0
        self._others = 0
        self._others_at = -1e9

    def answered(self) -> dict[str, dict[str, Any]]:
        """Every answer an earlier attempt (of any try of this plan) journaled for this task, by request key."""
        found: dict[str, dict[str, Any]] = {}
        for path in sorted(self.journal_dir.glob("*.jsonl")):
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:  # the line a crash cut short
                    continue
                if isinstance(entry, dict) and isinstance(entry.get("answer"), dict) and entry.get("key"):
                    found[str(entry["key"])] = entry["answer"]
        return found

    def record(self, key: str, answer: Mapping[str, Any], *, tokens: int) -> None:
        """Journal one answer (durable before this returns) and count its tokens against this try."""
        line = json.dumps({"key": key, "answer": answer, "tokens": int(tokens)}, separators=(",", ":"),
                          ensure_ascii=False) + "\n"
        with open(self._journal_path, "a", encoding="utf-8") as f:  # closed each time: no handle outlives the task
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.spent += int(tokens)
        self.publish()

    def publish(self, *, force: bool = False) -> None:
        """Tell the other tasks of this try what this attempt spent and holds reserved (throttled)."""
        now = time.monotonic()
        if not force and now - self._published_at < self._publish_s:
            return
        self._published_at = now
        tmp = self._ledger_path.with_name(f".{self._ledger_path.name}.tmp")
        tmp.write_text(json.dumps({"spent": self.spent, "reserved": self.reserved}))
        os.replace(tmp, self._ledger_path)

    def others(self) -> int:
        """Tokens the other attempts of this try spent or hold reserved (re-read at most every ``publish_s``)."""
        now = time.monotonic()
        if now - self._others_at >= self._publish_s:
            total = 0
            for path in self.ledger_dir.glob("*.json"):
                if path == self._ledger_path:
                    continue
                try:
                    entry = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                total += int(entry.get("spent", 0)) + int(entry.get("reserved", 0))
            self._others, self._others_at = total, now
        return self._others

    def spent_by_try(self) -> int:
        """Tokens this try has spent so far, over all its tasks (reservations of others included)."""
        return self.spent + self.others()

    def close(self) -> None:
        """Publish the final count (nothing reserved any more)."""
        self.reserved = 0
        try:
            self.publish(force=True)
        except OSError:
            pass


def try_usage(folder: str | None, try_id: str) -> int:
    """Tokens one try of the plan in ``folder`` spent on the server, over all its task attempts (0 when none)."""
    total = 0
    if not folder:
        return 0
    for path in (Path(folder) / "usage" / try_id).glob("*.json"):
        try:
            total += int(json.loads(path.read_text()).get("spent", 0))
        except (OSError, ValueError):
            continue
    return total


def record_batch_usage(folder: str, try_id: str, tokens: int) -> None:
    """Put what the batch answers this try collected used on the try's ledger (read by :func:`try_usage`).

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> record_batch_usage(folder, "t1", 120); record_batch_usage(folder, "t1", 150)
    >>> try_usage(folder, "t1")
    150
    """
    import hashlib

    from pipeline.journal.layout import write_atomic

    ledger = Path(folder) / "usage" / try_id
    ledger.mkdir(parents=True, exist_ok=True)
    # one entry per try, named by it: the collected total, replaced whole as it grows
    name = f"batch-{hashlib.sha256(try_id.encode()).hexdigest()[:12]}.json"
    write_atomic(ledger / name, json.dumps({"spent": int(tokens), "reserved": 0}).encode())
