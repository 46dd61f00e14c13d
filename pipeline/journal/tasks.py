"""The worker side of staging: one inference task's rows kept in its plan folder, and the digest of its input.

What makes a staged task reusable:

- A task's marker ``task-<n>.done.json`` is written last, atomically (a temp
  file, fsync, ``os.replace``), after the rows file it names. A task killed
  while writing leaves no marker, and its half-written file is never read.
  On a mount that refuses renames (a Unity Catalog Volume) the marker names the
  rows file under its temp name and is written in place
  (:func:`~pipeline.journal.layout.write_atomic`): torn, it does not parse.
- The marker records a digest of the task's input rows (:class:`InputDigest`:
  the row count and an order-free hash of ``id`` and ``content_hash``). A
  rerun reuses the task only when the rows dealt to it now digest the same,
  so a plan that dealt rows differently scores them again.
- A retried or speculative attempt writes a rows file of its own and then
  its marker: the marker always names a whole file of one attempt.

Plain values in (a plan folder, a task number); no Spark: ``pipeline.spark.udf``
calls :class:`TaskStage` from each task.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.journal.layout import MARKER_SUFFIX, read_json, rename_refused, write_atomic

__all__ = ["InputDigest", "TaskStage"]


class InputDigest:
    """The row count and an order-free hash of a task's input rows (``id`` and ``content_hash``).

    >>> a, b = InputDigest(), InputDigest()
    >>> a.update(pa.record_batch({"id": [1, 2], "content_hash": ["x", "y"]}))
    >>> b.update(pa.record_batch({"id": [2, 1], "content_hash": ["y", "x"]}))
    >>> a.value() == b.value(), a.value().startswith("2:")
    (True, True)
    """

    def __init__(self) -> None:
        self.rows = 0
        self.total = 0

    def update(self, batch: pa.RecordBatch) -> None:
        names = [c for c in ("id", "content_hash") if c in batch.schema.names] or batch.schema.names
        for row in zip(*(batch.column(c).to_pylist() for c in names)):
            digest = hashlib.blake2b(repr(row).encode(), digest_size=8).digest()
            self.total = (self.total + int.from_bytes(digest, "little")) % (1 << 64)
        self.rows += batch.num_rows

    def value(self) -> str:
        return f"{self.rows}:{self.total:016x}"


class TaskStage:
    """Worker side: one inference task's staged output in a plan folder.

    ``reusable(digest)`` gives the staged rows and counts of a finished try whose input digested the
    same; otherwise the task scores, calls ``add`` with every output batch and ``finish`` at its end.
    Staging never fails a task: a folder this host cannot see (a Spark Connect server elsewhere) or a
    write that fails turns it off for the task (``failed``), which then just is not reusable.
    """

    def __init__(self, folder: str, task: int) -> None:
        self.folder, self.task = Path(folder), task
        self.marker = self.folder / f"task-{task}{MARKER_SUFFIX}"
        self._name = f"task-{task}.{uuid.uuid4().hex[:12]}.arrow"
        self._tmp = self.folder / f".{self._name}.tmp"
        self._file: Any = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self.rows = 0
        self.failed = not self.folder.is_dir()

    def has_marker(self) -> bool:
        return self.marker.exists()

    def reusable(self, digest: str) -> tuple[pa.Table, dict[str, Any]] | None:
        """``(rows, counts)`` staged by a finished try of this task with the same input, else None."""
        found = read_json(self.marker)
        if not found or found.get("input") != digest or found.get("plan") != self.folder.name:
            return None
        try:
            with pa.OSFile(str(self.folder / found["data"]), "rb") as f:
                table = pa.ipc.open_stream(f).read_all()
        except (OSError, KeyError, pa.ArrowInvalid):
            return None
        if table.num_rows != found.get("rows"):
            return None
        return table, dict(found.get("counts") or {})

    def add(self, batch: pa.RecordBatch) -> None:
        """Append ``batch`` (an output batch of this task) to this attempt's rows file."""
        if self.failed:
            return
        try:
            if self._writer is None:
                self._file = open(self._tmp, "wb")
                self._writer = pa.ipc.new_stream(self._file, batch.schema)
            self._writer.write_batch(batch)
        except (OSError, pa.ArrowException):
            self.abandon()
            return
        self.rows += batch.num_rows

    def finish(self, *, digest: str, counts: dict[str, Any]) -> None:
        """Make this attempt's rows durable, then write the marker that names them (last, atomically)."""
        if self._writer is None or self.failed:
            return  # no rows (nothing to reuse), or staging failed for this task
        try:
            self._writer.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            data = self._name
            try:
                os.replace(self._tmp, self.folder / self._name)
            except OSError as exc:
                if not rename_refused(exc):
                    raise
                data = self._tmp.name  # a mount without renames: the marker names the file where it is
            marker = {"task": self.task, "plan": self.folder.name, "input": digest, "rows": self.rows,
                      "data": data, "counts": counts, "at": time.time()}
            write_atomic(self.marker, json.dumps(marker, default=str).encode())
        except (OSError, pa.ArrowException):  # a full or read-only disk: this task is just not reusable
            self.abandon()
            (self.folder / self._name).unlink(missing_ok=True)

    def abandon(self) -> None:
        """Drop this attempt's unfinished rows file (the task failed or staging failed)."""
        self.failed = True
        try:
            if self._file is not None:
                self._file.close()
        except OSError:  # on a full disk closing fails too (it flushes what is buffered): the file goes anyway
            pass
        try:
            self._tmp.unlink(missing_ok=True)
        except OSError:
            pass
