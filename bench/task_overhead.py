"""What a Python worker pays per task beyond its rows: ``--tasks`` one-row tasks through ``mapInPandas`` on a local
session built by ``get_session`` (its workers forked from ``pipeline.spark.daemon``), against the same jobs with
the daemon as it was before it froze its imports (``bench/unfrozen_daemon.py``), in the same run.

    PYTHONPATH=. .venv/bin/python bench/task_overhead.py --tasks 200 --jobs 3 --repeats 3

PySpark's worker runs a full ``gc.collect()`` after every task; with torch and transformers imported in the daemon
that walked ~276,000 objects and copied the pages holding them into each forked worker. Each repeat starts one
process per daemon (a new session: the daemon module is read at the SparkContext's start), in turn, and each
process runs ``--jobs`` jobs after one warm-up job that starts the daemon. Reported per daemon: the wall seconds
per job and the CPU seconds of the daemon's process tree (the daemon and its forked workers, from /proc), medians
over every job of every repeat with their range; and the frozen daemon's wall over the unfrozen one's (the median of
the per-repeat ratios, with their range). Results: ``--json``; the reading in docs/benchmarks_small_jobs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
DAEMONS = {"frozen": "pipeline.spark.daemon", "unfrozen": "unfrozen_daemon"}


def _tree_cpu(module: str) -> float:
    """CPU seconds of the processes running ``-m module`` (and the children they reaped: exited workers)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    needle = f"-m\0{module}\0".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue
    return total


def _one(daemon: str, tasks: int, jobs: int) -> list[dict]:
    """In this process: a session with ``daemon``, a warm-up job, then ``jobs`` timed jobs of ``tasks`` tasks."""
    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    module = DAEMONS[daemon]
    spark = get_session(SparkConfig(master="local[2]", app_name=f"task-overhead-{daemon}", shuffle_partitions=4,
                                    conf={"spark.python.daemon.module": module}))

    def rows(batches):
        yield from batches

    spark.range(0, 4, numPartitions=2).mapInPandas(rows, "id long").count()
    found = []
    for _ in range(jobs):
        cpu, started = _tree_cpu(module), time.perf_counter()
        assert spark.range(0, 2 * tasks, numPartitions=tasks).mapInPandas(rows, "id long").count() == 2 * tasks
        found.append({"wall_s": round(time.perf_counter() - started, 2), "cpu_s": round(_tree_cpu(module) - cpu, 2)})
    spark.stop()
    return found


def _spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 2), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", choices=sorted(DAEMONS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(_one(args.one, args.tasks, args.jobs)), flush=True)
        return 0
    sys.path.insert(0, str(REPO))
    from bench.bench_limit import cpu_info

    info = cpu_info()
    print(f"CPU: {info['model']}, {info['cores']} cores, flags {info['flags']}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(BENCH),
                                                                       os.environ.get("PYTHONPATH")]))}
    runs: dict[str, list[list[dict]]] = {name: [] for name in DAEMONS}
    for repeat in range(args.repeats):
        for name in ("unfrozen", "frozen"):
            done = subprocess.run([sys.executable, __file__, "--one", name, "--tasks", str(args.tasks),
                                   "--jobs", str(args.jobs)], env=env, capture_output=True, text=True, check=True)
            jobs = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
            runs[name].append(jobs)
            print(f"repeat {repeat + 1}, {name}: " + ", ".join(f"{j['wall_s']} s ({j['cpu_s']} CPU-s)" for j in jobs),
                  flush=True)
    summary = {name: {key: _spread([j[key] for jobs in found for j in jobs]) for key in ("wall_s", "cpu_s")}
               for name, found in runs.items()}
    ratios = [statistics.median(j["wall_s"] for j in frozen) / statistics.median(j["wall_s"] for j in unfrozen)
              for frozen, unfrozen in zip(runs["frozen"], runs["unfrozen"])]
    summary["frozen_over_unfrozen_wall"] = _spread([round(r, 3) for r in ratios])
    for name in DAEMONS:
        wall, cpu = summary[name]["wall_s"], summary[name]["cpu_s"]
        print(f"{name}: {wall['median']} s a job ({wall['min']}-{wall['max']}), daemon tree {cpu['median']} CPU-s "
              f"({cpu['min']}-{cpu['max']}), {args.tasks} tasks")
    ratio = summary["frozen_over_unfrozen_wall"]
    print(f"frozen over unfrozen, wall: {ratio['median']} ({ratio['min']}-{ratio['max']})")
    if args.json:
        args.json.write_text(json.dumps({"cpu": info, "tasks": args.tasks, "jobs": args.jobs,
                                         "repeats": args.repeats, "runs": runs, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
