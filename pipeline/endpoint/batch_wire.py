"""The batch API's file formats, both ways: request lines in, result lines out, and the files' limits.

Pure (standard library). One request line per request, as OpenAI's batch API and
``vllm run-batch`` read them::

    {"custom_id": "<request key>", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

``custom_id`` is the request's key (:func:`pipeline.endpoint.wire.body_key`, 64 hex digits): the key the
answer is journaled and matched back by, whatever order the provider answers in. Rows with the same
request share one line (and one answer), as in live mode.

A result line, in the output file (answered) or the error file (not), or in ``vllm run-batch``'s one
output file::

    {"id": ..., "custom_id": ..., "response": {"status_code": 200, "request_id": ..., "body": {...}}, "error": null}
    {"id": ..., "custom_id": ..., "response": null, "error": {"code": "batch_expired", "message": ...}}

>>> line = request_line("k1", "/embeddings", {"model": "m", "input": ["a"]})
>>> json.loads(line)["url"], json.loads(line)["custom_id"]
('/v1/embeddings', 'k1')
>>> r = read_result('{"custom_id": "k1", "response": {"status_code": 200, "body": {"data": []}}, "error": null}')
>>> r.key, r.answer, r.error
('k1', {'data': []}, None)
>>> r = read_result('{"custom_id": "k2", "response": null, "error": {"code": "batch_expired", "message": "x"}}')
>>> r.key, r.answer, r.error, r.retry
('k2', None, 'batch_expired: x', True)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["BATCH_STATES", "DONE_STATES", "RETRIED_CODES", "Result", "cut_files", "read_result", "request_line",
           "usage_tokens"]

# a batch's states (OpenAI's Batch object); the last four are final
BATCH_STATES = ("validating", "in_progress", "finalizing", "cancelling", "completed", "expired", "failed", "cancelled")
DONE_STATES = frozenset({"completed", "expired", "failed", "cancelled"})
# error codes of a line the provider did not answer for a reason of its own: submitted again (batch.resubmits)
RETRIED_CODES = frozenset({"batch_expired", "batch_cancelled", "request_timeout", "rate_limit_exceeded",
                           "server_error", "batch_failed"})
_RETRIED_STATUS = frozenset({408, 409, 425, 429})


def request_line(custom_id: str, path: str, body: Mapping[str, Any]) -> str:
    """One request line (no newline) for ``path`` (as the live client posts it, e.g. ``/chat/completions``)."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": f"/v1{path}", "body": body},
                      separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Result:
    """What one result line says: its key, the answer (the body of an HTTP 200) or why there is none, and
    whether that is the provider's doing (submitted again) or the request's (the row is quarantined)."""

    key: str
    answer: Mapping[str, Any] | None
    error: str | None
    retry: bool = False


def read_result(line: str) -> Result:
    """The :class:`Result` of one output or error file line (OpenAI's batch API, or ``vllm run-batch``'s).

    >>> read_result('{"custom_id": "k", "response": {"status_code": 400, "body": {"error": {"message": "too long"}}}}').error
    'HTTP 400: too long'
    >>> read_result('{"custom_id": "k", "response": {"status_code": 400}, "error": "bad request: no model"}').error
    'HTTP 400: bad request: no model'
    >>> read_result('{"custom_id": "k", "response": {"status_code": 503, "body": null}, "error": null}').retry
    True
    >>> read_result('{"custom_id": "k", "response": {"status_code": 400, "body": {"error": "bad"}}}').retry
    False
    """
    entry = json.loads(line)
    if not isinstance(entry, Mapping) or not entry.get("custom_id"):
        raise ValueError(f"a result line without a custom_id: {line[:200]!r}")
    key = str(entry["custom_id"])
    response = entry.get("response") if isinstance(entry.get("response"), Mapping) else None
    status = int(response.get("status_code") or 0) if response else 0
    body = response.get("body") if response else None
    if status == 200 and isinstance(body, Mapping) and not entry.get("error"):
        return Result(key, dict(body), None)
    detail = _message(entry.get("error")) or _message(body) or "no answer"
    code = entry["error"].get("code") if isinstance(entry.get("error"), Mapping) else None
    if status:
        text = f"HTTP {status}: {detail}"
        # a 200 without a body is the provider's fault, as a 429 or a 5xx is; any other 4xx is the request's
        retry = status == 200 or status in _RETRIED_STATUS or status >= 500
    else:
        text = f"{code}: {detail}" if code else detail
        retry = code in RETRIED_CODES or code is None
    return Result(key, None, " ".join(text.split())[:500], retry)


def _message(value: Any) -> str | None:
    """The human text of an error field: a string, ``{"message": ...}``, ``{"error": {"message": ...}}``."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, Mapping):
        inner = value.get("error", value)
        if isinstance(inner, Mapping) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str) and inner:
            return inner
        if value.get("message"):
            return str(value["message"])
    return None


def usage_tokens(answer: Mapping[str, Any]) -> int:
    """Prompt plus completion tokens of an answer's ``usage`` (0 when it has none).

    >>> usage_tokens({"usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})
    7
    """
    usage = answer.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)


def cut_files(lines: Iterable[tuple[str, str, int]], *, max_requests: int,
              max_bytes: int) -> Iterator[list[tuple[str, str, int]]]:
    """``(key, line, estimate)`` triples cut into files of at most ``max_requests`` lines and ``max_bytes`` bytes
    (each line with its newline), in order. A line longer than ``max_bytes`` alone is refused: no provider takes it.

    >>> triples = [(f"k{i}", "x" * 9, 1) for i in range(5)]   # 10 bytes a line with its newline
    >>> [len(f) for f in cut_files(triples, max_requests=2, max_bytes=1000)]
    [2, 2, 1]
    >>> [len(f) for f in cut_files(triples, max_requests=50, max_bytes=30)]
    [3, 2]
    """
    current: list[tuple[str, str, int]] = []
    size = 0
    for key, line, estimate in lines:
        length = len(line.encode("utf-8")) + 1
        if length > max_bytes:
            raise ValueError(f"the request of {key} is {length:,} bytes, more than a request file may hold "
                             f"(task.endpoint.batch.max_bytes_per_file {max_bytes:,})")
        if current and (len(current) >= max_requests or size + length > max_bytes):
            yield current
            current, size = [], 0
        current.append((key, line, estimate))
        size += length
    if current:
        yield current
