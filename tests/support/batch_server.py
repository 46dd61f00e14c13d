"""An OpenAI-compatible batch API over the test server: ``/v1/files`` and ``/v1/batches`` in OpenAI's formats.

:class:`BatchServer` is :class:`~tests.support.openai_server.OpenAIServer` (the same tiny models, the
same answers) plus the endpoints of OpenAI's batch API: ``POST /v1/files`` (multipart, ``purpose=batch``),
``GET /v1/files/{id}`` and ``/v1/files/{id}/content``, ``POST /v1/batches``, ``GET /v1/batches`` (the
listing, with ``limit``/``after``/``has_more``) and ``GET /v1/batches/{id}``. A batch goes through
``validating``, ``in_progress`` and ``finalizing`` to ``completed`` in the server's event loop, each of its
lines answered by the live routes' own code; a request the model server refuses (the fail marker: HTTP
400) goes to the error file with its status and body, as OpenAI's error files carry them.

What a batch comes to is scripted, batch by batch in creation order (:class:`BatchScript`): ``expired``
after answering its first ``answer_first`` lines (the rest in the error file as ``batch_expired``),
``failed`` at validation (no output, ``errors`` set), ``cancelled``; ``hold`` keeps every batch
``in_progress`` until released. The server's own log is what the tests count: every upload and every
create with the request keys it held (:meth:`BatchServer.created_keys`), every line it executed
(``executed``, by request key), every poll of a batch (``polls``).
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipeline.endpoint.wire import body_key

from tests.support.openai_server import OpenAIServer, _error


@dataclass
class BatchScript:
    """What one batch comes to: ``completed``, ``expired`` (after ``answer_first`` lines), ``failed``, ``cancelled``."""

    outcome: str = "completed"
    answer_first: int = 0


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """``{field: (filename, bytes)}`` of a multipart/form-data body (the standard library's MIME parser)."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        fields[str(name)] = (part.get_filename(), part.get_payload(decode=True) or b"")
    return fields


class BatchServer(OpenAIServer):
    """The test server with OpenAI's files and batches endpoints (see the module docstring)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.files: dict[str, dict[str, Any]] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.scripts: list[BatchScript] = []
        self.log: list[dict[str, Any]] = []
        self.executed: Counter[str] = Counter()
        self.polls: Counter[str] = Counter()
        self.hold = threading.Event()
        self.hold.set()  # cleared: every batch stays in_progress until it is set again
        self.step_s = 0.05
        # runs a batch's request lines elsewhere (``vllm run-batch``: tests/generation/test_vllm_batch.py): an async
        # callable from the lines to their result lines; None: each line answered by this server's live routes
        self.run_lines: Any = None
        self._tasks: set[asyncio.Task] = set()
        self._log_lock = threading.Lock()

    # -- what the tests read --------------------------------------------------------------------------
    def mark(self) -> int:
        """Where the log is now: the calls below count from here when given it (``since``)."""
        return len(self.log)

    def uploads(self, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.log[since:] if e["event"] == "upload"]

    def creates(self, since: int = 0) -> list[dict[str, Any]]:
        return [e for e in self.log[since:] if e["event"] == "create"]

    def created_keys(self, since: int = 0) -> Counter[str]:
        """How many created batches held each request key (custom_id)."""
        return Counter(k for e in self.creates(since) for k in e["keys"])

    def created_files(self, since: int = 0) -> Counter[str]:
        """How many batches were created from each request file's content (its sha256)."""
        return Counter(e["sha256"] for e in self.creates(since))

    # -- the API --------------------------------------------------------------------------------------
    def _routes(self) -> list[Any]:
        from starlette.routing import Route

        return [*super()._routes(),
                Route("/v1/files", self._upload, methods=["POST"]),
                Route("/v1/files/{file_id}", self._file, methods=["GET"]),
                Route("/v1/files/{file_id}/content", self._content, methods=["GET"]),
                Route("/v1/batches", self._create, methods=["POST"]),
                Route("/v1/batches", self._list, methods=["GET"]),
                Route("/v1/batches/{batch_id}", self._batch, methods=["GET"])]

    def _note(self, **event: Any) -> None:
        with self._log_lock:
            self.log.append({"at": time.monotonic(), **event})

    def _file_object(self, file_id: str) -> dict[str, Any]:
        f = self.files[file_id]
        return {"id": file_id, "object": "file", "bytes": len(f["bytes"]), "created_at": f["created_at"],
                "filename": f["filename"], "purpose": f["purpose"]}

    async def _upload(self, request: Any) -> Any:
        import hashlib

        from starlette.responses import JSONResponse

        if (refused := self._refused(request)) is not None:
            return refused
        fields = _multipart(request.headers.get("content-type", ""), await request.body())
        if "file" not in fields or fields.get("purpose", (None, b""))[1] != b"batch":
            return _error(400, "a batch file upload needs a file and purpose=batch")
        filename, data = fields["file"]
        file_id = f"file-{uuid.uuid4().hex[:24]}"
        self.files[file_id] = {"bytes": data, "filename": filename or "upload.jsonl", "purpose": "batch",
                               "created_at": int(time.time())}
        self._note(event="upload", file_id=file_id, sha256=hashlib.sha256(data).hexdigest())
        return JSONResponse(self._file_object(file_id))

    async def _file(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        file_id = request.path_params["file_id"]
        if (refused := self._refused(request)) is not None:
            return refused
        return JSONResponse(self._file_object(file_id)) if file_id in self.files else _error(404, "no such file")

    async def _content(self, request: Any) -> Any:
        from starlette.responses import Response

        file_id = request.path_params["file_id"]
        if (refused := self._refused(request)) is not None:
            return refused
        if file_id not in self.files:
            return _error(404, f"no file {file_id}")
        return Response(self.files[file_id]["bytes"], media_type="application/jsonl")

    async def _create(self, request: Any) -> Any:
        import hashlib

        from starlette.responses import JSONResponse

        if (refused := self._refused(request)) is not None:
            return refused
        body = json.loads(await request.body())
        file_id = body.get("input_file_id")
        if file_id not in self.files:
            return _error(400, f"no input file {file_id!r}")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be 24h")
        data = self.files[file_id]["bytes"]
        lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        now = int(time.time())
        batch = {"id": batch_id, "object": "batch", "endpoint": body.get("endpoint"), "errors": None,
                 "input_file_id": file_id, "completion_window": "24h", "status": "validating",
                 "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
                 "expires_at": now + 86400, "finalizing_at": None, "completed_at": None, "failed_at": None,
                 "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                 "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                 "metadata": body.get("metadata") or {}}
        script = self.scripts.pop(0) if self.scripts else BatchScript()
        self.batches[batch_id] = batch
        self._note(event="create", batch_id=batch_id, file_id=file_id, sha256=hashlib.sha256(data).hexdigest(),
                   keys=[line["custom_id"] for line in lines], outcome=script.outcome)
        task = asyncio.get_running_loop().create_task(self._process(batch, lines, script))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return JSONResponse(dict(batch))

    async def _list(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if (refused := self._refused(request)) is not None:
            return refused
        limit = int(request.query_params.get("limit", 20))
        newest = sorted(self.batches.values(), key=lambda b: b["created_at"], reverse=True)
        after = request.query_params.get("after")
        if after:
            ids = [b["id"] for b in newest]
            newest = newest[ids.index(after) + 1:] if after in ids else []
        page = newest[:limit]
        return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None, "has_more": len(newest) > limit})

    async def _batch(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if (refused := self._refused(request)) is not None:
            return refused
        batch_id = request.path_params["batch_id"]
        if batch_id not in self.batches:
            return _error(404, f"no batch {batch_id}")
        self.polls[batch_id] += 1
        return JSONResponse(dict(self.batches[batch_id]))

    # -- a batch running ------------------------------------------------------------------------------
    async def _process(self, batch: dict[str, Any], lines: list[dict[str, Any]], script: BatchScript) -> None:
        await asyncio.sleep(self.step_s)
        now = lambda: int(time.time())  # noqa: E731
        if script.outcome == "failed":
            batch.update(status="failed", failed_at=now(), errors={"object": "list", "data": [
                {"code": "invalid_request", "message": "injected: the input file failed validation", "line": None}]})
            return
        batch.update(status="in_progress", in_progress_at=now())
        while not self.hold.is_set():
            await asyncio.sleep(0.05)
        answered = script.answer_first if script.outcome in ("expired", "cancelled") else len(lines)
        output, errors = [], []
        ran: dict[str, dict[str, Any]] = {}
        if self.run_lines is not None:
            for entry in await self.run_lines(lines[:answered]):
                ran[entry["custom_id"]] = entry
        for i, line in enumerate(lines):
            entry = {"id": f"batch_req_{uuid.uuid4().hex[:24]}", "custom_id": line["custom_id"], "response": None,
                     "error": None}
            if i >= answered:
                code = "batch_expired" if script.outcome == "expired" else "batch_cancelled"
                entry["error"] = {"code": code, "message": f"injected: this request was not run ({code})"}
                errors.append(entry)
                batch["request_counts"]["failed"] += 1
                continue
            path = str(line["url"]).removeprefix("/v1")
            self.executed[body_key(path, line["body"])] += 1
            if self.run_lines is not None:
                entry = ran[line["custom_id"]]
                status = int((entry.get("response") or {}).get("status_code") or 0)
            else:
                response = await self.answer(path, line["body"])
                status = response.status_code
                entry["response"] = {"status_code": status, "request_id": f"req_{uuid.uuid4().hex[:16]}",
                                     "body": json.loads(response.body)}
            ok = status == 200 and not entry.get("error")
            (output if ok else errors).append(entry)
            batch["request_counts"]["completed" if ok else "failed"] += 1
        batch.update(status="finalizing", finalizing_at=now())
        await asyncio.sleep(self.step_s)
        for name, entries in (("output_file_id", output), ("error_file_id", errors)):
            if entries:
                file_id = f"file-{uuid.uuid4().hex[:24]}"
                data = "".join(json.dumps(e) + "\n" for e in entries).encode()
                self.files[file_id] = {"bytes": data, "filename": f"{batch['id']}_{name}.jsonl",
                                       "purpose": "batch_output", "created_at": now()}
                batch[name] = file_id
        ended = {"completed": "completed_at", "expired": "expired_at", "cancelled": "cancelled_at"}[script.outcome]
        batch.update(status=script.outcome, **{ended: now()})
