"""make demo-s3: the demo job into s3a://demo/document_scores on a local S3, through either Delta writer.

Starts moto's S3 server on 127.0.0.1 and runs jobs/score_documents.py under spark-submit: with
``--writer delta`` (the default) through the cached connector and S3A jars, with ``--writer deltalake``
jar-free through delta-rs's own object store and pyarrow (the endpoint and keys in the job's environment).
Its summary names the s3a table and the writer. Then it reads the table back with deltalake through
delta-rs's object store, and stops the server.

    python jobs/demo_s3.py [--rows N] [--writer delta|deltalake] [job options: --ds DATE, --set key=value ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from pipeline.io.local_s3 import local_s3
from pipeline.spark.jars import jars, spark_submit_args

TABLE = "s3a://demo/document_scores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000, help="rows of the demo corpus to score")
    parser.add_argument("--writer", choices=("delta", "deltalake"), default="delta",
                        help="delta: the connector on S3A (cached jars); deltalake: delta-rs, no jars")
    args, job_args = parser.parse_known_args(argv)  # the rest (--ds, --set ...) goes to the job
    connector = args.writer == "delta"
    missing = [g for g in ("delta", "s3") if connector and not jars(g)]
    if missing:
        print(f"error: the jars of {missing} are not cached; run `make jars` first", file=sys.stderr)
        return 2
    with local_s3(buckets=["demo"]) as s3:
        print(f"demo-s3: local S3 server at {s3.endpoint} (moto), bucket demo", flush=True)
        submit = Path(sys.executable).parent / "spark-submit"
        cmd = [str(submit), *(spark_submit_args(local=True) if connector else []), "--master", "local[*,4]",
               "--driver-memory", "2g", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.ui.showConsoleProgress=false", "--conf", "spark.log.level=WARN"]
        for key, value in (s3.spark_confs() if connector else {}).items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += ["jobs/score_documents.py", "--conf", "conf/score_documents.yaml", "--set", f"source.limit={args.rows}",
                "--set", f"sink.path={TABLE}", "--set", f"sink.quarantine_path={TABLE}_quarantine",
                "--set", f"sink.writer={args.writer}"]
        cmd += job_args
        # the keys reach the job through its environment (S3A's environment provider; delta-rs and pyarrow read
        # AWS_ENDPOINT_URL and the keys: the deltalake writer, and with either writer the runs table beside the
        # output, s3a://demo/document_scores_runs), never a command line
        env = {**os.environ, **s3.env(), **({} if connector else {"SBI_NO_JARS": "1"})}
        done = subprocess.run(cmd, env=env)
        if done.returncode != 0:
            return done.returncode
        from deltalake import DeltaTable

        table = DeltaTable(TABLE.replace("s3a://", "s3://"), storage_options=s3.env())
        rows = table.to_pyarrow_table(columns=["status"])
        files = s3.client().list_objects_v2(Bucket="demo", Prefix="document_scores/").get("KeyCount", 0)
        print(f"demo-s3: read back {TABLE} with deltalake (delta-rs's object store): version {table.version()}, "
              f"{rows.num_rows:,} rows, {files} objects under s3://demo/document_scores/", flush=True)
        runs = DeltaTable(f"{TABLE}_runs".replace("s3a://", "s3://"), storage_options=s3.env())
        outcomes = runs.to_pyarrow_table(columns=["outcome"])["outcome"].to_pylist()
        print(f"demo-s3: runs table {TABLE}_runs: version {runs.version()}, outcomes {outcomes}", flush=True)
        if "ok" not in outcomes:
            print("demo-s3: error: the run's `ok` row is missing from its runs table", file=sys.stderr)
            return 1
    print("demo-s3: local S3 server stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
