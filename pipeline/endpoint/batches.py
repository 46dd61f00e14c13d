"""The provider's batch API over HTTP: ``/files`` and ``/batches`` of an OpenAI-compatible root.

:class:`BatchApi` uploads a request file (``POST /files``, ``purpose=batch``), creates one batch per file
(``POST /batches``), reads a batch's state (``GET /batches/{id}``), finds a batch by its metadata in the
listing (``GET /batches``) and streams an output or error file to disk (``GET /files/{id}/content``). Each call
is retried on ``429``, ``5xx``, timeouts and dropped connections as the live client retries a row
(``max_attempts``, ``Retry-After`` or jittered backoff), and fails with :class:`BatchApiError` otherwise.

Creating a batch is what costs money, and HTTP carries no idempotency key: a create whose answer was lost
may have created the batch anyway. So every batch carries ``metadata`` naming its request file, and before
a create is sent again the listing is searched for it (:meth:`BatchApi.create`); a driver killed between
the create and its journal line does the same on the rerun (``pipeline.stages.batch``).
"""

from __future__ import annotations

import random
import time
from typing import Any, BinaryIO, Mapping

from pipeline.endpoint.config import EndpointConfig
from pipeline.endpoint.limits import backoff_delay, retry_after_seconds
from pipeline.endpoint.wire import error_message
from pipeline.errors import EngineError

__all__ = ["BatchApi", "BatchApiError"]

_RETRIED = frozenset({408, 409, 425, 429})
# the listing pages read while looking for a batch by its metadata (100 batches a page)
_LIST_PAGES = 20


class BatchApiError(EngineError):
    """The provider refused a batch API call (a 4xx other than 429), or it kept failing past ``max_attempts``."""


class _Lost(Exception):
    """A request that may have reached the provider, whose answer never came back."""


