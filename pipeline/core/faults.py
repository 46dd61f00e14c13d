"""Fault injection for tests and failure drills. Off unless configured.

Set ``SBI_FAULTS`` (JSON) in the driver's environment, or ``run.faults`` in the
config; the runner ships the settings to the executors inside the inference
plan and the writer options, so they reach every worker (changing an
executor's environment after Spark started would not). Keys:

``poison_marker``          a batch holding a row whose text contains it raises (a poison row)
``oom_above_rows``         batches of more rows raise a simulated out-of-memory error
``oom_above_tokens``       batches of more padded tokens (rows x length) do, as real memory would
``slow_batch_s``           every batch takes this many seconds longer (a slow model: long tasks for progress drills)
``fail_infer_partitions``  these partitions fail their first attempt during inference
``kill_worker_partitions`` these partitions' Python worker dies (``os._exit``) mid-task, first attempt
``fail_write_partitions``  these partitions fail their first attempt after writing a Parquet file (the
                           connector: in its write stage, as ``exit_write_partitions`` below)
``lose_and_duplicate_partitions`` these partitions drop their first row and emit their second twice
                           (every attempt): a lost row and a duplicated one that a row count cannot see
``lose_row_at_commit``     the output commit leaves out the row with this id (a writer that loses a row after
                           the checks before the commit): only the read-back after the commit can see it
``swap_row_at_commit``     ``[lost id, doubled id]``: the output commit leaves out the first id's row and writes the
                           second's twice, as many rows as it was sent: only the keys of the read-back see it
``fail_before_commit``     the driver fails after inference and the checks, before any commit (every task's
                           output scored, and staged: a crash a rerun resumes from)
``fail_after_quarantine_commit`` the driver fails right after committing the quarantine table,
                           before the output (a crash between the two commits)
``exit_write_partitions``  these partitions' Python worker dies (``os._exit``) in the middle of ``write()``,
                           after the first batch went into its Parquet file, first attempt. The connector
                           has no ``write()`` of ours: its write stage's rows pass through a Python step
                           that dies once half of a task's first chunk went on to the connector
``stall_write``            ``{"partitions": [n, ...], "s": seconds}``: these partitions' write task waits ``s``
                           seconds (first attempt) where ``exit_write_partitions`` would kill it, so a drill
                           acts while the write job runs: other tasks' files are in the table folder and the
                           driver waits inside the write (the connector: inside its ``save`` or ``MERGE``;
                           a partitioned write sorts its rows before it opens a file, so the held task has none)
``late_close``             ``{"partitions": [n, ...], "dir": folder}``: these partitions' write task puts a probe
                           named like the write's files in the table and waits until the driver's abort swept it,
                           then closes its files (touching ``<dir>/<partition>.closed``) and its Python worker dies
                           before it looks at the write's marker (first attempt): a file that lands after the
                           abort's clean-up, as a worker Spark kills late leaves one
``commit_barrier``         ``{"dir": folder, "parties": n, "timeout_s": s}``: the ``sbi_delta`` commit touches
                           ``<dir>/<write id>.ready`` once it has read the table, then waits until ``n`` such
                           files exist (or ``<dir>/release`` does, or ``s`` seconds pass) before committing.
                           The connector writes and commits in one call (``save``, ``MERGE``): its driver
                           waits so right before that call
``quarantine_commit_barrier`` the same as ``commit_barrier``, for the quarantine table's commit (its files
                           written, nothing committed; the connector: right before its ``save``)
``quarantine_barrier``     the same, for the driver right after its quarantine commit (``<dir>/<run id>.ready``):
                           overlapping runs interleave their quarantine and output commits
``output_barrier``         the same, for the driver right after its output commit landed (``<dir>/<run id>.ready``),
                           before anything records it (a stream's checkpoint): a driver killed there has committed
``batch_barrier``          ``{"dir": folder, "at": "uploaded" | "created", "parties": n, "timeout_s": s}``: a run in
                           batch mode (``task.endpoint.mode: batch``) touches ``<dir>/<at>.ready`` right after it
                           journaled a request file's upload (``uploaded``) or its batch (``created``), then waits
                           as at ``commit_barrier``: a drill kills the driver there

Example: ``SBI_FAULTS='{"fail_infer_partitions": [0], "fail_write_partitions": [1]}'``.

The environment is read once, on the driver (:func:`from_env`); each task
activates its plan's settings (:func:`activate`). With none, :data:`enabled` is
false and the batch loops skip every hook: no fault code runs per batch in production.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipeline.errors import InjectedFaultError, SimulatedOutOfMemoryError

__all__ = ["InjectedFaultError", "SimulatedOutOfMemoryError", "activate", "after_output_commit", "at_batch_step",
           "after_quarantine_commit", "before_commits",
           "lost_at_output_commit", "quarantine_write_faults", "swapped_at_output_commit",
           "check_batch", "closes_late", "from_env", "on_commit", "on_output", "on_task_start", "on_write"]

ENV = "SBI_FAULTS"
# drills that change what a task outputs (statuses, rows): staged output of a run under one of them is
# reused only by a run under the same (pipeline.journal); the others only slow, fail or kill attempts
RESULT_FAULTS = ("poison_marker", "lose_and_duplicate_partitions")
_active: dict[str, Any] = {}
# read by the batch loops before calling check_batch: false unless a drill is active
enabled = False


def from_env(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The driver's fault settings: ``SBI_FAULTS`` merged with ``extra`` (config)."""
    raw = os.environ.get(ENV, "").strip()
    settings: dict[str, Any] = {}
    if raw:
        try:
            settings = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV} is not valid JSON ({exc}): {raw!r}") from None
        if not isinstance(settings, dict):
            raise ValueError(f"{ENV} must be a JSON object, got {raw!r}")
    return {**settings, **(extra or {})}


