"""What resuming a killed run saves, and what staging costs a run nobody kills.

    make bench-resume                                        # 100,000 rows, 1 repeat
    PYTHONPATH=. .venv/bin/python bench/bench_resume.py --rows 2000 --tasks 8

Every run is the real command, ``python -m pipeline run <config>``, in a process of its own (its own
JVM), on a synthetic source of ``--rows`` review-like documents and the demo's model
(all-MiniLM-L6-v2, ``conf/score_documents.yaml``'s task), appending into a fresh output each time:

- ``no staging``: a clean run with ``run.staging: false`` (the all-or-nothing run of before);
- ``staging``: the same clean run with staging on (the default), nothing killed;
- ``killed``: a run SIGKILLed (its whole process group: the JVM and Python workers) once
  ``--kill-at`` of its inference tasks have staged their output;
- ``rerun``: the same command again, which reuses the killed run's finished tasks.

Reported, from each run's summary (run_job's own stages, so the JVM start is left out, and also the
whole process's wall time): ``rerun / staging`` (goal <= 0.55 at a kill at 50%: the rerun scores about
half the rows) and ``staging / no staging - 1`` (goal < 3%). ``--repeats`` runs each pair that many
times and reports medians. Results: ``bench/results_resume.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORDS = ("the a and but not very good bad great awful movie film plot actor story boring fun loved hated "
         "music food service taste quiet loud long short dark funny scary wonderful terrible slow fast").split()


def make_source(path: Path, rows: int, *, seed: int = 0) -> None:
    """``doc_id``, ``text``, ``source``: ``rows`` documents of 5 to 150 words (a review-like spread)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(int(rng.lognormvariate(3.3, 0.7)) % 150 + 5))
             for _ in range(rows)]
    table = pa.table({"doc_id": [f"d{i:08d}" for i in range(rows)], "text": texts, "source": ["bench"] * rows})
    write_deltalake(str(path), table, mode="overwrite")


def job_config(work: Path, name: str, *, tasks: int | None, staging: bool, master: str) -> Path:
    """A JSON config (YAML reads it) for ``python -m pipeline run``: the demo's task on the bench source."""
    from pipeline.config import load_config

    base = load_config(REPO / "conf" / "score_documents.yaml").model_dump(mode="json")
    base["spark"].update(master=master, app_name=f"bench-resume-{name}")
    base["source"].update(path=str(work / "docs"), repartition=tasks)
    base["sink"].update(path=str(work / name / "scores"), mode="append", quarantine_path=None)
    base["run"].update(ds="2026-11-29", run_id=None, progress=False, summary_path=str(work / name / "summary.json"),
                       staging=staging, runs_path=str(work / name / "runs"))
    path = work / name / "job.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(base))
    return path


def start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "pipeline", "run", str(config)], cwd=str(REPO), env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def run(config: Path) -> dict[str, Any]:
    """One whole run: its summary plus ``process_s`` (the process's wall time) and ``job_s`` (run_job's)."""
    log = config.with_suffix(".log")
    started = time.perf_counter()
    proc = start(config, log)
    if proc.wait() != 0:
        raise SystemExit(f"{config.parent.name}: the run failed; see {log}\n{log.read_text()[-2000:]}")
    summary = json.loads((config.parent / "summary.json").read_text())
    if not summary["complete"]:
        raise SystemExit(f"{config.parent.name}: incomplete run ({summary['rows_in']} in, {summary['rows_out']} out)")
    summary["process_s"] = time.perf_counter() - started
    summary["job_s"] = sum(summary["stage_seconds"].values())
    return summary


def staged_markers(sink: Path) -> int:
    root = sink.with_name(sink.name + "_staging")
    return len(list(root.glob("*/task-*.done.json"))) if root.is_dir() else 0