class BatchApi:
    """Calls of the batch API on ``config.base_url`` (one instance per run, on the driver).

    ``transport`` (an ``httpx.BaseTransport``) replaces the network in tests.
    """

    def __init__(self, config: EndpointConfig, *, transport: Any = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.transport = transport
        self.rng = rng or random.Random()
        self.calls: dict[str, int] = {}

    def _client(self) -> Any:
        import httpx

        cfg = self.config
        headers = {"Authorization": f"Bearer {cfg.secret()}"} if cfg.secret() else {}
        return httpx.Client(base_url=cfg.base_url, headers=headers, transport=self.transport, trust_env=False,
                            timeout=httpx.Timeout(max(cfg.timeout_s, 300.0), connect=cfg.connect_timeout_s))

    def _call(self, method: str, path: str, *, what: str, lost_ok: bool = True, **kwargs: Any) -> Any:
        """The response of one call, retried as a row is; ``_Lost`` when ``lost_ok`` is false and a request that
        may have been sent got no answer (the caller decides whether sending it again is safe)."""
        import httpx

        cfg = self.config
        last = "no attempt"
        with self._client() as client:
            for attempt in range(cfg.max_attempts):
                self.calls[what] = self.calls.get(what, 0) + 1
                wait: float | None = None
                try:
                    response = client.request(method, path, **kwargs)
                except httpx.TransportError as exc:
                    sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
                    if sent and not lost_ok:
                        raise _Lost(f"{type(exc).__name__}") from None
                    last = f"{type(exc).__name__}: {self._scrub(str(exc)) or 'connection dropped'}"
                else:
                    if response.status_code < 300:
                        return response
                    last = self._scrub(error_message(response.status_code, response.text))
                    if response.status_code not in _RETRIED and response.status_code < 500:
                        raise BatchApiError(f"{what}: {method} {cfg.base_url}{path} answered {last}")
                    wait = retry_after_seconds(response.headers)
                if attempt + 1 < cfg.max_attempts:
                    delay = backoff_delay(attempt, base=cfg.backoff_s, cap=cfg.max_backoff_s, rng=self.rng)
                    time.sleep(min(wait, cfg.max_retry_after_s) if wait is not None else delay)
        raise BatchApiError(f"{what}: {method} {cfg.base_url}{path} failed {cfg.max_attempts} times; the last: {last}")

    def upload(self, name: str, data: bytes) -> str:
        """Upload a request file (``purpose=batch``); its file id. A lost answer uploads again (files are free)."""
        response = self._call("POST", "/files", what="upload", files={"file": (name, data, "application/jsonl")},
                              data={"purpose": "batch"})
        return str(_json(response, "upload")["id"])

    def create(self, file_id: str, *, endpoint: str, window: str, metadata: Mapping[str, str]) -> dict[str, Any]:
        """Create the batch of an uploaded file; the Batch object. A create whose answer was lost is looked for
        in the listing (by ``metadata``) before it is sent again, so no file becomes two paid batches."""
        body = {"input_file_id": file_id, "endpoint": f"/v1{endpoint}", "completion_window": window,
                "metadata": dict(metadata)}
        for _ in range(self.config.max_attempts):
            try:
                return _json(self._call("POST", "/batches", what="create", json=body, lost_ok=False), "create")
            except _Lost:
                found = self.find(metadata)
                if found is not None:
                    return found
        raise BatchApiError(f"create: POST {self.config.base_url}/batches lost its answer "
                            f"{self.config.max_attempts} times and no batch with metadata {dict(metadata)} was listed")

    def get(self, batch_id: str) -> dict[str, Any]:
        """The Batch object of ``batch_id`` (its ``status``, ``request_counts``, file ids)."""
        return _json(self._call("GET", f"/batches/{batch_id}", what="poll"), "poll")

    def find(self, metadata: Mapping[str, str]) -> dict[str, Any] | None:
        """The newest listed batch whose metadata holds every item of ``metadata``; None when none does (or
        the provider has no listing)."""
        after: str | None = None
        for _ in range(_LIST_PAGES):
            try:
                page = _json(self._call("GET", "/batches", what="list",
                                        params={"limit": 100, **({"after": after} if after else {})}), "list")
            except BatchApiError:
                return None
            data = [b for b in page.get("data") or [] if isinstance(b, Mapping)]
            for batch in data:
                held = batch.get("metadata") or {}
                if all(held.get(k) == v for k, v in metadata.items()):
                    return dict(batch)
            if not page.get("has_more") or not data:
                return None
            after = str(data[-1].get("id"))
        return None

    def download(self, file_id: str, sink: BinaryIO) -> int:
        """Stream an output or error file into ``sink`` (from its start again on each retry); the bytes written.
        An output file of embeddings runs to gigabytes: it never sits in memory whole."""
        import httpx

        cfg, last = self.config, "no attempt"
        with self._client() as client:
            for attempt in range(cfg.max_attempts):
                self.calls["download"] = self.calls.get("download", 0) + 1
                sink.seek(0)
                sink.truncate()
                try:
                    with client.stream("GET", f"/files/{file_id}/content") as response:
                        if response.status_code < 300:
                            written = 0
                            for chunk in response.iter_bytes(1 << 20):
                                written += sink.write(chunk) or 0
                            return written
                        text = response.read().decode(errors="replace")
                        last = self._scrub(error_message(response.status_code, text))
                        if response.status_code not in _RETRIED and response.status_code < 500:
                            raise BatchApiError(f"download: GET {cfg.base_url}/files/{file_id}/content answered {last}")
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {self._scrub(str(exc)) or 'connection dropped'}"
                if attempt + 1 < cfg.max_attempts:
                    time.sleep(backoff_delay(attempt, base=cfg.backoff_s, cap=cfg.max_backoff_s, rng=self.rng))
        raise BatchApiError(f"download: GET {cfg.base_url}/files/{file_id}/content failed {cfg.max_attempts} times; "
                            f"the last: {last}")

    def _scrub(self, text: str) -> str:
        secret = self.config.secret()
        return text.replace(secret, "***") if secret else text


def _json(response: Any, what: str) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise BatchApiError(f"{what}: the answer is not a JSON object: {response.text[:200]!r}")
    return value
