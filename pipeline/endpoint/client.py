"""Send many rows' requests to an OpenAI-compatible server: bounded concurrency, pacing, retries, a journal.

:meth:`EndpointClient.run` takes one :class:`Call` per row and returns one
:class:`Outcome` per call, in the same order. Per call:

1. an answer the journal already holds (an earlier attempt or try was
   answered for this very request) is replayed: nothing is sent;
2. the token budget (``run.max_tokens``, :class:`TokenBudget`) must hold the
   call's upper estimate, else it is not sent (``Outcome.budget``);
3. the rate limiter paces it (:class:`~pipeline.endpoint.limits.RateLimiter`);
4. it is sent with at most ``concurrency`` in flight; ``429``, ``408`` and
   ``5xx`` answers, timeouts, dropped connections and an HTTP 200 whose body
   is not the answer asked for (not JSON, or JSON that ``check`` refuses: no
   ``choices``, no embedding) are retried up to ``max_attempts`` tries,
   waiting what ``Retry-After`` asks or a jittered exponential backoff; any
   other ``4xx`` is the row's fault and not retried;
5. an answer is journaled (durably) before it is used, and its usage counted.

A call that still fails has ``ok`` false and its reason in ``error``; the
task gives the row status ``error`` and the quarantine takes it.

A retry after a timeout or a connection lost *after the request was sent* may
reach a server that had already done the work (HTTP carries no idempotency
key in the OpenAI API): those are counted as ``lost_answers``. Everything else
the server sees once.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from pipeline.endpoint.config import EndpointConfig
from pipeline.endpoint.limits import RateLimiter, backoff_delay, retry_after_seconds
from pipeline.endpoint.wire import WireError, body_key, error_message

__all__ = ["Call", "EndpointClient", "Journal", "Outcome", "TokenBudget"]

_RETRIED_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 520, 522, 524, 529})


class Journal(Protocol):
    """Where answers are kept as they arrive (:class:`pipeline.journal.request_log.RequestLog`)."""

    def answered(self) -> Mapping[str, Mapping[str, Any]]: ...
    def record(self, key: str, answer: Mapping[str, Any], *, tokens: int) -> None: ...
    def spent_by_try(self) -> int: ...
    def publish(self, *, force: bool = False) -> None: ...


@dataclass(frozen=True)
class Call:
    """One row's request: the path, the JSON body, its journal key and an upper estimate of its tokens."""

    path: str
    body: Mapping[str, Any]
    estimate: int
    key: str = ""

    @classmethod
    def of(cls, path: str, body: Mapping[str, Any], *, estimate: int) -> "Call":
        return cls(path=path, body=body, estimate=int(estimate), key=body_key(path, body))


@dataclass
class Outcome:
    """What one call came to: ``answer`` (the parsed JSON) when ``ok``, else ``error``; how it got there."""

    ok: bool
    answer: Mapping[str, Any] | None = None
    error: str | None = None
    attempts: int = 0
    replayed: bool = False
    budget: bool = False
    seconds: float = 0.0


class TokenBudget:
    """``run.max_tokens`` for one try, held by every task together through the journal's ledger.

    A call is sent only when what the try spent (all its tasks), what is reserved in flight
    and the call's upper estimate stay within ``limit``; the reservation is replaced by the
    real usage when the answer comes.
    """

    def __init__(self, limit: int | None, journal: Any = None) -> None:
        self.limit, self.journal = limit, journal
        self.local_spent = 0
        self.reserved = 0

    def spent(self) -> int:
        return self.journal.spent_by_try() if self.journal is not None else self.local_spent

    def reserve(self, estimate: int) -> bool:
        if self.limit is None:
            return True
        if self.spent() + self.reserved + estimate > self.limit:
            return False
        self._set_reserved(self.reserved + estimate)
        return True

    def release(self, estimate: int) -> None:
        if self.limit is not None:
            self._set_reserved(self.reserved - estimate)

    def _set_reserved(self, value: int) -> None:
        self.reserved = max(0, value)
        if self.journal is not None:
            self.journal.reserved = self.reserved
            self.journal.publish()


