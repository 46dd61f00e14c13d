"""Settings of the ``endpoint`` backend (pydantic only): where the server is, how hard to push it, how to retry,
and whether rows go as live requests or through the provider's batch API (``mode``, ``batch``)."""

from __future__ import annotations

from typing import ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["BatchApiConfig", "EndpointConfig"]


class BatchApiConfig(BaseModel):
    """The batch API's limits and waits (``task.endpoint.batch``), read only with ``mode: batch``.

    The defaults are OpenAI's documented limits: at most 50,000 requests and 200 MB per input file,
    and a 24-hour completion window (the only one it accepts).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    max_requests_per_file: int = Field(
        50_000, gt=0, le=50_000, description="batch mode: requests per request file (one batch each); the provider's "
        "limit is 50,000")
    max_bytes_per_file: int = Field(
        200 * 1024 * 1024, gt=0, description="batch mode: bytes per request file (200 MB, the provider's limit)")
    completion_window: str = Field(
        "24h", description="batch mode: the window the provider has to answer a batch (OpenAI accepts `24h` only); "
        "what it has not answered by then comes back expired and is submitted again (`resubmits`)")
    poll_s: float = Field(
        30.0, gt=0, description="batch mode: seconds between the first polls of the batches' states; doubles while "
        "nothing changes, up to `max_poll_s`")
    max_poll_s: float = Field(600.0, gt=0, description="batch mode: the longest wait between two polls")
    max_wait_s: float | None = Field(
        None, gt=0, description="batch mode: how long a run waits for its batches; past it the run ends like "
        "`--submit-only` (nothing committed, batches kept) and a rerun collects them; none: until every batch ends")
    resubmits: int = Field(
        2, ge=0, le=20, description="batch mode: how often a request the provider did not answer (its batch expired, "
        "was cancelled or failed; a 5xx, 429 or timeout line) is submitted again before its row is quarantined")


class EndpointConfig(BaseModel):
    """An OpenAI-compatible server and the client's limits towards it.

    ``api_key`` is read from the environment in the YAML (``api_key: ${OPENAI_API_KEY}``) and held
    as a secret: dumps of the config, ``pipeline check``, the runs table and error text show
    ``***``. ``concurrency`` is per inference task (each Spark task keeps that many requests in
    flight); ``requests_per_minute`` and ``tokens_per_minute`` are for the whole run, split evenly
    between the inference tasks that run at once.

    Only ``model`` and ``api`` change what a row gets back; everything else (the address, the key,
    the limits and retries) may differ between tries of one run without changing its staged work.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    # the settings a retry or resume of the same run may change (pipeline.config.fingerprint, the run key)
    PER_TRY: ClassVar[tuple[str, ...]] = (
        "base_url", "api_key", "concurrency", "requests_per_minute", "tokens_per_minute", "timeout_s",
        "connect_timeout_s", "max_attempts", "backoff_s", "max_backoff_s", "max_retry_after_s",
        *(f"batch.{k}" for k in BatchApiConfig.model_fields),
    )
    # what changes how rows are asked for, not what they get back (the fingerprint leaves it out; the run key
    # keeps it: a run switched to the other mode is another logical run, whose staging starts afresh)
    SAME_ROWS: ClassVar[tuple[str, ...]] = ("mode",)

    base_url: str = Field(description="endpoint: the server's OpenAI API root, e.g. `http://127.0.0.1:8000/v1`")
    model: str = Field(description="endpoint: the served model's name (`model` in each request)")
    api_key: SecretStr | None = Field(
        None, description="endpoint: the key, from the environment (`${OPENAI_API_KEY}`); sent as a bearer token, "
        "never printed")
    api: Literal["chat", "completions"] = Field(
        "chat", description="endpoint: `chat` (`/chat/completions`, the server's chat template) or `completions` "
        "(`/completions`, the prompt as written); embed always uses `/embeddings`")
    mode: Literal["live", "batch"] = Field(
        "live", description="endpoint: `live` (one request per row as the tasks run) or `batch` (the provider's "
        "batch API: request files uploaded, one batch each, answered within `batch.completion_window` at about "
        "half the price; see docs/tasks/endpoint.md)")
    batch: BatchApiConfig = Field(default_factory=BatchApiConfig,
                                  description="endpoint: the batch API's limits and waits (`mode: batch`)")
    concurrency: int = Field(4, gt=0, le=512, description="endpoint: requests in flight per inference task")
    requests_per_minute: float | None = Field(
        None, gt=0, description="endpoint: client-side request rate for the whole run (split between the tasks "
        "that run at once); none: no limit")
    tokens_per_minute: float | None = Field(
        None, gt=0, description="endpoint: client-side token rate for the whole run (prompt + completion, an upper "
        "estimate until the server's usage comes back); none: no limit")
    timeout_s: float = Field(120.0, gt=0, description="endpoint: seconds a request may take (each read, each write)")
    connect_timeout_s: float = Field(10.0, gt=0, description="endpoint: seconds to open a connection")
    max_attempts: int = Field(
        6, gt=0, le=50, description="endpoint: tries per row for 429, 408, 5xx, timeouts and dropped connections; "
        "a row that still fails gets status `error` and goes to the quarantine")
    backoff_s: float = Field(0.5, ge=0, description="endpoint: first retry delay; doubles each retry, full jitter")
    max_backoff_s: float = Field(30.0, ge=0, description="endpoint: longest retry delay (backoff)")
    max_retry_after_s: float = Field(
        120.0, ge=0, description="endpoint: longest wait a `Retry-After` header gets; a longer one is cut to this")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL; give the server's API root, e.g. "
                             "http://127.0.0.1:8000/v1")
        return value.rstrip("/")

    def api_path(self) -> str:
        """The path rows of a generate/extract task are posted to."""
        return "/chat/completions" if self.api == "chat" else "/completions"

    def secret(self) -> str | None:
        """The key's value (for the ``Authorization`` header and for scrubbing error text), or None."""
        return self.api_key.get_secret_value() if self.api_key is not None else None
