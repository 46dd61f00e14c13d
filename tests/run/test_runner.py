"""End to end: a source Delta table -> executors -> an output Delta table, read back and checked."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyspark
import pytest
from deltalake import DeltaTable

from pipeline.io.delta.history import commit_metadata
from pipeline.io.sources import SourceError
from pipeline.models.loading import ModelError, model_revision
from pipeline.runner import run_job

from tests.support.data import make_documents, write_delta
from tests.support.jobs import D1, D2, job_config, read_scores

REPO = Path(__file__).resolve().parents[2]
def test_end_to_end_append_then_partition_overwrite(any_spark, tmp_path, tiny_embed_model, writer):
    """Classic and Spark Connect sessions alike: counts come from the data, not accumulators."""
    spark = any_spark
    write_delta(tmp_path / "docs", make_documents(200))
    out = io.StringIO()
    summary = run_job(job_config(tmp_path, tiny_embed_model, run={"run_id": "run-1"}), spark=spark, out=out)
    assert summary.rows_in == summary.rows_out == 200 and summary.complete
    assert summary.status == {"ok": 198, "skipped_null": 1, "skipped_empty": 1}
    assert summary.delta_version == 0 and summary.writer == writer
    assert "every input row written once" in out.getvalue()
    assert summary.infer_seconds > 0 and "worker time             : model load" in out.getvalue()
    # 200 rows on 2 cores: one task per core, every row counted once, per worker too
    assert summary.tasks == 2 and sum(summary.rows_per_worker.values()) == 200
    assert sum(summary.batch_sizes[k] * int(k) for k in summary.batch_sizes) == 198  # null/blank: no batch
    assert "rows per worker" in out.getvalue()
    # where the driver's time went, stage by stage, in the order they ran (the session was given: ~0 s)
    stages = list(summary.stage_seconds)
    assert stages[:2] == ["runs table", "model check"] and "driver stages           : " in out.getvalue()
    assert [s for s in stages if s in ("planning", "inference and check", "commit", "read-back")] == [
        "planning", "inference and check", "commit", "read-back"]
    assert summary.stage_seconds["inference and check"] > 0 and all(v >= 0 for v in summary.stage_seconds.values())

    table = read_scores(tmp_path)
    assert summary.tokens == sum(table["n_tokens"].to_pylist()) > 0  # the counts match the rows written
    assert "_sbi_metrics" not in table.schema.names
    ids = table["doc_id"].to_pylist()
    assert len(ids) == 200 and len(set(ids)) == 200
    assert set(ids) == {f"d{i:05d}" for i in range(200)}
    assert table.schema.names == [
        "doc_id", "content_hash", "source", "embedding", "label", "score", "scores", "n_tokens", "truncated", "status", "error",
        "model_name", "model_revision", "task_fingerprint", "run_id", "scored_at", "ds",
    ]
    assert set(table["model_name"].to_pylist()) == {"tiny-bert"}
    assert set(table["model_revision"].to_pylist()) == {model_revision(tiny_embed_model)}
    assert set(table["run_id"].to_pylist()) == {"run-1"}
    assert table["scored_at"].null_count == 0
    assert set(table["ds"].to_pylist()) == {dt.date(2026, 11, 28)}
    row = {r["doc_id"]: r for r in table.to_pylist()}
    assert row["d00001"]["status"] == "skipped_null" and row["d00001"]["embedding"] is None
    assert len(row["d00000"]["embedding"]) == 32 and row["d00000"]["label"] in ("pos", "neg")

    # the same day again, as a partition overwrite: replaces, never duplicates
    summary = run_job(job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                                 run={"run_id": "run-2"}), spark=spark, out=io.StringIO())
    assert summary.delta_version == 1
    table = read_scores(tmp_path)
    assert table.num_rows == 200 and set(table["run_id"].to_pylist()) == {"run-2"}

    # another day appends its own partition and leaves the first alone
    run_job(job_config(tmp_path, tiny_embed_model, sink={"mode": "overwrite_partition"},
                       run={"run_id": "run-3", "ds": D2}), spark=spark, out=io.StringIO())
    table = read_scores(tmp_path)
    assert table.num_rows == 400
    per_day = pc.value_counts(table["ds"]).to_pylist()
    assert sorted((d["values"].isoformat(), d["counts"]) for d in per_day) == [(D1, 200), (D2, 200)]
    history = sorted(DeltaTable(str(tmp_path / "scores")).history(), key=lambda h: h["version"])
    assert [h["version"] for h in history] == [0, 1, 2]
    assert [commit_metadata(h).get("sbi.run_id") for h in history] == ["run-1", "run-2", "run-3"]


def test_model_loads_once_per_python_worker(spark, tmp_path, tiny_embed_model):
    # a fresh copy is a fresh cache key, so earlier tests' cached models don't count
    model = tmp_path / "fresh-model"
    shutil.copytree(tiny_embed_model, model)
    write_delta(tmp_path / "docs", make_documents(48))  # 4 rows a task: the claim is about tasks, not rows
    config = job_config(tmp_path, model, source={"repartition": 12})
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete
    loads = summary.model_loads
    assert loads, "no worker reported"
    assert all(n == 1 for n in loads.values()), loads
    # 12 tasks on local[2]: far fewer workers (and loads) than tasks
    assert sum(loads.values()) <= 4 < 12


def test_missing_model_fails_before_any_work(spark, tmp_path):
    write_delta(tmp_path / "docs", make_documents(5))
    with pytest.raises(ModelError, match="does not exist"):
        run_job(job_config(tmp_path, tmp_path / "no-model"), spark=spark, out=io.StringIO())
    assert not (tmp_path / "scores").exists()


def test_missing_text_column_fails_before_any_work(spark, tmp_path, tiny_embed_model):
    write_delta(tmp_path / "docs", make_documents(5))
    with pytest.raises(SourceError, match=r"missing column\(s\) \['body'\]"):
        run_job(job_config(tmp_path, tiny_embed_model, source={"text_column": "body"}), spark=spark)
    assert not (tmp_path / "scores").exists()


def test_classify_job(spark, tmp_path, tiny_classify_model):
    write_delta(tmp_path / "docs", make_documents(50))
    config = job_config(tmp_path, tiny_classify_model, task={"kind": "classify"},
                        run={"summary_path": str(tmp_path / "summary.json")})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete
    table = read_scores(tmp_path)
    assert set(table.filter(pc.equal(table["status"], "ok"))["label"].to_pylist()) <= {"negative", "neutral", "positive"}
    # what the run ran with, in the summary, its JSON and its printed end
    from pipeline.core.compat import runtime_versions

    assert summary.versions == runtime_versions() and summary.versions["pyspark"] == pyspark.__version__
    assert json.loads((tmp_path / "summary.json").read_text())["versions"] == runtime_versions()
    assert f"pyspark {pyspark.__version__}" in out.getvalue().split("versions")[1].splitlines()[0]


def test_cli_check_and_config_errors():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run([sys.executable, "-m", "pipeline", "check", "conf/score_documents.yaml",
                         "--set", "batching.batch_size=7", "--incremental", "--ds", "2026-11-29"],
                        cwd=REPO, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert '"batch_size": 7' in ok.stdout
    assert '"incremental": true' in ok.stdout and '"ds": "2026-11-29"' in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "pipeline", "check", "conf/score_documents.yaml",
                          "--set", "sink.mode=sometimes"], cwd=REPO, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "sink.mode" in bad.stderr and "'overwrite_partition'" in bad.stderr


@pytest.mark.slow
@pytest.mark.beside  # a spark-submit of its own: it evens the two runs of make test
def test_spark_submit_entry(tmp_path, tiny_embed_model):
    """The job as users run it on a cluster: spark-submit jobs/score_documents.py --conf ... --set ...

    Without ``--jars``, and with the library's jar cache in reach (no ``SBI_NO_JARS``): under spark-submit the
    driver's class path is already fixed, so the session must not name Delta's catalog from the cache (it
    did, and the first query failed on ``DeltaCatalog`` not found); the job takes the jar-free writer.

    On ``local[1]``: the claim is the class path, not the task count, and one Python worker loading the model
    instead of two side by side took 34 s instead of 36-39 s here (model load 3.5 s instead of 11-13.5 s summed)."""
    write_delta(tmp_path / "docs", make_documents(60))
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("SBI_NO_JARS", None)
    cmd = [
        str(spark_submit), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
        "jobs/score_documents.py", "--conf", "conf/score_documents.yaml",
        "--set", f"source.path={tmp_path / 'docs'}", "--set", f"model.path={tiny_embed_model}",
        "--set", f"sink.path={tmp_path / 'scores'}", "--set", "run.summary_path=null",
        "--set", "run.progress=false", "--ds", D2,
    ]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "rows in / out / flagged : 60 / 60 / 2" in done.stdout
    assert "deltalake writer" in done.stdout, done.stdout[-2000:]
    table = read_scores(tmp_path)
    assert table.num_rows == 60 and set(table["ds"].to_pylist()) == {dt.date(2026, 11, 29)}


def test_udf_workers_are_forked_from_the_daemon_that_imported_torch(spark):
    """The session's Python workers come from ``pipeline.spark.daemon``, which imported torch and transformers
    before forking them, and froze what they made (PySpark's gc.collect() after each task skips it); the daemons
    of the data source workers import neither."""

    def parent(rows):
        import gc
        import os

        import pandas as pd

        ppid = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[1])
        cmd = open(f"/proc/{ppid}/cmdline").read().replace("\0", " ")
        for _ in rows:
            pass
        yield pd.DataFrame({"daemon": [cmd], "pid": [os.getpid()], "frozen": [gc.get_freeze_count()]})

    found = spark.range(4, numPartitions=2).mapInPandas(parent, "daemon string, pid long, frozen long").collect()
    assert found and all("-m pipeline.spark.daemon pyspark.worker" in r["daemon"] for r in found), found
    assert all(r["frozen"] > 50_000 for r in found), found  # torch and transformers alone make ~270,000 objects
    code = ("import sys; from pipeline.spark.daemon import preload; "
            "print(preload(sys.argv[1]), 'torch' in sys.modules, 'transformers' in sys.modules)")
    runs = {m: subprocess.run([sys.executable, "-c", code, m], capture_output=True, text=True, cwd=REPO, check=True)
            .stdout.strip() for m in ("pyspark.worker", "pyspark.sql.worker.write_into_data_source")}
    assert runs["pyspark.worker"].endswith("True True") and "'torch'" in runs["pyspark.worker"], runs
    assert runs["pyspark.sql.worker.write_into_data_source"] == "[] False False", runs
