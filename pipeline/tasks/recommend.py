"""``recommend``: top-K items per user from a two-tower model, run by the shared runner.

The nightly refresh is this task kind: ``source`` is the users table (one
row per user with the features the model was trained with), ``task.interactions``
the interactions table. On the driver, :class:`RecommendJob` builds one row per
user with the user's seen item ids (oldest first, ``collect_list`` in Spark);
the executors score users against the whole catalog through the shared
``mapInArrow`` glue (model and item tower loaded once per worker, users in
fixed-size batches, top-K on the model's device); the driver explodes the
per-user lists into ``user_id, item_id, score, rank`` rows with lineage, writes
the ``ds`` partition (a rerun replaces that day) and copies the committed rows
into ``task.latest_path`` unless it already holds a newer ``ds``.

One input row is one user; one task output row per input row, in order:
``item_ids`` (list<int64>, best first) and ``scores`` (list<float32>, cosine
similarity), plus the usual status columns, with these meanings:

- ``n_tokens``: history items that fed the user tower (at most ``max_history``);
- ``truncated`` / status ``truncated``: the history was longer than ``max_history``
  (only the latest items were used; all were still excluded);
- ``skipped_null``: ``user_id`` is null; the lists are null.

Unknown users (not in the model's id map) are still scored from their
features and history; they are counted as ``unknown_users``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Hashable, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from pipeline.config import BatchingConfig, JobConfig, ModelConfig, TaskConfig
from pipeline.config.base import READS, WRITES
from pipeline.errors import ModelError, SourceError
from pipeline.core.metrics import WorkerCounts
from pipeline.registry import register_task
from pipeline.core.rows import STATUS_FIELDS, Status
from pipeline.core.run_counts import RunCounts, TaskCounts
from pipeline.tasks._recommend_arrow import ragged_lists, seen_lists
from pipeline.tasks._recommend_profile import PREVIOUS_COLUMN, overlap_profile, profile_recommendations, with_previous
from pipeline.tasks.job import ModelInfo, TaskJob

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OUTPUT_COLUMNS", "LoadedRecommender", "RecommendCounts", "RecommendJob", "RecommendTask", "RecommendTaskConfig",
           "user_rows"]

# The rows the refresh writes (dated table and latest table alike).
OUTPUT_COLUMNS = ("user_id", "item_id", "score", "rank", "model_name", "model_revision", "run_id", "scored_at", "ds")


class RecommendTaskConfig(TaskConfig):
    """Top-K recommendation per user with a two-tower model (the nightly refresh).

    ``batch_size`` is users per scoring batch: each batch scores ``batch_size x
    n_items`` in one matrix product, so it bounds the memory of a worker
    (about ``batch_size * n_items * 4`` bytes for scores plus as much again for
    masks), never ``users x items``.
    """

    kind: Literal["recommend"] = "recommend"
    supports_incremental: ClassVar[bool] = False  # see check_job
    interactions: str = Field(
        description="Delta table of `user_id, item_id, timestamp` (the users' seen items)",
        json_schema_extra=READS)
    items: str | None = Field(
        None, description="Delta table of the catalog, only to report items the model does not know",
        json_schema_extra=READS)
    latest_path: str | None = Field(
        None, description="Delta folder overwritten with the newest run's rows (for serving)",
        json_schema_extra=WRITES)
    k: int = Field(10, gt=0, le=1000, description="items per user")
    batch_size: int = Field(256, gt=0, description="users per matrix product (bounds worker memory)")
    exclude_seen: bool = Field(True, description="never recommend an item the user interacted with")
    seen_column: str = Field(
        "seen_item_ids", description="the seen-items list column built from the interactions")
    max_history: int = Field(200, gt=0, description="latest seen items that feed the user tower")
    feature_columns: list[str] = Field(
        default_factory=lambda: ["age", "gender", "occupation"],
        description="user feature columns the model was trained with (checked at model load)")

    def check_job(self, job: Any) -> None:
        if job.sink.partition_by != ["ds"]:
            raise ValueError(f"sink.partition_by must be [ds] (one partition per run date), "
                             f"got {job.sink.partition_by}")
        if job.sink.table and self.latest_path:
            raise ValueError("task.latest_path is a folder; with sink.table (a catalog) leave it unset")
        if job.run.incremental:
            raise ValueError("run.incremental does not apply (every user is rescored against "
                             "tonight's catalog); leave it false")


@dataclass(frozen=True)
class LoadedRecommender:
    """What a worker keeps per model: the module, the catalog's item vectors (computed once), the revision."""

    model: Any
    items: Any
    revision: str
    device: str