def run_killed(config: Path, *, tasks_done: int, timeout_s: float = 3600) -> dict[str, Any]:
    """Run ``config`` and SIGKILL its process group once ``tasks_done`` tasks staged their output."""
    sink = config.parent / "scores"
    log = config.with_suffix(".killed.log")
    started = time.perf_counter()
    proc = start(config, log)
    try:
        while staged_markers(sink) < tasks_done:
            if proc.poll() is not None or time.perf_counter() - started > timeout_s:
                raise SystemExit(f"the run to kill ended or stalled before {tasks_done} tasks staged; see {log}")
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {"killed_after_s": time.perf_counter() - started, "tasks_staged": staged_markers(sink)}


def planned_tasks(summary: dict[str, Any]) -> int:
    return int(summary["tasks"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=None, help="inference tasks (source.repartition); default: planned")
    parser.add_argument("--kill-at", type=float, default=0.5, help="fraction of the tasks staged when the kill comes")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp folder, removed after)")
    parser.add_argument("--json", default=str(REPO / "bench" / "results_resume.json"))
    args = parser.parse_args(argv)

    work = Path(args.work or tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        make_source(work / "docs", args.rows)
        rounds = []
        for repeat in range(args.repeats):
            def fresh(name: str, staging: bool) -> Path:
                shutil.rmtree(work / name, ignore_errors=True)
                return job_config(work, name, tasks=args.tasks, staging=staging, master=args.master)

            plain = run(fresh("plain", False))
            staged = run(fresh("staged", True))
            resume_config = fresh("resumed", True)
            tasks = planned_tasks(staged)
            killed = run_killed(resume_config, tasks_done=max(1, math.ceil(tasks * args.kill_at)))
            rerun = run(resume_config)
            rounds.append({"plain": plain, "staged": staged, "killed": killed, "rerun": rerun, "tasks": tasks})
            print(f"repeat {repeat + 1}: no staging {plain['job_s']:.1f} s, staging {staged['job_s']:.1f} s, "
                  f"killed after {killed['tasks_staged']}/{tasks} tasks ({killed['killed_after_s']:.1f} s), rerun "
                  f"{rerun['job_s']:.1f} s (resumed {rerun['resumed_tasks']} tasks, {rerun['rows_reused']:,} rows "
                  f"reused, {rerun['rows_scored']:,} scored)", flush=True)
        report = summarize(rounds, rows=args.rows, kill_at=args.kill_at)
        print(json.dumps(report["figures"], indent=2))
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"written: {args.json}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def summarize(rounds: list[dict[str, Any]], *, rows: int, kill_at: float) -> dict[str, Any]:
    """Medians over the repeats: the two ratios (run_job's time and the process's), with their goals."""
    def median(key: str, what: str) -> float:
        return statistics.median(r[key][what] for r in rounds)

    figures = {
        "rows": rows, "tasks": rounds[0]["tasks"], "kill_at": kill_at, "repeats": len(rounds),
        "no_staging_s": round(median("plain", "job_s"), 2), "staging_s": round(median("staged", "job_s"), 2),
        "rerun_s": round(median("rerun", "job_s"), 2),
        "resumed_tasks": [r["rerun"]["resumed_tasks"] for r in rounds],
        "rerun_over_clean": round(median("rerun", "job_s") / median("staged", "job_s"), 3),
        "rerun_over_clean_process": round(median("rerun", "process_s") / median("staged", "process_s"), 3),
        "staging_cost": round(median("staged", "job_s") / median("plain", "job_s") - 1, 4),
        "staging_cost_process": round(median("staged", "process_s") / median("plain", "process_s") - 1, 4),
        "goals": {"rerun_over_clean": "<= 0.55", "staging_cost": "< 0.03"},
    }
    keep = ("job_s", "process_s", "stage_seconds", "resumed_tasks", "rows_reused", "rows_scored", "tasks")
    detail = [{k: ({f: r[k].get(f) for f in keep} if isinstance(r[k], dict) and "job_s" in r[k] else r[k])
               for k in r} for r in rounds]
    return {"figures": figures, "rounds": detail, "python": sys.version.split()[0], "cpus": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
