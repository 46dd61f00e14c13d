"""The base of every config section: unknown keys refused, values frozen, defaults validated too.

A module of its own so each section's module (:mod:`.data`, :mod:`.inference`,
:mod:`.models`) builds on it without importing the others.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["READS", "WRITES", "ConfigSection"]

# the metadata of a field that names a table, folder or file the job reads (only), or writes (and may read)
# (``Field(..., json_schema_extra=READS)``): :meth:`ConfigSection.locations` finds every one
READS: dict[str, Any] = {"location": "reads"}
WRITES: dict[str, Any] = {"location": "writes"}


class ConfigSection(BaseModel):
    """A config section: a key it does not declare fails validation naming the key path."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    def locations(self, *, reads: bool = False, prefix: str = "") -> dict[str, str]:
        """Every table, folder or file this section and the sections in it name, by key path
        (``{"source.path": "...", "task.interactions": "..."}``): the fields marked :data:`READS` or
        :data:`WRITES` that are set (``reads``: only what the job reads and never writes, which must exist before
        it runs). What a job touches, for a check that none is a relative path where the driver's folder is not
        the project's (a Databricks job or notebook)."""
        found: dict[str, str] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("location") in (("reads",) if reads else ("reads", "writes")) and isinstance(value, str) \
                    and value:
                found[prefix + name] = value
            elif isinstance(value, ConfigSection):
                found.update(value.locations(reads=reads, prefix=f"{prefix}{name}."))
        return found
