"""``make test`` and ``make test-drills``: a set of the suite in two pytest runs, side by side (one JVM per process,
so they cannot share one run).

The sets: ``make test`` (the default) leaves out the ``drills`` (kills, SIGTERM, processing-time streams, the
retry and resume drills, races of writers at a barrier) and the ``lint`` checks, which ``make lint`` runs; ``--drills`` (``make test-drills``)
runs the drills alone; ``--all`` runs both sets. The runs: the jar-free run (``-m "not connector and not beside"``,
the deltalake writer) prints as it goes; the connector run (``SBI_TEST_CONNECTOR=1 -m "connector or beside"``)
writes ``.pytest-connector.log`` and is printed, whole, when it ends. ``beside`` tests are jar-free tests with a
Spark of their own in a subprocess: they run in the connector run (still jar-free, ``SBI_NO_JARS=1``) because it
would otherwise end minutes before the other. Either failing fails the command; Ctrl-C stops both. Other arguments
go to both runs::

    python -m tests.run_phases -p no:cacheprovider --durations=30
    python -m tests.run_phases --drills           # the drills, on both writers
    python -m tests.run_phases --serial           # one run after the other

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


# which tests a set takes, in both runs
SETS = {"test": "not drills and not lint", "drills": "drills", "all": "not lint"}


def main(argv: list[str]) -> int:
    serial = "--serial" in argv
    chosen = "drills" if "--drills" in argv else "all" if "--all" in argv else "test"
    args = [a for a in argv if a not in ("--serial", "--drills", "--all")]
    which = SETS[chosen]
    # `beside` tests (jar-free, each with a Spark of their own) run in the connector run, which is shorter
    jar_free = _pytest(["-m", f"not connector and not beside and ({which})", *args])
    connector = _pytest(["-m", f"(connector or beside) and ({which})", *args])
    # Python writes the bytecode of the checkout's modules (pipeline/, tests/; pytest its rewritten test modules)
    # once, for every later process of both runs to read: where PYTHONDONTWRITEBYTECODE is set (this project's
    # machines) each process compiled them again, a pytest run's collection 22.5 CPU-s instead of 16
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    connector_env = {**env, "SBI_TEST_CONNECTOR": "1"}
    started = time.monotonic()
    if serial:
        first = subprocess.call(jar_free, cwd=REPO, env=env)
        second = subprocess.call(connector, cwd=REPO, env=connector_env)
        return first or second
    procs: list[subprocess.Popen] = []
    try:
        with open(CONNECTOR_LOG, "wb") as log:
            # each run in a process group of its own, so Ctrl-C (or a failure to start) stops its JVMs too
            procs.append(subprocess.Popen(connector, cwd=REPO, env=connector_env, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
            print(f"[{chosen}] the connector run goes on beside this one; its output: {CONNECTOR_LOG}", flush=True)
            procs.append(subprocess.Popen(jar_free, cwd=REPO, env=env, start_new_session=True))
            first = procs[1].wait()
            print(f"[{chosen}] jar-free run: exit {first} after {time.monotonic() - started:.0f} s; "
                  "waiting for the connector run", flush=True)
            second = procs[0].wait()
    except KeyboardInterrupt:
        _stop(procs)
        return 130
    finally:
        _stop(procs)
    print(f"\n[{chosen}] ===== the connector run (SBI_TEST_CONNECTOR=1 pytest -m '(connector or beside) and ({which})'): "
          f"exit {second} after {time.monotonic() - started:.0f} s =====", flush=True)
    sys.stdout.buffer.write(CONNECTOR_LOG.read_bytes())
    sys.stdout.flush()
    return first or second


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
