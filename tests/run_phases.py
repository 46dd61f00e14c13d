"""``make test``: the suite's two pytest runs, side by side (one JVM per process, so they cannot share one run).

The jar-free run (``-m "not connector and not beside"``, the deltalake writer) prints as it goes; the
connector run (``SBI_TEST_CONNECTOR=1 -m "connector or beside"``) writes ``.pytest-connector.log`` and is
printed, whole, when it ends. ``beside`` tests are jar-free drills with a Spark of their own in a subprocess:
they run in the connector run (still jar-free, ``SBI_NO_JARS=1``) because it would otherwise end minutes before
the other. Either failing fails the command; Ctrl-C stops both. Arguments go to both runs::

    python -m tests.run_phases -p no:cacheprovider --durations=15
    python -m tests.run_phases --serial      # one after the other, as before

On 2 cores neither run keeps both cores busy (its driver's planning and the JVM starts of the drills are
single-threaded): side by side the suite took 0.75x the time of the two runs in turn (docs/benchmarks_small_jobs.md,
"The suite's JVM code cache and its two runs side by side").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONNECTOR_LOG = REPO / ".pytest-connector.log"


def _pytest(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def main(argv: list[str]) -> int:
    serial = "--serial" in argv
    args = [a for a in argv if a != "--serial"]
    # `beside` tests (jar-free, each with a Spark of its own) run in the connector run, which is shorter
    jar_free = _pytest(["-m", "not connector and not beside", *args])
    connector = _pytest(["-m", "connector or beside", *args])
    connector_env = {**os.environ, "SBI_TEST_CONNECTOR": "1"}
    started = time.monotonic()
    if serial:
        first = subprocess.call(jar_free, cwd=REPO)
        second = subprocess.call(connector, cwd=REPO, env=connector_env)
        return first or second
    procs: list[subprocess.Popen] = []
    try:
        with open(CONNECTOR_LOG, "wb") as log:
            # each run in a process group of its own, so Ctrl-C (or a failure to start) stops its JVMs too
            procs.append(subprocess.Popen(connector, cwd=REPO, env=connector_env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
            print(f"[make test] the connector run goes on beside this one; its output: {CONNECTOR_LOG}", flush=True)
            procs.append(subprocess.Popen(jar_free, cwd=REPO, start_new_session=True))
            first = procs[1].wait()
            print(f"[make test] jar-free run: exit {first} after {time.monotonic() - started:.0f} s; "
                  "waiting for the connector run", flush=True)
            second = procs[0].wait()
    except KeyboardInterrupt:
        _stop(procs)
        return 130
    finally:
        _stop(procs)
    print(f"\n[make test] ===== the connector run (SBI_TEST_CONNECTOR=1 pytest -m 'connector or beside'): exit {second} after "
          f"{time.monotonic() - started:.0f} s =====", flush=True)
    sys.stdout.buffer.write(CONNECTOR_LOG.read_bytes())
    sys.stdout.flush()
    return first or second


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
