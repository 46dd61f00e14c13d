"""A folder that answers like a Unity Catalog Volume's FUSE mount, for one process: the shim and how to run in it.

A Volume's FUSE refuses the hard link delta-rs's commit makes, "Function not implemented (os error 38)"
(delta-io/delta-rs#2540), and renames the same way. ``volume_mount.c`` makes exactly those calls fail with
``ENOSYS`` under one folder, in the process it is preloaded into (``LD_PRELOAD``), built here with the system C
compiler. A FUSE passthrough would refuse them to Spark's JVM too; on Databricks Spark reaches a Volume through
the cloud store, not the FUSE, so the child (``volume_job.py``) keeps the shim to its own Python (the driver's
deltalake, staging files) and, when asked, its executors' Python workers, and starts the JVM without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.data import REPO

__all__ = ["build_shim", "run_on_volume"]

SOURCE = Path(__file__).with_name("volume_mount.c")


def build_shim(folder: Path) -> Path | None:
    """The shim, compiled into ``folder``; None where this machine has no C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    out = folder / "volume_mount.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(SOURCE), "-ldl"], check=True,
                   capture_output=True)
    return out


def run_on_volume(shim: Path, root: Path, spec: dict, *, timeout_s: float, env: dict | None = None) -> dict:
    """Run ``tests/support/volume_job.py`` with ``spec`` in a process whose links and renames under ``root`` fail
    with ENOSYS; the JSON of its ``RESULT`` line (fails with the end of its output when there is none)."""
    spec_file = root.parent / f"volume-spec-{os.getpid()}-{len(list(root.parent.glob('volume-spec-*')))}.json"
    spec_file.write_text(json.dumps(spec))
    child = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable,
             "LD_PRELOAD": str(shim), "SBI_VOLUME_ROOT": str(root.resolve()), **(env or {})}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "volume_job.py"), str(spec_file)],
                          cwd=REPO, env=child, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])
