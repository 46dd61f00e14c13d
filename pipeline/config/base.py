"""The base of every config section: unknown keys refused, values frozen, defaults validated too.

A module of its own so each section's module (:mod:`.data`, :mod:`.inference`,
:mod:`.models`) builds on it without importing the others.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigSection"]


class ConfigSection(BaseModel):
    """A config section: a key it does not declare fails validation naming the key path."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
