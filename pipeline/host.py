"""Facts of the machine this process runs on that more than one floor asks about.

>>> import os
>>> pid_alive(os.getpid())
True
"""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """Whether a process of this host with ``pid`` is running (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
