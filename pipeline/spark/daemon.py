"""PySpark's worker daemon, with the modules every inference worker needs imported once, before it forks.

Spark starts one daemon per worker module and forks a Python worker from it for each task slot, and
again for every worker that dies (a killed or poisoned worker, an out-of-memory split). A fresh worker
imported torch and transformers itself on its first task: about 2.5 CPU-s each here. Forked from this
daemon it finds them imported (copy-on-write memory, nothing initialised: no CUDA context, no thread
pool), and starts on its rows at once.

Before forking, the daemon freezes what the imports made (``gc.freeze``): PySpark's worker runs a full
``gc.collect()`` after every task, and with torch and transformers imported that walked some 276,000 objects,
0.23-0.31 s a task, and copied every page holding one into the worker (copy-on-write); frozen, the collection
skips them (0.0 s). In the suite's job tests it was two thirds of the inference workers' CPU.

Sessions the library builds on a local master use it (``spark.python.daemon.module``; ``spark.conf``
overrides). Only the daemon of ``pyspark.worker`` (UDFs, ``mapInArrow``) imports them: the daemons of the
Python data source workers (planning, writing, committing) do not need torch. Elsewhere (spark-submit,
a Connect server, a cluster) opt in with ``--conf spark.python.daemon.module=pipeline.spark.daemon``
only where ``pipeline`` is installed on the executors (a package, not ``--py-files``: the daemon starts
before any file a job ships reaches the worker's path, and a daemon that cannot start fails every task).
"""

from __future__ import annotations

import gc
import importlib
import sys

__all__ = ["PRELOAD", "preload"]

# what the inference worker imports on its first task (pipeline.spark.udf: the tasks, torch, transformers)
PRELOAD = ("pyarrow", "pandas", "torch", "transformers", "pipeline.spark.udf")


def preload(worker_module: str) -> list[str]:
    """Import :data:`PRELOAD` when ``worker_module`` is PySpark's UDF worker; the modules imported.

    A module that fails to import is left to the worker, which reports it on its first task as before.

    >>> preload("pyspark.sql.worker.commit_data_source_write")
    []
    """
    if worker_module != "pyspark.worker":
        return []
    done = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - e.g. no torch in a recs-only environment: the worker says so itself
            continue
        done.append(name)
    return done


if __name__ == "__main__":
    from pyspark.daemon import manager

    preload(sys.argv[1] if len(sys.argv) > 1 else "pyspark.worker")
    gc.collect()
    gc.freeze()  # the workers' per-task gc.collect() skips what is here now (the module docstring)
    manager()
