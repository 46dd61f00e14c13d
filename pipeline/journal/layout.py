"""Where a run's staging lives and the names of what it writes there, whole or not at all.

A root holds the owner file ``_sbi_staging.json`` (written when a run creates it,
or adopts it empty) and one folder per plan, named by its plan key
(:mod:`pipeline.journal.plans`). A plan folder holds its ``plan.json``, per
finished task a rows file ``task-<n>.<12 hex>.arrow`` and a marker
``task-<n>.done.json`` that names it (:mod:`pipeline.journal.tasks`), and the
endpoint backend's journal and token ledger (:mod:`pipeline.journal.request_log`).

Every file a later try trusts is written by :func:`write_atomic` (a temp file,
fsync, ``os.replace``), so a writer killed half-way leaves the old file or none,
never a torn one; :func:`read_json` reads such a file back, None when it is
missing or unreadable. On a mount that refuses renames (a Unity Catalog Volume's
FUSE answers ``ENOSYS``, :func:`rename_refused`) the file is written in place
instead: a writer killed half-way there leaves JSON that does not parse, which
:func:`read_json` reads as missing, so a torn file is still never trusted.
"""

from __future__ import annotations

import errno
import json
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.core.locations import Location

__all__ = ["MARKER_SUFFIX", "OWNER_FILE", "PLAN_FILE", "STAGING_SUFFIX", "read_json", "rename_refused", "staging_root",
           "write_atomic"]

# the staging folder beside a local sink's table folder: <sink path>_staging
STAGING_SUFFIX = "_staging"
PLAN_FILE = "plan.json"
# written into a staging root this package created or adopted empty: the root's proof of ownership
OWNER_FILE = "_sbi_staging.json"
# a finished task's marker: task-<n>.done.json
MARKER_SUFFIX = ".done.json"


def staging_root(sink_path: "str | Location | None", override: str | None = None) -> str | None:
    """The local folder staged output goes to: ``override``, else ``<sink_path>_staging``.

    None when there is no local place for it (a catalog table, an ``s3a://`` sink without a
    ``run.staging_path``): the run then commits all or nothing, as without staging.

    >>> staging_root("/lake/scores"), staging_root("s3a://b/scores"), staging_root(None, "/mnt/stage")
    ('/lake/scores_staging', None, '/mnt/stage')
    """
    from pipeline.core.locations import Location

    sink = str(sink_path) if sink_path else None
    location = override or (f"{sink.rstrip('/')}{STAGING_SUFFIX}" if sink else None)
    if not location:
        return None
    return Location.of(location).path


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all: a temp file, fsync, then a rename over it (on a mount that
    refuses renames, :func:`rename_refused`: written in place, fsynced; torn, it does not parse)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        _write_synced(tmp, data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written temp file stays behind
        if not rename_refused(exc):
            raise
        _write_synced(path, data)


def rename_refused(exc: OSError) -> bool:
    """Whether ``exc`` is a mount refusing a rename it does not implement (``ENOSYS``, os error 38, as a Unity
    Catalog Volume's FUSE answers; ``EOPNOTSUPP``), not a missing file or a full disk."""
    return exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON in ``path``; None when it is missing or does not parse."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
