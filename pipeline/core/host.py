"""Facts of the machine this process runs on that more than one floor asks about: whether a process runs, and
where the library keeps what it learns for later runs (:func:`user_cache_folder`).

>>> import os
>>> pid_alive(os.getpid())
True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["pid_alive", "user_cache_folder"]


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with ``pid`` is running (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def user_cache_folder(name: str) -> Path:
    """``$SBI_CACHE_DIR/<name>``, else ``$XDG_CACHE_HOME/spark-batch-inference/<name>`` (``~/.cache`` by default)."""
    base = os.environ.get("SBI_CACHE_DIR") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                                  / "spark-batch-inference")
    return Path(base).expanduser() / name
