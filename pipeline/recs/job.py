"""The nightly ``refresh_recommendations`` job: users + seen items -> top-K per user -> Delta.

Steps (driver, except 3):

1. resolve the model revision (``LATEST`` of a model root, or a folder) and
   check it was trained with the configured user features, before any Spark work;
2. read ``users`` and ``interactions``; build one row per user with the
   user's seen item ids, oldest first (``collect_list`` of (timestamp, item)
   structs, sorted);
3. executors: :class:`pipeline.recs.task.RecommendTask` through the shared
   ``mapInArrow`` glue (:mod:`pipeline.spark.udf`): model and item tower
   loaded once per Python worker, users scored in fixed-size batches;
4. explode the per-user lists into ``user_id, item_id, score, rank`` rows
   with ``model_revision, run_id, ds``; write the dated table with partition
   overwrite (a rerun of the same ds replaces that day), one Delta commit;
5. copy the partition just committed (read back, not recomputed) into
   ``recommendations_latest`` (overwrite), unless a newer ds is already there.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.recs.config import RefreshJobConfig
from pipeline.spark.udf import InferencePlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OUTPUT_COLUMNS", "RecommendPlan", "RefreshError", "RefreshSummary", "main", "refresh_recommendations", "run_refresh",
           "user_rows"]

OUTPUT_COLUMNS = ("user_id", "item_id", "score", "rank", "model_revision", "run_id", "ds")


class RefreshError(RuntimeError):
    """The refresh cannot run or did not write what it should; the message says what to change."""


@dataclass(frozen=True)
class RecommendPlan(InferencePlan):
    """The shared executor plan, building a :class:`RecommendTask` (not registered in ``pipeline.tasks``)."""

    def build_task(self) -> Any:
        from pipeline.recs.task import RecommendTask

        return RecommendTask(self.task, model=self.model, batching=self.batching)


@dataclass
class RefreshSummary:
    """What one refresh did; printed at the end and returned."""

    job: str
    run_id: str
    ds: str
    model_revision: str
    model_path: str
    users_in: int
    rows_written: int
    status: dict[str, int]
    unknown_users: int
    items_unknown_to_model: int | None
    seconds: float
    output: str
    delta_version: int | None
    latest: str | None
    latest_updated: bool
    counts: dict[str, Any] = field(default_factory=dict)
    # the model's held-out evaluation from training (metrics.json): {"model": {...}, "popularity": {...}}
    quality: dict[str, Any] = field(default_factory=dict)

    @property
    def users_per_s(self) -> float:
        return self.users_in / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "users_per_s": round(self.users_per_s, 1)}, indent=2, default=str)

    def render(self) -> str:
        status = ", ".join(f"{k}={v}" for k, v in sorted(self.status.items())) or "-"
        latest = (f"{self.latest} ({'updated' if self.latest_updated else 'kept: it holds a newer ds'})"
                  if self.latest else "-")
        unknown_items = "-" if self.items_unknown_to_model is None else f"{self.items_unknown_to_model:,}"
        return "\n".join([
            f"== {self.job} run {self.run_id} (ds {self.ds}) ==",
            f"users in / rec rows out : {self.users_in:,} / {self.rows_written:,}",
            f"user status             : {status} (unknown users scored from features: {self.unknown_users:,})",
            f"time                    : {self.seconds:,.1f} s ({self.users_per_s:,.1f} users/s)",
            f"model                   : two_tower @ {self.model_revision} ({self.model_path})",
            f"model quality (held out): {_quality_line(self.quality)}",
            f"catalog items unknown   : {unknown_items} (retrain to recommend them)",
            f"output                  : {self.output} (Delta version {self.delta_version})",
            f"latest                  : {latest}",
        ])


def _quality_line(quality: dict[str, Any]) -> str:
    model, pop = quality.get("model") or {}, quality.get("popularity") or {}
    if not model:
        return "not recorded (train with jobs/train_recommender.py to record it)"
    line = f"HitRate@10 {model.get('hit_rate@10', float('nan')):.3f}, Recall@10 {model.get('recall@10', float('nan')):.3f}"
    if pop:
        line += (f" vs popularity {pop.get('hit_rate@10', float('nan')):.3f} / "
                 f"{pop.get('recall@10', float('nan')):.3f}")
    return line + f" ({model.get('users', '?')} users)"


def _training_quality(folder: Path) -> dict[str, Any]:
    """The held-out metrics saved beside the model at training time (empty if none)."""
    try:
        return json.loads((folder / "metrics.json").read_text()).get("holdout") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def _resolve_model(config: RefreshJobConfig) -> tuple[Path, str, list[str], list[int]]:
    """``(folder, revision, feature names, item ids)`` of the model, checked on the driver (no torch)."""
    from pipeline.recs.registry import resolve_two_tower_path, two_tower_revision

    try:
        folder = resolve_two_tower_path(config.model.path)
    except FileNotFoundError as exc:
        raise RefreshError(str(exc)) from None
    model_config = json.loads((folder / "config.json").read_text())
    features = [f["name"] for f in model_config["user_features"]]
    if sorted(features) != sorted(config.task.feature_columns):
        raise RefreshError(f"model {folder} was trained with user features {features}; "
                           f"set task.feature_columns to {features} (it is {config.task.feature_columns})")
    item_ids = json.loads((folder / "id_maps.json").read_text())["item_ids"]
    return folder, two_tower_revision(folder), features, item_ids


def user_rows(users: "DataFrame", interactions: "DataFrame", *, seen_column: str,
              feature_columns: list[str]) -> "DataFrame":
    """One row per user: ``id`` (= user_id, for the glue), ``user_id``, seen item ids oldest first, features."""
    from pyspark.sql import functions as F

    missing = [c for c in ["user_id", *feature_columns] if c not in users.columns]
    missing += [f"interactions.{c}" for c in ("user_id", "item_id", "timestamp") if c not in interactions.columns]
    if missing:
        raise RefreshError(f"missing column(s) {missing}; users has {users.columns}, "
                           f"interactions has {interactions.columns}")
    # Sorting (timestamp, item_id) structs orders by time, ties by item id: deterministic.
    seen = interactions.groupBy("user_id").agg(
        F.transform(F.sort_array(F.collect_list(F.struct("timestamp", F.col("item_id").cast("bigint").alias("item_id")))),
                    lambda s: s["item_id"]).alias(seen_column))
    base = users.select(F.col("user_id").cast("bigint").alias("user_id"), *feature_columns)
    return base.join(seen, "user_id", "left").select(
        F.col("user_id").alias("id"), "user_id", seen_column, *feature_columns)


def _explode(scored: "DataFrame", *, revision: str, run_id: str, ds: dt.date) -> "DataFrame":
    from pyspark.sql import functions as F

    ranked = scored.select(F.col("id").alias("user_id"),
                           F.posexplode(F.arrays_zip("item_ids", "scores")).alias("pos", "rec"))
    return ranked.select(
        "user_id",
        F.col("rec.item_ids").alias("item_id"),
        F.col("rec.scores").alias("score"),
        (F.col("pos") + 1).cast("int").alias("rank"),
        F.lit(revision).alias("model_revision"),
        F.lit(run_id).alias("run_id"),
        F.lit(ds).cast("date").alias("ds"),
    )


def _update_latest(spark: "SparkSession", config: RefreshJobConfig, output: str, run_id: str,
                   ds: dt.date) -> bool:
    """Overwrite the latest table with this run's committed rows, unless it already holds a newer ds."""
    from pyspark.sql import functions as F

    from pipeline.io.sinks import write_sink
    from pipeline.io.sources import read_delta

    assert config.latest is not None
    try:
        newest = read_delta(spark, config.latest).agg(F.max("ds")).first()[0]
    except Exception:  # noqa: BLE001 - no table there yet (the error type depends on the reader)
        newest = None
    if newest is not None and newest > ds:
        return False
    rows = read_delta(spark, output).where(F.col("ds") == F.lit(ds).cast("date")).where(F.col("run_id") == run_id)
    # Same writer settings as the dated table (e.g. the Delta connector on Databricks), whole-table overwrite.
    sink = config.sink.model_copy(update={"path": config.latest, "table": None, "mode": "overwrite",
                                          "partition_by": []})
    write_sink(rows.select(*OUTPUT_COLUMNS), sink, commit_metadata={"sbi.job": config.job, "sbi.run_id": run_id})
    return True