class RecommendTask:
    """Scores Arrow chunks of users against the whole catalog; see the module docstring."""

    kind: ClassVar[str] = "recommend"
    # each user's list of the night before, when the run profiles its output (pipeline.tasks._recommend_profile)
    optional_input_columns: ClassVar[tuple[str, ...]] = (PREVIOUS_COLUMN,)
    # shown, never gated: a nightly retrain rescales the cosine scores (two normal retrains of the synthetic
    # refresh: score PSI up to 0.8); what the lists hold (items, overlap with the night before) is what moves
    ungated_measures: ClassVar[frozenset[str]] = frozenset({"score", "top_score"})

    def __init__(self, config: RecommendTaskConfig, *, model: ModelConfig,
                 batching: BatchingConfig | None = None) -> None:
        # batching is accepted for the common build_task signature; users per
        # batch come from config.batch_size (rows are not token sequences).
        self.config = config
        self.model = model

    needs_extras: ClassVar[tuple[str, ...]] = ("transformers",)  # the two-tower model runs on torch

    def resolve_model_dir(self, spec: str) -> Path:
        """A revision folder: ``spec`` itself, or the one ``spec/LATEST`` names (the driver passes a revision)."""
        from pipeline.recs.registry import resolve_two_tower_path

        return resolve_two_tower_path(spec)

    @property
    def input_columns(self) -> tuple[str, ...]:
        """Columns every chunk must carry: the user id, the seen list and the feature columns."""
        return ("user_id", self.config.seen_column, *self.config.feature_columns)

    def output_schema(self) -> pa.Schema:
        return pa.schema([
            pa.field("item_ids", pa.list_(pa.int64())),
            pa.field("scores", pa.list_(pa.float32())),
            *STATUS_FIELDS,
        ])

    def cache_key(self) -> Hashable:
        # The item matrix depends only on the model, not on k or batch size.
        return (self.kind, self.model.path, self.model.device)

    def load(self, model_dir: Path, device: str) -> LoadedRecommender:
        """Load the model folder (or model root with LATEST) and compute the item tower once."""
        from pipeline.recs.registry import load_two_tower
        from pipeline.recs.scoring import item_matrix

        model, revision = load_two_tower(model_dir, device=device)
        trained = [f.name for f in model.spec.user_features]
        if sorted(trained) != sorted(self.config.feature_columns):
            raise ValueError(
                f"model {model_dir} was trained with user features {trained} but task.feature_columns is "
                f"{list(self.config.feature_columns)}; set task.feature_columns to {trained}"
            )
        return LoadedRecommender(model, item_matrix(model), revision, device)

    def process(self, loaded: LoadedRecommender, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        from pipeline.recs.model import encode_users
        from pipeline.recs.scoring import recommend_users

        missing = [c for c in self.input_columns if c not in chunk.schema.names]
        if missing:
            raise KeyError(f"recommend task: input column(s) {missing} missing from the chunk (it has "
                           f"{chunk.schema.names}); the user rows need {list(self.input_columns)}")
        n = chunk.num_rows
        user_col = chunk.column(chunk.schema.get_field_index("user_id"))
        valid = ~np.asarray(user_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        rows = np.flatnonzero(valid)
        seen = seen_lists(chunk.column(chunk.schema.get_field_index(self.config.seen_column)), rows)
        spec = loaded.model.spec
        user_ids = pc.cast(user_col, pa.int64()).to_numpy(zero_copy_only=False)[rows].astype(np.int64)
        features = {c: chunk.column(chunk.schema.get_field_index(c)).to_numpy(zero_copy_only=False)[rows]
                    for c in self.config.feature_columns}
        inputs = encode_users(spec, user_ids, features, seen, max_history=self.config.max_history)

        def on_batch(real: int, padded: int) -> None:
            # Rows play the part of tokens: padding efficiency = real users / padded users.
            counts.add_batch(rows=real, tokens=real, padded_tokens=padded)

        positions, scores = recommend_users(loaded.model, loaded.items, inputs, k=self.config.k,
                                            batch_size=self.config.batch_size,
                                            exclude_seen=self.config.exclude_seen, on_batch=on_batch)
        item_ids = np.where(positions >= 0, spec.item_ids.ids[np.maximum(positions, 0)], -1)

        n_history = np.zeros(n, dtype=np.int32)
        n_history[rows] = np.diff(inputs.history_offsets)
        truncated = np.zeros(n, dtype=bool)
        truncated[rows] = inputs.truncated
        status = np.where(valid, np.where(truncated, Status.TRUNCATED, Status.OK), Status.SKIPPED_NULL).astype(object)

        counts.add("rows", n)
        counts.add("chunks")
        counts.add("unknown_users", int((inputs.user_idx == 0).sum()))
        counts.add("items_scored", int(rows.size) * len(spec.item_ids))
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        keep = positions >= 0
        counts.add("recommendations", int(keep.sum()))
        if PREVIOUS_COLUMN in chunk.schema.names:  # the overlap with last night's lists, sketched as they are scored
            previous = chunk.column(chunk.schema.get_field_index(PREVIOUS_COLUMN)).take(pa.array(rows))
            counts.merge({"profile": overlap_profile([ids[k] for ids, k in zip(item_ids, keep)], previous)})
        columns = [
            ragged_lists(item_ids, keep, rows, n, pa.int64()),
            ragged_lists(scores, keep, rows, n, pa.float32()),
            pa.array(n_history, pa.int32()),
            pa.array(truncated, pa.bool_()),
            pa.array(status.tolist(), pa.string()),
            pa.array([None] * n, pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Statuses, history lengths, items recommended, scores, full lists (:mod:`pipeline.tasks._recommend_profile`)."""
        profile_recommendations(out, profile, k=self.config.k)


@dataclass(frozen=True)
class RecommendCounts(TaskCounts):
    """What a ``recommend`` run's workers count besides every kind's counters."""

    recommendations: int = 0  # the top-k rows produced, every one of which must be written
    unknown_users: int = 0  # users not in the model's id map, scored from their features
    items_scored: int = 0  # (user, item) scores computed


class RecommendJob(TaskJob):
    """The refresh's driver side: the model revision, user rows, exploded output, the latest table."""

    counters = RecommendCounts
    not_for_dataframes = ("it reads a users table and an interactions table itself, writes one row per (user, "
                          "recommended item) and refreshes a latest table; run it with run_job "
                          "(conf/refresh_recommendations.yaml)")

    def model_info(self, config: JobConfig, task: Any) -> ModelInfo:
        """The revision folder (``LATEST`` of a model root, or a folder), checked against the feature columns.

        The executors load this folder, not the root: a new ``LATEST`` written
        during the run cannot mix two revisions in one night's table.
        """
        from pipeline.recs.registry import resolve_two_tower_path, two_tower_revision

        try:
            folder = resolve_two_tower_path(config.model.path)
        except FileNotFoundError as exc:
            raise ModelError(str(exc)) from None
        trained = [f["name"] for f in json.loads((folder / "config.json").read_text())["user_features"]]
        wanted = list(config.task.feature_columns)
        if sorted(trained) != sorted(wanted):
            raise ModelError(f"model {folder} was trained with user features {trained}; "
                             f"set task.feature_columns to {trained} (it is {wanted})")
        return ModelInfo(str(folder), config.model.name or "two_tower", two_tower_revision(folder))

    def read_inputs(self, spark: "SparkSession", config: JobConfig, task: Any) -> "DataFrame":
        from pyspark.sql import functions as F

        from pipeline.io.sources import read_delta, read_source

        cfg: RecommendTaskConfig = config.task
        users = read_source(spark, config.source)
        rows = user_rows(users, read_delta(spark, cfg.interactions), id_column=config.source.id_column,
                         seen_column=cfg.seen_column, feature_columns=list(cfg.feature_columns))
        missing = [c for c in config.source.keep_columns if c not in users.columns]
        if missing:
            raise SourceError(f"source.keep_columns {missing} are not in the users table ({users.columns})")
        kept = users.select(F.col(config.source.id_column).cast("bigint").alias("id"), *config.source.keep_columns)
        rows = rows.join(kept, "id", "left") if config.source.keep_columns else rows
        if not config.run.quality.enabled:
            return rows
        return with_previous(rows, spark, path=config.sink.path, table=config.sink.table, ds=config.run.resolved_ds())

    def shape_output(self, scored: "DataFrame", config: JobConfig) -> "DataFrame":
        """One row per (user, recommended item): ``OUTPUT_COLUMNS``, rank 1 = best."""
        from pyspark.sql import functions as F

        user = config.source.id_column
        ranked = scored.select(
            F.col(user).cast("bigint").alias("user_id"), "model_name", "model_revision", "run_id", "scored_at", "ds",
            F.posexplode(F.arrays_zip("item_ids", "scores")).alias("pos", "rec"))
        return ranked.select(
            "user_id", F.col("rec.item_ids").alias("item_id"), F.col("rec.scores").alias("score"),
            (F.col("pos") + 1).cast("int").alias("rank"), *OUTPUT_COLUMNS[4:])

    def output_rows_per_input(self, config: JobConfig) -> int:
        return config.task.k  # a user's top k

    def check_complete(self, *, rows_in: int, rows_out: int, rows_quarantined: int,
                       counts: RunCounts) -> str | None:
        """Every user scored once, and every recommendation the executors produced written once."""
        users = sum(int(v) for v in counts.status.values())
        if users != rows_in:
            return f"{rows_in} users in but the executors reported {users}; rerun the job"
        expected = int(counts.task.recommendations)  # type: ignore[attr-defined]
        if rows_out != expected:
            return f"wrote {rows_out} recommendation rows but the executors produced {expected}; rerun this ds"
        return None

    def after_commit(self, spark: "SparkSession", config: JobConfig, *, output: str, run_id: str,
                     ds: Any) -> dict[str, str]:
        """Overwrite ``task.latest_path`` with this run's committed rows, unless it holds a newer ds."""
        latest = config.task.latest_path
        if not latest:
            return {}
        updated = _update_latest(spark, config, output, run_id, ds)
        return {"latest": f"{latest} ({'updated' if updated else 'kept: it holds a newer ds'})"}

    def summary_lines(self, spark: "SparkSession", config: JobConfig, counts: RunCounts,
                      model: ModelInfo) -> dict[str, str]:
        from pyspark.sql import functions as F

        from pipeline.io.sources import read_delta
        from pipeline.recs.registry import resolve_two_tower_path

        folder = resolve_two_tower_path(model.path)
        recs: RecommendCounts = counts.task  # type: ignore[assignment]
        lines = {
            "recommendations": f"{int(recs.recommendations):,} rows, top {config.task.k} per user "
                               f"(unknown users scored from features: {int(recs.unknown_users):,})",
            "model quality (held out)": _quality_line(_training_quality(folder)),
        }
        if config.task.items:
            known = spark.createDataFrame(
                [(int(i),) for i in json.loads((folder / "id_maps.json").read_text())["item_ids"]], "item_id bigint")
            items = read_delta(spark, config.task.items).select(F.col("item_id").cast("bigint"))
            unknown = items.join(known, "item_id", "left_anti").count()
            lines["catalog items unknown"] = f"{unknown:,} (retrain to recommend them)"
        return lines


def user_rows(users: "DataFrame", interactions: "DataFrame", *, id_column: str, seen_column: str,
              feature_columns: list[str]) -> "DataFrame":
    """One row per user: ``id`` (the user id, for the glue), ``user_id``, seen item ids oldest first, features."""
    from pyspark.sql import functions as F

    missing = [c for c in [id_column, *feature_columns] if c not in users.columns]
    missing += [f"interactions.{c}" for c in ("user_id", "item_id", "timestamp") if c not in interactions.columns]
    if missing:
        raise SourceError(f"missing column(s) {missing}; users has {users.columns}, "
                          f"interactions has {interactions.columns}")
    # Sorting (timestamp, item_id) structs orders by time, ties by item id: deterministic.
    seen = interactions.groupBy(F.col("user_id").cast("bigint").alias("user_id")).agg(
        F.transform(F.sort_array(F.collect_list(F.struct("timestamp", F.col("item_id").cast("bigint").alias("item_id")))),
                    lambda s: s["item_id"]).alias(seen_column))
    base = users.select(F.col(id_column).cast("bigint").alias("user_id"), *feature_columns)
    return base.join(seen, "user_id", "left").select(
        F.col("user_id").alias("id"), "user_id", seen_column, *feature_columns)


def _update_latest(spark: "SparkSession", config: JobConfig, output: str, run_id: str, ds: Any) -> bool:
    from pyspark.sql import functions as F

    from pipeline.io.delta.sink import write_sink
    from pipeline.io.sources import read_delta

    latest = config.task.latest_path
    try:
        newest = read_delta(spark, latest).agg(F.max("ds")).first()[0]
    except Exception:  # noqa: BLE001 - no table there yet (the error type depends on the reader)
        newest = None
    if newest is not None and newest > ds:
        return False
    rows = read_delta(spark, output).where(F.col("ds") == F.lit(ds).cast("date")).where(F.col("run_id") == run_id)
    # Same writer settings as the dated table (e.g. the Delta connector on Databricks), whole-table overwrite.
    sink = config.sink.model_copy(update={"path": latest, "table": None, "mode": "overwrite", "partition_by": []})
    write_sink(rows.select(*OUTPUT_COLUMNS), sink, commit_metadata={"sbi.job": config.job, "sbi.run_id": run_id})
    return True


def _training_quality(folder: Path) -> dict[str, Any]:
    """The held-out metrics saved beside the model at training time (empty if none)."""
    try:
        return json.loads((folder / "metrics.json").read_text()).get("holdout") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def _quality_line(quality: dict[str, Any]) -> str:
    model, pop = quality.get("model") or {}, quality.get("popularity") or {}
    if not model:
        return "not recorded (train with jobs/train_recommender.py to record it)"
    line = f"HitRate@10 {model.get('hit_rate@10', float('nan')):.3f}, Recall@10 {model.get('recall@10', float('nan')):.3f}"
    if pop:
        line += (f" vs popularity {pop.get('hit_rate@10', float('nan')):.3f} / "
                 f"{pop.get('recall@10', float('nan')):.3f}")
    return line + f" ({model.get('users', '?')} users)"


register_task(RecommendTaskConfig, RecommendTask, job=RecommendJob())
