"""Benchmark the recommendation core: quality vs popularity, item-tower time, users/s and memory vs batch size.

Usage (numbers recorded in docs/benchmarks_recs.md)::

    PYTHONPATH=. python bench/bench_recs.py --warehouse warehouse/recs --out bench/results_recs.json

Sections:

1. quality: train with the default TrainConfig on each user's history minus
   the latest 2 interactions, HitRate@10 / Recall@10 vs popularity;
2. item tower: time to compute the catalog's item vectors (once per worker);
3. task: ``RecommendTask.process`` on a chunk of MovieLens users (repeated to
   ``--users``) per batch size: users/s and peak extra memory;
4. core at scale: the scoring core alone on a random catalog of
   ``--big-items`` items: users/s and peak extra memory per batch size,
   showing memory follows ``batch_size x items``.

Peak extra memory is the peak resident memory while scoring (sampled every
millisecond) minus the resident memory just before, so it is what scoring
itself added.

Each speed point runs in a fresh process (peak RSS is per process); torch
uses one thread, as one Spark task slot would.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


class _RssSampler(threading.Thread):
    """Samples this process's resident memory every millisecond; ``extra_mb`` = peak minus start.

    (``ru_maxrss`` cannot be reset, and import/load peaks hide scoring's own.)
    Torch releases the GIL in its kernels, so sampling continues during them.
    """

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.start_mb = self.peak_mb = _rss_mb()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.001):
            self.peak_mb = max(self.peak_mb, _rss_mb())

    def stop(self) -> float:
        self.done.set()
        self.join()
        self.peak_mb = max(self.peak_mb, _rss_mb())
        return round(self.peak_mb - self.start_mb, 1)


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _write_chunk(warehouse: str, n_users: int, path: str) -> None:
    """MovieLens users (repeated to ``n_users``) with their seen items, as an Arrow IPC file."""
    import pyarrow as pa

    from pipeline.recs.data import read_recs_tables
    from pipeline.recs.evaluate import seen_lists

    data = read_recs_tables(warehouse)
    users = data.users.sort_values("user_id")
    seen = [s.tolist() for s in seen_lists(data.interactions, users["user_id"].to_numpy())]
    reps = -(-n_users // len(users))
    chunk = pa.RecordBatch.from_pydict({
        "user_id": pa.array(np.tile(users["user_id"].to_numpy(), reps)[:n_users], pa.int64()),
        "seen_item_ids": pa.array((seen * reps)[:n_users], pa.list_(pa.int64())),
        "age": pa.array(np.tile(users["age"].to_numpy(), reps)[:n_users], pa.int32()),
        "gender": pa.array(np.tile(users["gender"].to_numpy(dtype=object), reps)[:n_users], pa.string()),
        "occupation": pa.array(np.tile(users["occupation"].to_numpy(dtype=object), reps)[:n_users], pa.string()),
    })
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, chunk.schema) as writer:
        writer.write_batch(chunk)


def _task_point(chunk_path: str, model_root: str, batch_size: int) -> dict[str, Any]:
    import pyarrow as pa
    import torch

    from pipeline.config import ModelConfig
    from pipeline.core.metrics import WorkerCounts
    from pipeline.tasks.recommend import RecommendTask, RecommendTaskConfig

    torch.set_num_threads(1)
    chunk = pa.ipc.open_file(pa.memory_map(chunk_path)).get_batch(0)
    n_users = chunk.num_rows
    task = RecommendTask(RecommendTaskConfig(k=10, batch_size=batch_size, interactions="unused"), model=ModelConfig(path=model_root))
    started = time.perf_counter()
    loaded = task.load(Path(model_root), "cpu")
    load_s = time.perf_counter() - started
    sampler = _RssSampler()  # from before any scoring: what scoring itself adds
    sampler.start()
    task.process(loaded, chunk.slice(0, min(batch_size, n_users)), WorkerCounts())  # warm-up
    started = time.perf_counter()
    out = task.process(loaded, chunk, WorkerCounts())
    seconds = time.perf_counter() - started
    extra_mb = sampler.stop()
    assert out.num_rows == n_users
    return {"batch_size": batch_size, "users": n_users, "seconds": round(seconds, 3),
            "users_per_s": round(n_users / seconds, 1), "load_s": round(load_s, 3),
            "peak_extra_mb": extra_mb}


def _core_point(n_items: int, batch_size: int, n_users: int, dim: int = 64) -> dict[str, Any]:
    import torch

    from pipeline.recs.scoring import recommend_batches

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    items = torch.nn.functional.normalize(torch.randn(n_items, dim, generator=gen), dim=1)
    users = torch.nn.functional.normalize(torch.randn(n_users, dim, generator=gen), dim=1)
    seen = (np.random.default_rng(0).integers(0, n_items, n_users * 50), np.arange(n_users + 1) * 50)

    def score(rows: np.ndarray) -> torch.Tensor:
        return users[torch.from_numpy(rows)] @ items.T

    sampler = _RssSampler()
    sampler.start()
    recommend_batches(batch_size, score, k=10, batch_size=batch_size, seen=seen)  # warm-up
    started = time.perf_counter()
    recommend_batches(n_users, score, k=10, batch_size=batch_size, seen=seen)
    seconds = time.perf_counter() - started
    extra_mb = sampler.stop()
    return {"items": n_items, "batch_size": batch_size, "users": n_users, "seconds": round(seconds, 3),
            "users_per_s": round(n_users / seconds, 1), "peak_extra_mb": extra_mb,
            "scores_matrix_mb": round(batch_size * n_items * 4 / 2**20, 1)}


def _child(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    """Run one speed point in a fresh interpreter so its peak RSS is its own."""
    cmd = [sys.executable, __file__, "--child", kind, json.dumps(options)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench point {kind} {options} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _quality(warehouse: str, model_root: str) -> dict[str, Any]:
    import torch

    from pipeline.recs.config import TrainConfig
    from pipeline.recs.data import read_recs_tables
    from pipeline.recs.registry import save_two_tower
    from pipeline.recs.scoring import item_matrix
    from pipeline.recs.train import evaluate_two_tower, train_two_tower

    torch.set_num_threads(1)
    data = read_recs_tables(warehouse)
    config = TrainConfig()
    result = train_two_tower(data, config, log=None)
    started = time.perf_counter()
    metrics = evaluate_two_tower(result.model, data, result.holdout, k=10)
    eval_s = time.perf_counter() - started
    _, revision = save_two_tower(result.model, model_root, metrics=metrics)
    times = []
    for _ in range(20):
        started = time.perf_counter()
        item_matrix(result.model)
        times.append(time.perf_counter() - started)
    return {"train_config": config.model_dump(), "train_seconds": round(result.seconds, 2),
            "eval_seconds": round(eval_s, 2), "revision": revision, **metrics,
            "item_tower_ms": {"median": round(1000 * float(np.median(times)), 2),
                              "items": len(result.model.spec.item_ids)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warehouse", default="warehouse/recs")
    parser.add_argument("--users", type=int, default=20_000, help="users per task chunk (MovieLens users repeated)")
    parser.add_argument("--batch-sizes", default="32,128,512,2048")
    parser.add_argument("--big-items", type=int, default=200_000)
    parser.add_argument("--big-users", type=int, default=4096)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, options = args.child[0], json.loads(args.child[1])
        print(json.dumps(_task_point(**options) if kind == "task" else _core_point(**options)))
        return 0

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model_root = str(Path(tmp) / "two_tower")
        results: dict[str, Any] = {"quality": _quality(args.warehouse, model_root)}
        print(json.dumps(results["quality"], indent=1), flush=True)
        chunk_path = str(Path(tmp) / "users.arrow")
        _write_chunk(args.warehouse, args.users, chunk_path)
        results["task"] = []
        for b in sizes:
            results["task"].append(_child("task", {"chunk_path": chunk_path, "model_root": model_root,
                                                   "batch_size": b}))
            print(results["task"][-1], flush=True)
    results["core"] = []
    for b in sizes[:3]:
        results["core"].append(_child("core", {"n_items": args.big_items, "batch_size": b,
                                               "n_users": args.big_users}))
        print(results["core"][-1], flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
