"""The batch journal of one run: its request files, the ids the provider gave them, their results, the answers.

A run in ``task.endpoint.mode: batch`` keeps everything it sends to and gets from the provider's batch API
in a plan folder of its own (:func:`batch_plan`: keyed by the run key alone, so a rerun on another cluster,
with another number of tasks, finds it), written from the driver:

- ``batch-<n>.requests.jsonl``: request file ``n`` (:mod:`pipeline.endpoint.batch_wire`), written whole
  before anything is uploaded; its keys are never put in another file, unless the provider did not
  answer them (then a later file of a later ``round`` holds them again);
- ``batch-<n>.json``: the file's state (:class:`BatchFile`), rewritten atomically the moment the provider
  returns an id (file id, batch id) or a new state, so a killed driver's rerun polls the batch it created
  instead of creating another;
- ``batch-<n>.output.jsonl``, ``batch-<n>.errors.jsonl``: the provider's output and error files, kept
  as downloaded: collected once, never asked for again;
- ``answers/part-<n>.jsonl``, ``answers/part-failed.jsonl``: one line per request key, its answer or why
  there is none, the input the scoring pass joins to the rows by key (``answers/_done.json`` once whole).

Every file is written whole or not at all (:func:`pipeline.journal.layout.write_atomic`; the provider's result
files and the answers streamed the same way: a temp file, fsync, rename). Plain values in; no Spark.
"""

from __future__ import annotations

import json
import os
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from pipeline.journal.layout import read_json, write_atomic
from pipeline.journal.plans import StagePlan

__all__ = ["ANSWERS", "BatchFile", "BatchLog", "batch_plan"]

ANSWERS = "answers"
_DONE = "_done.json"
# what a StagePlan of a run's batch journal carries where a task plan has its drills (rows and tasks are 0)
_BATCH_PLAN = "batch api"


def batch_plan(*, run_key: str, source_version: str | None, task_fingerprint: str, job: str, ds: str) -> StagePlan:
    """The plan whose folder holds a run's batch journal: one per run key (no rows or tasks in its key)."""
    return StagePlan(run_key=run_key, source_version=source_version, task_fingerprint=task_fingerprint, rows=0,
                     tasks=0, job=job, ds=ds, drills=_BATCH_PLAN)


@contextmanager
def _atomic(path: Path) -> Iterator[BinaryIO]:
    """A file written in place of ``path`` whole or not at all (as :func:`write_atomic`, streamed)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass
class BatchFile:
    """What the journal knows of request file ``n``: its requests, and what the provider made of it so far.

    ``status`` is ``written`` until a batch exists, then the batch's own state; ``creating`` is set before the
    create is sent (a rerun that finds it without a ``batch_id`` looks the batch up by its metadata first).
    """

    n: int
    requests: int
    estimate: int
    round: int = 1
    status: str = "written"
    file_id: str | None = None
    creating: bool = False
    batch_id: str | None = None
    submitted_by: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    created_at: float | None = None
    ended_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: str | None = None
    collected: bool = False
    collected_by: str | None = None
    answered: int = 0
    failed: int = 0
    tokens: int = 0

    @property
    def name(self) -> str:
        return f"batch-{self.n:05d}"

    def summary(self) -> dict[str, Any]:
        """What the run's summary and runs table show of this batch."""
        return {"file": self.n, "batch_id": self.batch_id, "status": self.status, "round": self.round,
                "requests": self.requests, "answered": self.answered, "failed": self.failed, "tokens": self.tokens,
                "created_at": self.created_at, "ended_at": self.ended_at}