def activate(settings: Mapping[str, Any] | None) -> None:
    """Make ``settings`` the faults of this process (each task calls this with its plan's faults; None clears)."""
    global enabled
    _active.clear()
    _active.update(settings or {})
    enabled = bool(_active)


def check_batch(texts: Sequence[str], *, padded_tokens: int | None = None) -> None:
    """Raise the configured fault for a batch of ``texts`` padded to ``padded_tokens`` in all (no-op when unset).

    Callers check :data:`enabled` first, so production batches never build its arguments.
    """
    faults = _active
    if not faults:
        return
    if faults.get("slow_batch_s"):
        import time

        time.sleep(float(faults["slow_batch_s"]))
    limit = faults.get("oom_above_rows")
    if limit is not None and len(texts) > int(limit):
        raise SimulatedOutOfMemoryError(f"simulated out of memory for a batch of {len(texts)} rows (limit {limit})")
    token_limit = faults.get("oom_above_tokens")
    if token_limit is not None and padded_tokens is not None and padded_tokens > int(token_limit):
        raise SimulatedOutOfMemoryError(
            f"simulated out of memory for a batch of {padded_tokens} padded tokens (limit {token_limit})"
        )
    marker = faults.get("poison_marker")
    if marker and any(marker in t for t in texts):
        raise InjectedFaultError(f"injected poison row (text contains {marker!r})")


def _first_attempt_of(key: str, partition: int, attempt: int, faults: Mapping[str, Any]) -> bool:
    return attempt == 0 and partition in set(faults.get(key) or ())


def on_task_start(partition: int, attempt: int) -> None:
    """Inference-side faults for one task attempt (called after its first chunk is scored)."""
    faults = _active
    if _first_attempt_of("kill_worker_partitions", partition, attempt, faults):
        os._exit(13)  # the Python worker dies mid-task, as on a segfault or an OOM kill
    if _first_attempt_of("fail_infer_partitions", partition, attempt, faults):
        raise InjectedFaultError(f"injected inference failure in partition {partition}, attempt {attempt}")


def on_write(partition: int, attempt: int, faults: Mapping[str, Any]) -> None:
    """Write-side fault: called after a task attempt has written a Parquet file (the connector: once half
    of a write task's first chunk went on to it)."""
    stall = faults.get("stall_write")
    if stall and _first_attempt_of("partitions", partition, attempt, stall):
        import time

        time.sleep(float(stall.get("s", 60)))
    if _first_attempt_of("exit_write_partitions", partition, attempt, faults):
        os._exit(14)  # the Python worker dies with its Parquet file half written, its cleanup never runs
    if _first_attempt_of("fail_write_partitions", partition, attempt, faults):
        raise InjectedFaultError(f"injected write failure in partition {partition}, attempt {attempt}")


