"""A test kind: ``embed`` that leaves a line in ``<load_log>/<pid>`` each time a worker loads its model.

The per-worker model cache is in the Python workers, out of a test's reach; this kind lets a test count the loads
each worker made (``loads_by_worker``). Registered by :func:`register` on the driver (a fixture, which
unregisters it after: never part of the docs' config reference); the workers import the classes by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from pipeline.registry import TaskKind, register_task
from pipeline.tasks.embed import EmbedTask, EmbedTaskConfig

__all__ = ["KIND", "LoadLogConfig", "LoadLogTask", "loads_by_worker", "register"]

KIND = "test_embed_load_log"


class LoadLogConfig(EmbedTaskConfig):
    """``embed``'s settings plus the folder the loads are logged in."""

    kind: Literal["test_embed_load_log"] = "test_embed_load_log"  # type: ignore[assignment]
    load_log: str = Field(..., description="a folder: each load appends a line to <folder>/<pid>")


class LoadLogTask(EmbedTask):
    kind: ClassVar[str] = KIND

    def load(self, model_dir: Path | None, device: str) -> Any:
        with open(Path(self.config.load_log) / str(os.getpid()), "a") as log:
            log.write("load\n")
        return super().load(model_dir, device)


def loads_by_worker(folder: Path) -> dict[str, int]:
    """``{pid: loads}`` logged in ``folder``."""
    return {p.name: len(p.read_text().splitlines()) for p in folder.iterdir()}


def register() -> TaskKind:
    return register_task(LoadLogConfig, LoadLogTask)
