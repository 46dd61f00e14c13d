"""Drivers in processes of their own for the kill drills: start ``tests/support/commit_job.py`` on a config file, and
SIGKILL it with everything below it once a condition holds (tests/run/test_resume.py, tests/run/test_commits.py);
and callables run at once in threads, for the overlapping-commit tests (:func:`at_once`, :func:`entered_together`);
a test's helper thread whose failure fails the test and stops what it drove (:class:`Helper`, :func:`wait_for`);
and the job scripts that print one ``RESULT <json>`` line (:func:`run_job_script`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

REPO = Path(__file__).resolve().parents[2]


def start_driver(config_file: Path, log: Path, faults: dict | None = None,
                 env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """``python tests/support/commit_job.py <config_file>`` in a session (process group) of its own, its output in ``log``.

    ``faults`` ride in ``SBI_FAULTS``: the command and its config file stay those of a plain run. ``env``
    adds variables to the driver's environment (S3 keys, ``SBI_NO_JARS``).
    """
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO), **(env or {})}
    env.pop("SBI_FAULTS", None)
    if faults:
        env["SBI_FAULTS"] = json.dumps(faults)
    with open(log, "wb") as sink:
        return subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "commit_job.py"), str(config_file)],
                                env=env, cwd=str(REPO), stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)


def run_job_script(script: str, *args: object, timeout_s: float, output: list[str] | None = None,
                   env: Mapping[str, str] | None = None) -> dict:
    """Run ``tests/support/<script>`` with ``args`` on this interpreter; the JSON of its last ``RESULT`` line.

    Fails, with the end of its output, when the script exits non-zero or prints no result. ``output``, when
    given, receives the other lines the script printed on stdout; ``env`` adds variables to its environment.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable, **(env or {})}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "support" / script), *map(str, args)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-4000:]
    if output is not None:
        output.extend(line for line in done.stdout.splitlines() if not line.startswith("RESULT "))
    return json.loads(lines[-1][len("RESULT "):])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from ``/proc``), whatever process group it put itself in."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def below_of(pid: int) -> tuple[list[int], set[int]]:
    """The processes below ``pid`` and their process groups, taken while ``pid`` lives: once it exits, its
    children belong to init and ``descendants`` no longer finds them (the driver's JVM and its workers)."""
    below = descendants(pid)
    groups = {pid}
    for child in below:
        try:
            groups.add(os.getpgid(child))  # the daemon's group: a worker it forks meanwhile is in it too
        except ProcessLookupError:
            pass
    return below, groups


def kill_below(snapshot: tuple[list[int], set[int]]) -> None:
    """SIGKILL every process group and process of a ``below_of`` snapshot (this test's own group spared)."""
    below, groups = snapshot
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_when(driver: subprocess.Popen, ready: Callable[[], bool], log: Path, *, timeout_s: float = 300) -> None:
    """SIGKILL the driver and everything below it once ``ready()`` holds, as a lost node takes them all.

    The driver's process group alone is not all: PySpark's worker daemon puts itself and its Python
    workers in a group of their own, and a worker left running finishes its task (and stages it) after
    the kill, which made the count of tasks finished before the kill a race.
    """
    deadline = time.monotonic() + timeout_s
    try:
        while not ready():
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        kill_below(below_of(driver.pid))
        driver.wait(timeout=60)


def at_once(calls: Mapping[str, Callable[[], object]], *, expected: tuple[type[BaseException], ...] = (),
            timeout_s: float = 300) -> dict[str, object]:
    """Run each callable in a thread of its own, all started together; each name's return value, or its
    exception where that is one of ``expected`` (a lost race the test asserts on).

    Any other exception fails the test (chained to it), and so does a thread still running after ``timeout_s``.
    """
    outcomes: dict[str, object] = {}

    def run(name: str, call: Callable[[], object]) -> None:
        try:
            outcomes[name] = call()
        except BaseException as exc:  # noqa: BLE001 - the caller asserts on it
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    stuck = [name for name in calls if name not in outcomes]
    assert not stuck, f"still running after {timeout_s} s: {stuck}"
    unexpected = {n: o for n, o in outcomes.items() if isinstance(o, BaseException) and not isinstance(o, expected)}
    if unexpected:
        raise AssertionError(f"failed at once: {unexpected}") from next(iter(unexpected.values()))
    return outcomes


def entered_together(fn: Callable[..., object], parties: int = 2) -> Callable[..., object]:
    """``fn``, entered only when ``parties`` threads have called it: the racers reach it at the same instant."""
    barrier = threading.Barrier(parties, timeout=60)

    def together(*args, **kwargs):
        barrier.wait()
        return fn(*args, **kwargs)

    return together


def wait_for(check: Callable[[], object], what: str, *, timeout_s: float = 120, every_s: float = 0.5) -> None:
    """Poll ``check`` until it holds; an AssertionError naming ``what`` was awaited once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(every_s)


class Helper:
    """A test's helper thread (it feeds a stream, changes a source, sends a signal) whose failure fails the test.

    ``on_error`` runs in the thread once ``target`` raised, to stop what the test's main thread waits on (a stream
    that would otherwise run until its timeout: send it a SIGTERM), and again every ``repeat_s`` seconds until the
    test joins the thread (a SIGTERM that came before the run installed its handler is lost). :meth:`join` raises
    the thread's exception, or an AssertionError when it is still running; call it in a ``finally`` so its error
    is the one reported.
    """

    def __init__(self, target: Callable[[], object], *, on_error: Callable[[], object] | None = None,
                 repeat_s: float = 2.0) -> None:
        self.target, self.on_error, self.repeat_s = target, on_error, repeat_s
        self.error: BaseException | None = None
        self.joined = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.target()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by join()
            self.error = exc
            while self.on_error is not None and not self.joined.is_set():
                try:
                    self.on_error()
                except Exception:  # noqa: BLE001 - the target's error is the one reported; try again
                    pass
                self.joined.wait(self.repeat_s)

    def start(self) -> "Helper":
        self.thread.start()
        return self

    def join(self, timeout_s: float = 60) -> None:
        self.joined.set()
        self.thread.join(timeout_s)
        if self.error is not None:
            raise AssertionError(f"the helper thread failed: {self.error}") from self.error
        assert not self.thread.is_alive(), f"the helper thread still runs after {timeout_s:g} s"
