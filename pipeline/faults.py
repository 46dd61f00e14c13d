"""Fault injection for tests and drills; off unless ``SBI_FAULTS`` is set in the environment.

``SBI_FAULTS`` holds JSON, for example::

    {"poison_marker": "POISON"}       # any batch holding a row whose text contains it raises
    {"oom_above_rows": 8}             # batches of more rows raise a (simulated) out-of-memory error
    {"oom_above_tokens": 512}         # batches of more padded tokens (rows x length) do, like real memory

Executors inherit the driver's environment under ``local[*]``; on a cluster pass
it with ``spark.executorEnv.SBI_FAULTS``.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any, Sequence

__all__ = ["InjectedFault", "SimulatedOutOfMemory", "check_batch", "settings"]

ENV = "SBI_FAULTS"


class InjectedFault(RuntimeError):
    """Raised where a configured fault fires."""


class SimulatedOutOfMemory(InjectedFault):
    """Stands in for ``torch.cuda.OutOfMemoryError`` where no GPU exists."""


@lru_cache(maxsize=4)
def _parse(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV} is not valid JSON ({exc}): {raw!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{ENV} must be a JSON object, got {raw!r}")
    return value


def settings() -> dict[str, Any]:
    raw = os.environ.get(ENV, "")
    return _parse(raw) if raw else {}


def check_batch(texts: Sequence[str], *, padded_tokens: int | None = None) -> None:
    """Raise the configured fault for a batch of ``texts`` padded to ``padded_tokens`` in all (no-op when unset)."""
    faults = settings()
    if not faults:
        return
    limit = faults.get("oom_above_rows")
    if limit is not None and len(texts) > int(limit):
        raise SimulatedOutOfMemory(f"simulated out of memory for a batch of {len(texts)} rows (limit {limit})")
    token_limit = faults.get("oom_above_tokens")
    if token_limit is not None and padded_tokens is not None and padded_tokens > int(token_limit):
        raise SimulatedOutOfMemory(
            f"simulated out of memory for a batch of {padded_tokens} padded tokens (limit {token_limit})"
        )
    marker = faults.get("poison_marker")
    if marker and any(marker in t for t in texts):
        raise InjectedFault(f"injected poison row (text contains {marker!r})")
