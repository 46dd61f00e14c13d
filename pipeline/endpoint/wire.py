"""The OpenAI wire format, both ways: request bodies for a row, and what to read from an answer.

Pure (the standard library and the error tree). The bodies follow OpenAI's API reference as vLLM's and
llama.cpp's servers accept it: ``/chat/completions`` with ``messages``,
``/completions`` with ``prompt``, ``/embeddings`` with ``input``; a JSON
Schema goes in ``response_format: {"type": "json_schema", ...}``. Answers give
the text, the finish reason and ``usage`` (prompt and completion tokens).

>>> body = chat_body("m", "hi", system="be brief", max_tokens=8, temperature=0.0, top_p=1.0, seed=3, stop=())
>>> body["messages"], body["max_tokens"], body["seed"]
([{'role': 'system', 'content': 'be brief'}, {'role': 'user', 'content': 'hi'}], 8, 3)
>>> reply = read_generation({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
...                          "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
>>> reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens
('ok', 'stop', 5, 1)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipeline.errors import PipelineError

__all__ = ["Reply", "WireError", "body_key", "chat_body", "completion_body", "embedding_body", "error_message", "image_parts",
           "read_embedding", "read_generation"]


class WireError(PipelineError, ValueError):
    """An answer that is not what the OpenAI API returns (no choices, no data): the server's fault, retried (still a
    ``ValueError``, as it was before it joined the :class:`~pipeline.errors.PipelineError` tree)."""


@dataclass(frozen=True)
class Reply:
    """What a row gets from a generation answer."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


def _sampling(max_tokens: int, temperature: float, top_p: float, seed: int, stop: Sequence[str],
              json_schema: Mapping[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": int(max_tokens), "temperature": float(temperature), "top_p": float(top_p),
                            "seed": int(seed), "n": 1, "stream": False}
    if stop:
        body["stop"] = list(stop)
    if json_schema is not None:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "fields", "schema": dict(json_schema), "strict": True}}
    return body


def chat_body(model: str, prompt: str | list[dict[str, Any]], *, system: str | None, max_tokens: int,
              temperature: float, top_p: float, seed: int, stop: Sequence[str],
              json_schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``/chat/completions`` body: the row's prompt as the user message (after ``system``, when given); a
    prompt with an image is a list of content parts (:func:`image_parts`)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    return {"model": model, "messages": messages,
            **_sampling(max_tokens, temperature, top_p, seed, stop, json_schema)}


def image_parts(before: str, image_url: str, after: str) -> list[dict[str, Any]]:
    """A user message's content parts: the text before the image, the image (an ``image_url`` part: a data URI
    or an address the server fetches), the text after; empty texts left out.

    >>> [part["type"] for part in image_parts("", "data:image/png;base64,AA==", "Describe it")]
    ['image_url', 'text']
    """
    return ([{"type": "text", "text": before}] if before else []) + [
        {"type": "image_url", "image_url": {"url": image_url}}] + ([{"type": "text", "text": after}] if after else [])


def completion_body(model: str, prompt: str, *, system: str | None, max_tokens: int, temperature: float,
                    top_p: float, seed: int, stop: Sequence[str],
                    json_schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``/completions`` body: the prompt as written (``system`` and a blank line before it, when given)."""
    text = f"{system}\n\n{prompt}" if system else prompt
    return {"model": model, "prompt": text, **_sampling(max_tokens, temperature, top_p, seed, stop, json_schema)}


def embedding_body(model: str, text: str) -> dict[str, Any]:
    """An ``/embeddings`` body for one row (one input per request: the usage that comes back is the row's)."""
    return {"model": model, "input": [text], "encoding_format": "float"}


def body_key(path: str, body: Mapping[str, Any]) -> str:
    """What identifies a request: the sha256 of its path and canonical body (the journal's key).

    Two rows with the same content make the same request and share one answer.

    >>> body_key("/embeddings", {"model": "m", "input": ["a"]}) == body_key("/embeddings", {"input": ["a"], "model": "m"})
    True
    """
    canonical = json.dumps({"path": path, "body": body}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _usage(answer: Mapping[str, Any]) -> tuple[int, int]:
    usage = answer.get("usage") or {}
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)


def read_generation(answer: Mapping[str, Any]) -> Reply:
    """The text, finish reason and usage of a chat or completions answer (its first choice)."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise WireError(f"the answer has no choices: {json.dumps(answer)[:200]}")
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
    prompt, completion = _usage(answer)
    return Reply(text=text or "", finish_reason=str(choice.get("finish_reason") or "stop"), prompt_tokens=prompt,
                 completion_tokens=completion)


def read_embedding(answer: Mapping[str, Any]) -> tuple[list[float], int]:
    """The vector of a one-input ``/embeddings`` answer and its prompt tokens."""
    data = answer.get("data")
    if not isinstance(data, list) or len(data) != 1 or not isinstance(data[0], Mapping):
        raise WireError(f"the answer does not hold one embedding: {json.dumps(answer)[:200]}")
    vector = data[0].get("embedding")
    if not isinstance(vector, list) or not vector:
        raise WireError("the answer's embedding is empty or not a list of numbers (encoding_format float)")
    return [float(v) for v in vector], _usage(answer)[0]


def error_message(status: int, text: str) -> str:
    """One line for an HTTP error answer: the status and the server's ``error.message`` when it gives one.

    >>> error_message(400, '{"error": {"message": "prompt too long", "type": "BadRequestError"}}')
    'HTTP 400: prompt too long'
    >>> error_message(502, "<html>bad gateway</html>")
    'HTTP 502: <html>bad gateway</html>'
    """
    detail = text.strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, Mapping):
        err = parsed.get("error", parsed)
        if isinstance(err, Mapping) and err.get("message"):
            detail = str(err["message"])
        elif isinstance(err, str):
            detail = err
        elif parsed.get("detail"):
            detail = str(parsed["detail"])
    detail = " ".join(detail.split())
    return f"HTTP {status}: {detail[:300]}" if detail else f"HTTP {status}"
