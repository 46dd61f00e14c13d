"""The recommend kind's part of a run's profile: what tonight's top-K lists look like, and how many of
each user's items were already in last night's list.

From the output chunk (:func:`profile_recommendations`): the users' statuses, their history lengths,
which items are recommended (ids hashed into 1,024 buckets: a catalog of millions in a bounded
sketch), the scores (every slot, and the top one), and how many users got a full top K.

The overlap with the night before needs last night's lists beside tonight's, so they ride in with the
user rows: :func:`with_previous` joins the previous night's committed top-K (the output table's
latest ``ds`` before the run's) to each user as :data:`PREVIOUS_COLUMN`, and the task sketches
:func:`overlap_profile` as it scores (no second pass over the output). A model trained on a broken day
recommends other items to everyone: its overlap with the night before collapses, where a normal
retrain keeps most of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.sketches import SCORED, Profile, item_buckets, overlap_at_k

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["PREVIOUS_COLUMN", "overlap_profile", "previous_top_k", "profile_recommendations", "with_previous"]

# each user's item ids of the night before, best first (null: no list that night); never written
PREVIOUS_COLUMN = "_previous_item_ids"


def profile_recommendations(out: pa.RecordBatch, profile: Profile, *, k: int) -> None:
    """Statuses, history lengths, the items recommended (hashed buckets), the scores and how full the lists are."""
    names = out.schema.names
    status = out.column(names.index("status"))
    profile.count("status", status)
    scored = pc.is_in(status, pa.array(SCORED))
    profile.histogram("history_items", out.column(names.index("n_tokens")).filter(scored), bins="log")
    items, scores = out.column(names.index("item_ids")), out.column(names.index("scores"))
    flat_items = pc.list_flatten(items).to_numpy(zero_copy_only=False)
    if flat_items.size:
        buckets = np.bincount(item_buckets(flat_items))
        profile.tally("items", {str(b): int(n) for b, n in enumerate(buckets) if n})
    profile.histogram("score", pc.list_flatten(scores), bins="signed")
    listed = pc.drop_null(scores)
    listed = listed.filter(pc.greater(pc.list_value_length(listed), 0))
    if len(listed):
        profile.histogram("top_score", pc.list_element(listed, 0), bins="signed")
    lengths = pc.list_value_length(items).filter(scored).fill_null(0).to_numpy(zero_copy_only=False)
    profile.tally("topk_fill", {"full": int((lengths >= k).sum()), "short": int(((lengths > 0) & (lengths < k)).sum()),
                                "none": int((lengths == 0).sum())})


def overlap_profile(today: Sequence[np.ndarray], previous: pa.Array) -> dict[str, Any]:
    """The sketch of each user's overlap@K with last night's list (``previous``: a list column aligned with
    ``today``; a user without a list either night is left out)."""
    shares = overlap_at_k([list(t) for t in today], previous.to_pylist())
    profile = Profile()
    profile.histogram("topk_overlap", shares, bins="unit")  # NaN (no list) is dropped
    return profile.data


def previous_top_k(spark: "SparkSession", *, path: str | None, table: str | None, ds: Any) -> "DataFrame | None":
    """``user_id``, :data:`PREVIOUS_COLUMN`: the item ids the output's latest ``ds`` before ``ds`` holds per user,
    best first; None when there is no such night (the first run, or no table yet)."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import read_delta

    try:
        rows = read_delta(spark, path) if path else spark.table(str(table))
    except Exception:  # noqa: BLE001 - no output yet: SourceError from a path, Spark's own for a catalog table
        return None
    if not {"user_id", "item_id", "rank", "ds"} <= set(rows.columns):
        return None
    before = rows.where(F.col("ds") < F.lit(ds).cast("date"))
    last = before.agg(F.max("ds")).first()[0]
    if last is None:
        return None
    ranked = F.sort_array(F.collect_list(F.struct("rank", F.col("item_id").cast("bigint").alias("item_id"))))
    return (before.where(F.col("ds") == F.lit(last)).groupBy(F.col("user_id").cast("bigint").alias("user_id"))
            .agg(F.transform(ranked, lambda s: s["item_id"]).alias(PREVIOUS_COLUMN)))


def with_previous(rows: "DataFrame", spark: "SparkSession", *, path: str | None, table: str | None,
                  ds: Any) -> "DataFrame":
    """The user rows with :data:`PREVIOUS_COLUMN` (null for a user without a list the night before)."""
    from pyspark.sql import functions as F

    previous = previous_top_k(spark, path=path, table=table, ds=ds)
    if previous is None:
        return rows.withColumn(PREVIOUS_COLUMN, F.lit(None).cast("array<bigint>"))
    return rows.join(previous, "user_id", "left")