def refresh_recommendations(config: RefreshJobConfig, *, spark: "SparkSession | None" = None,
                            out: TextIO = sys.stdout) -> RefreshSummary:
    """Run the refresh end to end; returns (and prints) its summary. Raises :class:`RefreshError`."""
    from pyspark.sql import functions as F

    from pipeline.io.sinks import write_sink
    from pipeline.io.sources import read_delta
    from pipeline.spark.session import get_session
    from pipeline.spark.udf import CountsParam, apply_inference

    folder, revision, _, model_items = _resolve_model(config)
    spark = spark or get_session(config.spark)
    run_id, ds = config.run.resolved_run_id(), config.run.resolved_ds()
    users = user_rows(read_delta(spark, config.tables.users), read_delta(spark, config.tables.interactions),
                      seen_column=config.task.seen_column, feature_columns=list(config.task.feature_columns))
    if users.rdd.getNumPartitions() < spark.sparkContext.defaultParallelism:
        users = users.repartition(spark.sparkContext.defaultParallelism, "id")
    unknown_items = None
    if config.tables.items:
        known = spark.createDataFrame([(int(i),) for i in model_items], "item_id bigint")
        unknown_items = read_delta(spark, config.tables.items).select("item_id").join(known, "item_id", "left_anti").count()

    model = ModelConfig(path=str(folder), name=config.model.name or "two_tower", device=config.model.device)
    task = RecommendPlan(task=config.task, model=model, batching=BatchingConfig()).build_task()
    plan = RecommendPlan(task=config.task, model=model, batching=BatchingConfig(),
                         input_columns=tuple(task.input_columns))
    acc = spark.sparkContext.accumulator({}, CountsParam())
    users_in = users.count()
    print(f"[{config.job}] run {run_id}: {users_in:,} users, top {config.task.k} with two_tower @ {revision} "
          f"-> {config.sink.path or config.sink.table} (ds {ds})", file=out, flush=True)

    started = time.perf_counter()
    recs = _explode(apply_inference(users, plan, acc), revision=revision, run_id=run_id, ds=ds)
    result = write_sink(recs, config.sink, partition_values={"ds": ds},
                        commit_metadata={"sbi.job": config.job, "sbi.run_id": run_id, "sbi.model_revision": revision})
    seconds = time.perf_counter() - started

    written = read_delta(spark, result.output).where(F.col("ds") == F.lit(ds).cast("date"))
    rows_written = written.where(F.col("run_id") == run_id).count()
    counts = acc.value
    expected = int(counts.get("recommendations", -1))
    users_scored = sum(int(v) for v in counts.get("status", {}).values())
    if users_scored != users_in:
        raise RefreshError(f"{users_in} users in but the executors reported {users_scored}; rerun the job")
    if rows_written != expected:
        raise RefreshError(f"wrote {rows_written} recommendation rows but the executors produced {expected}; "
                           f"the Delta table {result.output} ds={ds} needs a rerun")
    latest_updated = _update_latest(spark, config, result.output, run_id, ds) if config.latest else False
    summary = RefreshSummary(
        job=config.job, run_id=run_id, ds=ds.isoformat(), model_revision=revision, model_path=str(folder),
        users_in=users_in, rows_written=rows_written,
        status={k: int(v) for k, v in counts.get("status", {}).items()},
        unknown_users=int(counts.get("unknown_users", 0)), items_unknown_to_model=unknown_items,
        seconds=seconds, output=result.output, delta_version=result.version, latest=config.latest,
        latest_updated=latest_updated, counts=counts, quality=_training_quality(folder),
    )
    print(summary.render(), file=out, flush=True)
    if config.run.summary_path:
        Path(config.run.summary_path).parent.mkdir(parents=True, exist_ok=True)
        Path(config.run.summary_path).write_text(summary.to_json())
    return summary