def closes_late(partition: int, attempt: int, faults: Mapping[str, Any], plant: Any, planted: Any) -> Any:
    """Write-side fault ``late_close``: when this attempt is listed, ``plant()`` a probe named like the
    write's files and wait until it is gone (``planted()`` false: the driver's abort swept the write's
    files); returns what the task calls once its own files are closed (it touches the witness and kills the
    worker), else None."""
    late = faults.get("late_close")
    if not late or not _first_attempt_of("partitions", partition, attempt, late):
        return None
    import time

    plant()
    deadline = time.monotonic() + float(late.get("timeout_s", 120))
    while planted() and time.monotonic() < deadline:
        time.sleep(0.02)

    def die() -> None:
        if late.get("dir"):
            Path(late["dir"], f"{partition}.closed").touch()
        os._exit(15)  # the worker dies between its last upload and its look at the marker

    return die


def on_output(batch: Any, partition: int, chunk: int) -> Any:
    """Inference-output fault: the first chunk of a listed partition loses its row 0 and repeats its row 1."""
    if chunk != 0 or batch.num_rows < 2 or partition not in set(_active.get("lose_and_duplicate_partitions") or ()):
        return batch
    import pyarrow as pa

    return batch.take(pa.array([1, 1, *range(2, batch.num_rows)]))


def before_commits(faults: Mapping[str, Any]) -> None:
    """Driver-side fault (``fail_before_commit``): the job dies after inference, before any commit."""
    if faults.get("fail_before_commit"):
        raise InjectedFaultError("injected driver failure after inference, before any commit")


def quarantine_write_faults(faults: Mapping[str, Any]) -> dict[str, Any] | None:
    """The faults the quarantine table's write gets: ``quarantine_commit_barrier`` as its ``commit_barrier``
    (none of the output write's drills)."""
    barrier = faults.get("quarantine_commit_barrier")
    return {"commit_barrier": barrier} if barrier else None


def after_quarantine_commit(faults: Mapping[str, Any], *, version: int | None, run_id: str = "") -> None:
    """Driver-side faults between the quarantine commit and the output commit: the job dies there
    (``fail_after_quarantine_commit``), or waits for other runs to get there (``quarantine_barrier``)."""
    if faults.get("quarantine_barrier"):
        _wait_at(faults["quarantine_barrier"], run_id or "run")
    if faults.get("fail_after_quarantine_commit"):
        raise InjectedFaultError(f"injected driver failure after the quarantine commit (version {version}), "
                                 "before the output commit")


def after_output_commit(faults: Mapping[str, Any], *, run_id: str = "") -> None:
    """Driver-side drill right after the output commit landed (``output_barrier``): the driver waits there, so
    a test can kill it with its commit made and nothing after it done."""
    if faults.get("output_barrier"):
        _wait_at(faults["output_barrier"], run_id or "run")


def at_batch_step(faults: Mapping[str, Any], step: str) -> None:
    """Driver-side drill of batch mode (``batch_barrier``): wait at ``step`` (``uploaded``, ``created``) of the
    first request file that reaches it, so a test can kill the driver there."""
    barrier = faults.get("batch_barrier")
    if barrier and barrier.get("at") == step and not (Path(barrier["dir"]) / f"{step}.ready").exists():
        _wait_at(barrier, step)


def lost_at_output_commit(faults: Mapping[str, Any]) -> Any:
    """Driver-side fault (``lose_row_at_commit``): the id the output commit leaves out, else None."""
    return faults.get("lose_row_at_commit")


def swapped_at_output_commit(faults: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """Driver-side fault (``swap_row_at_commit``): ``(id left out, id written twice)`` by the output commit."""
    swap = faults.get("swap_row_at_commit")
    return (swap[0], swap[1]) if swap else None


def on_commit(write_id: str, faults: Mapping[str, Any]) -> None:
    """Commit-side fault (``commit_barrier``): called by the driver-side commit after it read the table
    (the connector's write: right before its ``save``/``MERGE``, which writes and commits)."""
    barrier = faults.get("commit_barrier")
    if barrier:
        _wait_at(barrier, write_id)


def _wait_at(barrier: Mapping[str, Any], name: str) -> None:
    """Touch ``<dir>/<name>.ready`` and wait until ``parties`` such files exist (or ``<dir>/release`` does,
    or ``timeout_s`` passes). The parties leave within 5 ms of each other: races at the commit are real races."""
    import time
    from pathlib import Path

    folder = Path(barrier["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.ready").touch()
    deadline = time.monotonic() + float(barrier.get("timeout_s", 60))
    parties = int(barrier.get("parties", 1))
    while time.monotonic() < deadline and not (folder / "release").exists():
        if len(list(folder.glob("*.ready"))) >= parties:
            return
        time.sleep(0.005)
