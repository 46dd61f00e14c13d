"""Fault injection for tests and drills; off unless ``SBI_FAULTS`` is set in the environment.

``SBI_FAULTS`` holds JSON, for example::

    {"poison_marker": "POISON"}       # any batch holding a row whose text contains it raises
    {"oom_above_rows": 8}             # batches of more rows raise a (simulated) out-of-memory error

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


def check_batch(texts: Sequence[str]) -> None:
    """Raise the configured fault for a batch of ``texts`` (no-op when nothing is configured)."""
    faults = settings()
    if not faults:
        return
    limit = faults.get("oom_above_rows")
    if limit is not None and len(texts) > int(limit):
        raise SimulatedOutOfMemory(f"simulated out of memory for a batch of {len(texts)} rows (limit {limit})")
    marker = faults.get("poison_marker")
    if marker and any(marker in t for t in texts):
        raise InjectedFault(f"injected poison row (text contains {marker!r})")
