"""The ``endpoint`` backend: rows sent to an OpenAI-compatible server (vLLM's, llama.cpp's, a hosted API).

Pure Python over httpx (no pyspark, torch or transformers). The tasks
(``generate``, ``extract``, ``embed``) build one request body per row
(:mod:`pipeline.endpoint.wire`), and :class:`EndpointClient` sends them with a
bounded number in flight, client-side request and token rates
(:mod:`pipeline.endpoint.limits`), retries with backoff and jitter on ``429``,
``5xx``, timeouts and dropped connections, and a journal of every answer
(:class:`pipeline.journal.request_log.RequestLog`): an answered row is never
requested again by a retried task attempt or a rerun of the same run, and
``run.max_tokens`` stops the run before a request would pass it::

    client = EndpointClient(EndpointConfig(base_url="http://127.0.0.1:8000/v1", model="smollm2"))
    outcomes = client.run([Call.of("/chat/completions", body, estimate=300) for body in bodies])
"""

from __future__ import annotations

from pipeline.endpoint.client import Call, EndpointClient, Outcome, TokenBudget
from pipeline.endpoint.config import EndpointConfig
from pipeline.endpoint.limits import RateLimiter, backoff_delay, retry_after_seconds

__all__ = ["Call", "EndpointClient", "EndpointConfig", "Outcome", "RateLimiter", "TokenBudget", "backoff_delay",
           "retry_after_seconds"]