class BatchLog:
    """The batch journal in ``folder`` (see the module docstring).

    >>> import tempfile
    >>> log = BatchLog(tempfile.mkdtemp())
    >>> f = log.add_file([("k1", '{"custom_id": "k1"}', 10), ("k2", '{"custom_id": "k2"}', 12)], round=1)
    >>> f.name, f.requests, f.estimate, sorted(log.submitted_keys())
    ('batch-00000', 2, 22, ['k1', 'k2'])
    >>> f.file_id = "file-1"; log.save(f)
    >>> [g.file_id for g in BatchLog(log.folder).files()]
    ['file-1']
    """

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def answers_dir(self) -> str:
        return str(self.folder / ANSWERS)

    def files(self) -> list[BatchFile]:
        """Every request file whose state was journaled, in order (a request file without one is ignored:
        its writer died before it was complete, and its keys are still unsubmitted)."""
        found = []
        for path in sorted(self.folder.glob("batch-*.json")):
            state = read_json(path)
            if isinstance(state, dict) and (self.folder / f"{path.stem}.requests.jsonl").exists():
                known = {f.name for f in fields(BatchFile)}
                found.append(BatchFile(**{k: v for k, v in state.items() if k in known}))
        return sorted(found, key=lambda f: f.n)

    def keys_of(self, batch: BatchFile) -> list[str]:
        """The request keys (custom ids) of a request file, in its order."""
        return [json.loads(line)["custom_id"] for line in self.request_lines(batch)]

    def submitted_keys(self) -> dict[str, int]:
        """``{key: request files holding it}`` over every journaled file (a key in two: submitted again)."""
        seen: dict[str, int] = {}
        for batch in self.files():
            for key in self.keys_of(batch):
                seen[key] = seen.get(key, 0) + 1
        return seen

    def add_file(self, lines: list[tuple[str, str, int]], *, round: int) -> BatchFile:
        """Journal a new request file of ``(key, request line, estimate)``: the file, then its state."""
        n = max((f.n for f in self.files()), default=-1) + 1
        batch = BatchFile(n=n, requests=len(lines), estimate=sum(e for _, _, e in lines), round=round)
        write_atomic(self.folder / f"{batch.name}.requests.jsonl", "".join(f"{l}\n" for _, l, _ in lines).encode())
        self.save(batch)
        return batch

    def request_lines(self, batch: BatchFile) -> Iterator[str]:
        """The request lines of a request file, in its order."""
        return self._lines(f"{batch.name}.requests.jsonl")

    def request_bytes(self, batch: BatchFile) -> bytes:
        return (self.folder / f"{batch.name}.requests.jsonl").read_bytes()

    def save(self, batch: BatchFile) -> None:
        """The file's state, durable before this returns."""
        write_atomic(self.folder / f"{batch.name}.json", json.dumps(asdict(batch), sort_keys=True).encode())

    def save_results(self, batch: BatchFile, *, output: bytes, errors: bytes) -> None:
        """The provider's output and error files of ``batch`` from bytes (see :meth:`result_file`)."""
        for suffix, data in (("output", output), ("errors", errors)):
            with self.result_file(batch, suffix) as f:
                f.write(data)

    @contextmanager
    def result_file(self, batch: BatchFile, suffix: str) -> Iterator[BinaryIO]:
        """A file to download ``batch``'s ``output`` or ``errors`` file into: in place, whole, once the block
        ends without an error (a temp file, fsync, rename); nothing when it fails."""
        path = self.folder / f"{batch.name}.{suffix}.jsonl"
        with _atomic(path) as f:
            yield f

    def result_lines(self, batch: BatchFile) -> Iterator[str]:
        """The lines of ``batch``'s output file, then of its error file."""
        for suffix in ("output", "errors"):
            yield from self._lines(f"{batch.name}.{suffix}.jsonl")

    def _lines(self, name: str) -> Iterator[str]:
        path = self.folder / name
        if not path.exists():
            return
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield line

    # -- the answers the scoring pass joins ------------------------------------------------------------
    def answers_done(self, files: Iterable[BatchFile]) -> bool:
        """Whether ``answers/`` was written whole from exactly these collected files."""
        done = read_json(Path(self.answers_dir) / _DONE)
        return isinstance(done, dict) and done.get("files") == sorted(f.n for f in files)

    def write_answers(self, parts: Iterable[tuple[str, Iterable[str]]], files: Iterable[BatchFile]) -> None:
        """Replace ``answers/`` with ``parts`` (``(part name, JSON lines)``, streamed), then mark it whole."""
        folder = Path(self.answers_dir)
        folder.mkdir(exist_ok=True)
        (folder / _DONE).unlink(missing_ok=True)
        keep = set()
        for name, lines in parts:
            keep.add(f"part-{name}.jsonl")
            with _atomic(folder / f"part-{name}.jsonl") as f:
                for line in lines:
                    f.write(f"{line}\n".encode())
        for path in folder.glob("part-*.jsonl"):
            if path.name not in keep:
                os.remove(path)
        write_atomic(folder / _DONE, json.dumps({"files": sorted(f.n for f in files)}).encode())
