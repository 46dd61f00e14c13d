"""What keying appends on their rows costs: a 100,000-row append into a day that already holds N rows.

    make bench-row-keys                                   # N = 100,000 and 10,000,000; 3 repeats each
    PYTHONPATH=. .venv/bin/python bench/bench_row_keys.py --existing 100000 --repeats 1

An append is keyed on ``(id, ds)``: before scoring, the runner leaves out the ids the output already
holds for the day (an anti-join that reads the day's id column), and the commit writes only keys
still missing (deltalake writer: nothing to check unless another commit landed since the run read its
keys). Measured with the model-free task ``bench_hash_score`` (``bench/bench_scaling.py``), so what
is left is the pipeline's own path, in one ``local[2]`` session:

- ``keyed``: today's ``run_job``;
- ``blind``: the same run with the key filter and the keyed commit switched off in this process
  (the blind append the project made before row keys), as the baseline;

alternated (blind, keyed, blind, keyed, ...) on a fresh copy of the same prefilled output each time.
Reported: the job's wall time and its driver stages (``planning`` holds the key filter, ``commit``
the commit), medians with their ranges, and the keyed run's extra seconds as a share of the blind
run's wall time. ``--overlap`` also times the deltalake writer's commit-time check when an
overlapping run committed 100,000 of the same keys first (pyarrow only, no Spark): list the files
added since, read their keys, drop them from the staged files. Results:
``bench/results_row_keys.json``; the reading in ``docs/benchmarks_commits.md`` ("Row keys").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_scaling import build_source, corpus_texts, machine, register  # noqa: E402

DS = "2026-12-01"


def job_config(source: Path, out: Path) -> Any:
    from pipeline.config import build_config

    return build_config({
        "job": "bench_row_keys", "spark": {"master": "local[2]"},
        "source": {"format": "delta", "path": str(source), "id_column": "doc_id"},
        "model": {"path": "none"}, "task": {"kind": "bench_hash_score"},
        "sink": {"path": str(out), "mode": "append", "partition_by": ["ds"], "writer": "deltalake"},
        "run": {"progress": False, "sample_rows": 0, "ds": DS, "run_id": f"bench-{time.time_ns()}",
                "runs_path": str(out.parent / "runs")},
    })


def prefill(spark: Any, work: Path, source: Path, existing: int) -> Path:
    """An output table holding ``existing`` rows of day ``DS`` (ids the new source does not have), with the
    schema the task writes: one real run of a 1-row source gives the schema, then rows are appended."""
    from deltalake import DeltaTable, write_deltalake

    from pipeline.runner import run_job

    target = work / f"target-{existing}"
    if Path(target, "_delta_log").is_dir():
        return target
    seed = work / "seed-source"
    if not Path(seed, "_delta_log").is_dir():
        write_deltalake(str(seed), pa.table({"doc_id": ["seed"], "text": ["a seed row"]}))
    run_job(job_config(seed, target), spark=spark, out=open(os.devnull, "w"))
    table = DeltaTable(str(target))
    schema = pa.schema(table.schema().to_arrow())
    template = table.to_pyarrow_table().cast(schema).to_pylist()[0]
    step = 1_000_000
    for start in range(0, existing, step):
        n = min(step, existing - start)
        columns = {}
        for field in schema:
            if field.name == "doc_id":
                columns[field.name] = pa.array([f"e{i:010d}" for i in range(start, start + n)], field.type)
            else:
                columns[field.name] = pa.repeat(pa.scalar(template[field.name], field.type), n)
        write_deltalake(str(target), pa.table(columns, schema=schema), mode="append", partition_by=["ds"])
    return target


def one_run(spark: Any, source: Path, target: Path, work: Path, *, keyed: bool) -> dict[str, Any]:
    import pipeline.runner as runner

    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(target, out)
    saved = runner._append_key_filter, runner._commit_keys
    if not keyed:
        runner._append_key_filter = lambda spark, inputs, config, ds, notes: (inputs, None)
        runner._commit_keys = lambda config, sink: ()
    try:
        load = os.getloadavg()[0]
        started = time.perf_counter()
        summary = runner.run_job(job_config(source, out), spark=spark, out=open(os.devnull, "w"))
        wall = time.perf_counter() - started
    finally:
        runner._append_key_filter, runner._commit_keys = saved
    assert summary.complete and summary.rows_out == summary.rows_in, summary
    stages = {k: round(v, 2) for k, v in summary.stage_seconds.items()}
    return {"keyed": keyed, "wall_s": round(wall, 2), "rows": summary.rows_in, "stages": stages, "load": load}


def overlap_check(work: Path, rows: int) -> dict[str, Any]:
    """The deltalake writer's commit-time check when an overlapping run committed ``rows`` keys first."""
    from deltalake import DeltaTable, write_deltalake

    from pipeline.io.delta import keys as delta_keys
    from pipeline.io.delta.files import PartFile

    root = work / "overlap"
    shutil.rmtree(root, ignore_errors=True)
    ids = pa.array([f"d{i:010d}" for i in range(rows)])
    write_deltalake(str(root), pa.table({"doc_id": ids[:1], "score": pa.array([0.0]), "ds": [DS]}), partition_by=["ds"])
    base = DeltaTable(str(root)).version()
    write_deltalake(str(root), pa.table({"doc_id": ids, "score": pa.array([1.0] * rows), "ds": [DS] * rows}),
                    mode="append", partition_by=["ds"])
    staged, id_list = [], ids.to_pylist()
    for part in range(4):  # this run's files, as four tasks would stage them
        f = PartFile(str(root), ["ds"], (DS,), "stagedwrite", f"{part:05d}-a0")
        mine = id_list[part::4]
        f.write(pa.table({"doc_id": pa.array(mine), "score": pa.array([2.0] * len(mine))}))
        staged.append(f.close())

    def rewrite(values, table):
        f = PartFile(str(root), ["ds"], (values["ds"],), "stagedwrite", "keyed")
        f.write(table)
        return f.close()

    started = time.perf_counter()
    table = DeltaTable(str(root))
    added = delta_keys.files_added_since(table, str(root), base)
    taken = delta_keys.taken_keys(str(root), added, ["doc_id", "ds"], ["ds"])
    kept, dropped = delta_keys.drop_taken(str(root), staged, taken, ["doc_id", "ds"], ["ds"], rewrite=rewrite)
    seconds = time.perf_counter() - started
    assert dropped == rows and not kept, (dropped, kept)
    return {"rows": rows, "seconds": round(seconds, 3)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows the append scores")
    parser.add_argument("--existing", default="100000,10000000", help="rows already in the day (comma list)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--overlap", type=int, default=100_000, help="keys for the commit-time check (0: skip)")
    parser.add_argument("--work", default=None)
    parser.add_argument("--out", default="bench/results_row_keys.json")
    args = parser.parse_args(argv)

    from pipeline.config import SparkConfig
    from pipeline.spark.session import get_session

    register()
    work = Path(args.work or tempfile.mkdtemp(prefix="sbi-row-keys-"))
    work.mkdir(parents=True, exist_ok=True)
    source = work / f"source-{args.rows}"
    if not Path(source, "_delta_log").is_dir():
        build_source(source, args.rows, files=2, corpus=corpus_texts("warehouse/demo/documents"))
    spark = get_session(SparkConfig(master="local[2]", app_name="bench_row_keys"))
    results: dict[str, Any] = {"machine": machine(), "rows": args.rows, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                               "command": "bench/bench_row_keys.py " + " ".join(argv or sys.argv[1:]), "sizes": []}
    for existing in [int(n) for n in args.existing.split(",") if n]:
        target = prefill(spark, work, source, existing)
        runs = []
        for repeat in range(args.repeats):
            for keyed in (False, True):
                run = one_run(spark, source, target, work, keyed=keyed)
                runs.append(run)
                print(json.dumps({"existing": existing, "repeat": repeat, **run}), flush=True)
        if not runs:  # --repeats 0: the tables are built (in --work), nothing is measured
            continue
        blind = [r for r in runs if not r["keyed"]]
        keyed_runs = [r for r in runs if r["keyed"]]
        extra = [k["wall_s"] - b["wall_s"] for b, k in zip(blind, keyed_runs)]
        size = {
            "existing": existing, "runs": runs,
            "blind_wall_s": _spread([r["wall_s"] for r in blind]),
            "keyed_wall_s": _spread([r["wall_s"] for r in keyed_runs]),
            "blind_planning_s": _spread([r["stages"].get("planning", 0) for r in blind]),
            "keyed_planning_s": _spread([r["stages"].get("planning", 0) for r in keyed_runs]),
            "blind_commit_s": _spread([r["stages"].get("commit", 0) for r in blind]),
            "keyed_commit_s": _spread([r["stages"].get("commit", 0) for r in keyed_runs]),
            "extra_s": _spread(extra),
            "extra_share_of_blind_wall": round(statistics.median(extra) / statistics.median(
                [r["wall_s"] for r in blind]), 3),
        }
        results["sizes"].append(size)
        print(json.dumps({k: v for k, v in size.items() if k != "runs"}), flush=True)
    if args.overlap:
        results["overlap_check"] = [overlap_check(work, args.overlap) for _ in range(3)]
        print(json.dumps({"overlap_check": results["overlap_check"]}), flush=True)
    spark.stop()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ")
    Path(args.out).write_text(json.dumps(results, indent=1))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