@dataclass
class _Counters:
    values: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, value: float = 1) -> None:
        self.values[name] = self.values.get(name, 0) + value


class EndpointClient:
    """Sends :class:`Call` s to ``config.base_url`` (see the module docstring); one client per task attempt.

    ``rate_share`` is this task's part of the run's request and token rates (1 / the tasks that
    run at once). ``transport`` (an ``httpx.AsyncBaseTransport``) replaces the network in tests.
    """

    def __init__(self, config: EndpointConfig, *, journal: Journal | None = None, max_tokens: int | None = None,
                 rate_share: float = 1.0, transport: Any = None, rng: random.Random | None = None) -> None:
        self.config = config
        self.journal = journal
        self.budget = TokenBudget(max_tokens, journal)
        share = max(min(rate_share, 1.0), 1e-6)
        self.limiter = RateLimiter(
            requests_per_minute=config.requests_per_minute * share if config.requests_per_minute else None,
            tokens_per_minute=config.tokens_per_minute * share if config.tokens_per_minute else None)
        self.transport = transport
        self.rng = rng or random.Random()
        self.counters = _Counters()
        self._answered: dict[str, Mapping[str, Any]] = dict(journal.answered()) if journal is not None else {}

    @property
    def stats(self) -> dict[str, float]:
        """What the calls so far did: requests sent, retries by cause, lost answers, replays, failures."""
        return dict(self.counters.values)

    def run(self, calls: Sequence[Call], *, usage: Callable[[Mapping[str, Any]], int],
            on_done: Callable[[int, Outcome], None] | None = None,
            check: Callable[[Mapping[str, Any]], Any] | None = None) -> list[Outcome]:
        """One :class:`Outcome` per call, in order; ``usage(answer)`` is an answer's tokens (for the budget).

        ``check(answer)`` raises :class:`~pipeline.endpoint.wire.WireError` for a JSON answer that is not the
        one asked for (``read_generation``: no ``choices``); such an answer is retried as a body that is not
        JSON is, and is never journaled.
        """
        if not calls:
            return []
        return asyncio.run(self._run_all(list(calls), usage, on_done, check))

    async def _run_all(self, calls: list[Call], usage: Callable[[Mapping[str, Any]], int],
                       on_done: Callable[[int, Outcome], None] | None,
                       check: Callable[[Mapping[str, Any]], Any] | None) -> list[Outcome]:
        import httpx

        cfg = self.config
        headers = {"Content-Type": "application/json"}
        if cfg.secret():
            headers["Authorization"] = f"Bearer {cfg.secret()}"
        timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s)
        limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
        outcomes: list[Outcome | None] = [None] * len(calls)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(calls)):
            queue.put_nowait(i)
        stop = asyncio.Event()  # set once the budget refused a call: nothing new is sent after it

        async with httpx.AsyncClient(base_url=cfg.base_url, headers=headers, timeout=timeout, limits=limits,
                                     transport=self.transport, trust_env=False) as client:
            async def worker() -> None:
                while True:
                    try:
                        i = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    outcome = await self._one(client, calls[i], usage, stop, check)
                    outcomes[i] = outcome
                    if on_done is not None:
                        on_done(i, outcome)

            await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency, len(calls)))))
        if self.journal is not None:
            self.journal.publish(force=True)
        return [o if o is not None else Outcome(ok=False, error="not run") for o in outcomes]

    async def _one(self, client: Any, call: Call, usage: Callable[[Mapping[str, Any]], int],
                   stop: asyncio.Event, check: Callable[[Mapping[str, Any]], Any] | None = None) -> Outcome:
        started = time.perf_counter()
        known = self._answered.get(call.key)
        if known is not None:
            self.counters.add("replayed")
            return Outcome(ok=True, answer=known, replayed=True)
        if stop.is_set() or not self.budget.reserve(call.estimate):
            stop.set()
            self.counters.add("budget_refused")
            return Outcome(ok=False, budget=True, error="run.max_tokens reached before this row was sent")
        try:
            outcome = await self._send(client, call, check)
        finally:
            self.budget.release(call.estimate)
        outcome.seconds = time.perf_counter() - started
        if outcome.ok and outcome.answer is not None:
            tokens = usage(outcome.answer)
            self.limiter.settle(estimated=call.estimate, actual=tokens)
            if self.journal is not None:
                self.journal.record(call.key, outcome.answer, tokens=tokens)
            else:
                self.budget.local_spent += tokens
            self._answered[call.key] = outcome.answer
        elif not outcome.ok:
            self.counters.add("failed_rows")
        return outcome

    async def _send(self, client: Any, call: Call, check: Callable[[Mapping[str, Any]], Any] | None = None) -> Outcome:
        """The call sent until it is answered, refused for good, or out of tries."""
        import httpx

        cfg = self.config
        last = "no attempt"
        for attempt in range(cfg.max_attempts):
            await self.limiter.acquire(tokens=call.estimate)
            self.counters.add("requests")
            wait: float | None = None
            try:
                response = await client.post(call.path, json=call.body)
            except httpx.TimeoutException as exc:
                sent = not isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout))
                last = f"{type(exc).__name__} after {cfg.timeout_s:g} s" if sent else f"{type(exc).__name__}"
                self.counters.add("retry_timeout")
                if sent:
                    self.counters.add("lost_answers")
            except httpx.TransportError as exc:
                # a refused or reset connection before the request went out is not a lost answer
                sent = not isinstance(exc, httpx.ConnectError)
                last = f"{type(exc).__name__}: {self._scrub(str(exc)) or 'connection dropped'}"
                self.counters.add("retry_connection")
                if sent:
                    self.counters.add("lost_answers")
            else:
                status = response.status_code
                if status == 200:
                    try:
                        answer = response.json()
                    except ValueError:
                        answer = None
                    last = ("HTTP 200 with a body that is not a JSON object" if not isinstance(answer, dict)
                            else self._refused(answer, check))
                    if last is None:
                        return Outcome(ok=True, answer=answer, attempts=attempt + 1)
                    self.counters.add("retry_bad_body")  # the server's fault either way: the same retries
                elif status in _RETRIED_STATUS or status >= 500:
                    last = self._scrub(error_message(status, response.text))
                    self.counters.add("retry_429" if status == 429 else "retry_5xx" if status >= 500 else "retry_other")
                    wait = retry_after_seconds(response.headers)
                else:
                    return Outcome(ok=False, error=self._scrub(error_message(status, response.text)),
                                   attempts=attempt + 1)
            if attempt + 1 < cfg.max_attempts:
                delay = backoff_delay(attempt, base=cfg.backoff_s, cap=cfg.max_backoff_s, rng=self.rng)
                if wait is not None:  # the server said how long: that, plus a little jitter to spread the herd
                    delay = min(wait, cfg.max_retry_after_s) + self.rng.uniform(0.0, cfg.backoff_s)
                self.counters.add("retry_wait_s", delay)
                await asyncio.sleep(delay)
        return Outcome(ok=False, error=f"{last} (gave up after {cfg.max_attempts} tries)", attempts=cfg.max_attempts)

    def _refused(self, answer: Mapping[str, Any], check: Callable[[Mapping[str, Any]], Any] | None) -> str | None:
        """Why ``check`` refuses a JSON answer (None: it is the answer asked for)."""
        if check is None:
            return None
        try:
            check(answer)
        except WireError as exc:
            return self._scrub(f"HTTP 200 with {exc}")
        return None

    def _scrub(self, text: str) -> str:
        secret = self.config.secret()
        return text.replace(secret, "***") if secret else text
