"""bench/task_overhead.py's baseline: the inference workers' daemon as it was before it froze its imports (the same
preload of torch, transformers and the UDF module, then PySpark's manager; no ``gc.freeze``). Started by Spark as
``python -m unfrozen_daemon`` with ``bench/`` on the workers' ``PYTHONPATH``."""

import sys

if __name__ == "__main__":
    from pyspark.daemon import manager

    from pipeline.spark.daemon import preload

    preload(sys.argv[1] if len(sys.argv) > 1 else "pyspark.worker")
    manager()