def run_refresh(
    conf: str | Path,
    *,
    ds: str | None = None,
    run_id: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    overlays: list[str] | tuple[str, ...] = (),
    spark: "SparkSession | None" = None,
) -> RefreshSummary:
    """Load the refresh config (``--set`` style overrides, ``ds``/``run_id`` shortcuts) and run it.

    The one call the notebook and the spark-submit entry make::

        run_refresh("conf/refresh_recommendations.yaml", ds="2026-11-30", overrides=["task.k=20"])
    """
    from pipeline.recs.config import load_refresh_config

    extra = [*overrides, *([f"run.ds={ds}"] if ds else []), *([f"run.run_id={run_id}"] if run_id else [])]
    return refresh_recommendations(load_refresh_config(conf, overrides=extra, overlays=overlays), spark=spark)


def main(argv: list[str], *, default_config: str = "conf/refresh_recommendations.yaml") -> int:
    """Command line of ``jobs/refresh_recommendations.py``: ``[--conf YAML] [--overlay YAML] [--set k=v] [--ds D]``."""
    import argparse

    from pipeline.config import ConfigError
    from pipeline.io.sinks import SinkError
    from pipeline.io.sources import SourceError

    parser = argparse.ArgumentParser(prog="refresh_recommendations", description=__doc__.splitlines()[0])
    parser.add_argument("--conf", default=default_config, metavar="YAML")
    parser.add_argument("--overlay", action="append", default=[], metavar="YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ds", help="run date YYYY-MM-DD (same as --set run.ds=...)")
    parser.add_argument("--run-id", help="run id (same as --set run.run_id=...)")
    args = parser.parse_args(argv)
    try:
        run_refresh(args.conf, ds=args.ds, run_id=args.run_id, overrides=args.overrides, overlays=args.overlay)
    except (ConfigError, RefreshError, SinkError, SourceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
