"""Client-side pacing: request and token rates, retry delays with jitter, ``Retry-After``.

Pure (standard library; the clock and the sleep are injected), so every rule is
tested without a server. A provider's limits are per minute and counted on its
side; pacing on ours keeps a run under them instead of learning them from
``429`` answers, and the answers that come anyway are waited out as the server
asks (``Retry-After``) or, when it does not say, with exponential backoff and
full jitter (many tasks retrying at once spread out instead of hitting the
server again in step).
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from typing import Awaitable, Callable, Mapping

__all__ = ["RateLimiter", "backoff_delay", "retry_after_seconds"]


def backoff_delay(attempt: int, *, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first): full jitter over ``base * 2**attempt``.

    Uniform in ``[0, min(cap, base * 2**attempt)]`` ("full jitter"): the spread that keeps many
    clients retrying at once from arriving together.

    >>> rng = random.Random(0)
    >>> [round(backoff_delay(a, base=0.5, cap=4.0, rng=rng), 3) for a in range(5)]
    [0.422, 0.758, 0.841, 1.036, 2.045]
    >>> backoff_delay(30, base=0.5, cap=4.0, rng=random.Random(1)) <= 4.0
    True
    """
    rng = rng or random
    return rng.uniform(0.0, min(cap, base * (2 ** min(attempt, 32))))


def retry_after_seconds(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """The wait a response asks for: ``retry-after-ms``, else ``Retry-After`` (seconds or an HTTP date); None.

    >>> retry_after_seconds({"retry-after": "3"}), retry_after_seconds({"retry-after-ms": "250"})
    (3.0, 0.25)
    >>> retry_after_seconds({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}, now=1792567670.0)
    10.0
    >>> retry_after_seconds({"retry-after": "soon"}) is None, retry_after_seconds({}) is None
    (True, True)
    """
    lower = {k.lower(): v for k, v in headers.items()}
    raw_ms = lower.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = lower.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class RateLimiter:
    """Requests and tokens per minute as two token buckets, refilled continuously.

    Each bucket holds one second's worth (at least one request, and at least the request being
    asked for), so a run starts at its rate instead of with a minute's burst. Tokens are
    taken at an upper estimate before a request is sent and corrected with :meth:`settle` once
    the server reports its usage. A limit of None is no limit.

    >>> clock = [0.0]
    >>> async def sleep(s): clock[0] += s
    >>> rl = RateLimiter(requests_per_minute=120, now=lambda: clock[0], sleep=sleep)
    >>> async def take(n):
    ...     for _ in range(n):
    ...         await rl.acquire(tokens=0)
    >>> asyncio.run(take(5)); round(clock[0], 2)   # 2 a second: the first right away, then every 0.5 s
    2.0
    """

    def __init__(self, *, requests_per_minute: float | None = None, tokens_per_minute: float | None = None,
                 now: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._now, self._sleep = now, sleep
        self._req_rate = requests_per_minute / 60.0 if requests_per_minute else None
        self._tok_rate = tokens_per_minute / 60.0 if tokens_per_minute else None
        self._req_cap = max(1.0, self._req_rate or 0.0)
        self._tok_cap = max(1.0, self._tok_rate or 0.0)
        self._req = 1.0
        self._tok = self._tok_cap
        self._at = now()
        self.waited_s = 0.0

    def _refill(self) -> None:
        now = self._now()
        elapsed, self._at = max(0.0, now - self._at), now
        if self._req_rate:
            self._req = min(self._req_cap, self._req + elapsed * self._req_rate)
        if self._tok_rate:
            self._tok = min(self._tok_cap, self._tok + elapsed * self._tok_rate)

    async def acquire(self, *, tokens: int) -> None:
        """Wait until one more request of about ``tokens`` tokens fits both rates, then take it."""
        while True:
            self._refill()
            # a request larger than a second's tokens goes once the bucket is full (the balance goes negative)
            need_tok = min(float(tokens), self._tok_cap)
            req_ok = not self._req_rate or self._req >= 1.0
            tok_ok = not self._tok_rate or self._tok >= need_tok
            if req_ok and tok_ok:
                if self._req_rate:
                    self._req -= 1.0
                if self._tok_rate:
                    self._tok -= float(tokens)
                return
            wait = 0.0
            if not req_ok:
                wait = max(wait, (1.0 - self._req) / self._req_rate)
            if not tok_ok:
                wait = max(wait, (need_tok - self._tok) / self._tok_rate)
            wait = max(wait, 0.001)
            self.waited_s += wait
            await self._sleep(wait)

    def settle(self, *, estimated: int, actual: int) -> None:
        """Correct the token bucket once the server reported what the request really used."""
        if self._tok_rate:
            self._tok = min(self._tok_cap, self._tok + float(estimated - actual))
