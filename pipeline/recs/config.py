"""Typed options of the recommendation stack: training, scoring (the task) and the refresh job.

Same conventions as :mod:`pipeline.config`: small frozen pydantic models with
named defaults, unknown keys rejected, so a typo in YAML or ``--set`` fails
before any work instead of silently using a default.
"""

from __future__ import annotations

import os
from typing import Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.config import ConfigError, ModelConfig, RunConfig, SinkConfig, SparkConfig
from pipeline.config import merged_config_data

__all__ = [
    "RecommendTaskConfig",
    "RecsTablesConfig",
    "RefreshJobConfig",
    "TrainConfig",
    "load_refresh_config",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class RecommendTaskConfig(_Model):
    """Top-K recommendation per user with a two-tower model (see :class:`pipeline.recs.task.RecommendTask`).

    ``batch_size`` is users per scoring batch: each batch scores ``batch_size x
    n_items`` in one matrix product, so it bounds the memory of a worker
    (about ``batch_size * n_items * 4`` bytes for scores plus as much again for
    masks), never ``users x items``.
    """

    kind: Literal["recommend"] = "recommend"
    k: int = Field(10, gt=0, le=1000)
    batch_size: int = Field(256, gt=0)
    # Items the user already interacted with are never recommended again.
    exclude_seen: bool = True
    # Input column with the user's seen item ids (oldest first); the most
    # recent ``max_history`` feed the user tower, all of them are excluded.
    seen_column: str = "seen_item_ids"
    max_history: int = Field(200, gt=0)
    # Columns holding the user features the model was trained with; checked
    # against the model folder's config when the model loads.
    feature_columns: list[str] = Field(default_factory=lambda: ["age", "gender", "occupation"])


class TrainConfig(_Model):
    """How :func:`pipeline.recs.train.train_two_tower` fits a model.

    The defaults train on MovieLens-100K in under a minute on one CPU core.
    """

    dim: int = Field(64, gt=0)
    epochs: int = Field(5, gt=0)
    batch_size: int = Field(1024, gt=0)
    lr: float = Field(0.01, gt=0)
    weight_decay: float = Field(1e-5, ge=0)
    # Softmax temperature on cosine scores: lower is sharper.
    temperature: float = Field(0.05, gt=0)
    # "full": softmax over the whole catalog (exact, cheap below ~100k items);
    # "in_batch": the other positives of the batch as negatives, with the
    # log-popularity correction (logQ) that keeps it from learning popularity.
    loss: Literal["full", "in_batch"] = "full"
    # Each user's latest interactions held out for evaluation (0: train on all).
    holdout_per_user: int = Field(2, ge=0)
    max_history: int = Field(200, gt=0)
    seed: int = 7
    # Torch CPU threads while training; one keeps runs reproducible and polite on shared machines.
    threads: int = Field(1, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.loss == "in_batch" and self.batch_size < 64:
            raise ValueError(f"loss 'in_batch' needs batch_size >= 64 to have enough negatives, got {self.batch_size}")
        return self


class RecsTablesConfig(_Model):
    """The Delta tables the refresh reads (folders; see ``jobs/prepare_recs_data.py``)."""

    users: str
    interactions: str
    # Optional: only used to report catalog items the model does not know (added since it was trained).
    items: str | None = None


class RefreshJobConfig(_Model):
    """The nightly ``refresh_recommendations`` job: users + seen items -> top-K per user -> Delta.

    ``model.path`` is a two-tower model folder or a model root whose
    ``LATEST`` file names the revision to use. ``sink`` is the dated history
    table (partitioned by ``ds``, one partition replaced per run); ``latest``
    is overwritten with the newest run's rows, for serving.
    """

    job: str = "refresh_recommendations"
    spark: SparkConfig = Field(default_factory=SparkConfig)
    tables: RecsTablesConfig
    model: ModelConfig
    task: RecommendTaskConfig = Field(default_factory=RecommendTaskConfig)
    sink: SinkConfig
    latest: str | None = None
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="after")
    def _check(self) -> "RefreshJobConfig":
        if self.sink.partition_by != ["ds"]:
            raise ValueError(f"sink.partition_by must be [ds] (one partition per run date), got {self.sink.partition_by}")
        if self.sink.table and self.latest:
            raise ValueError("latest is a folder path; with sink.table (a catalog) leave latest unset")
        return self


def load_refresh_config(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] = (),
    overlays: Iterable[str | os.PathLike[str]] = (),
) -> RefreshJobConfig:
    """Load ``conf/refresh_recommendations.yaml`` (+ overlays, + ``key.path=value`` overrides), validated.

    Same rules as :func:`pipeline.config.load_config`: ``${VAR}`` reads the
    environment, unknown keys are errors naming the key.
    """
    data = merged_config_data(path, overrides=overrides, overlays=overlays)
    try:
        return RefreshJobConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            what = {"extra_forbidden": "unknown key", "missing": "required key is missing"}.get(
                err["type"], f"{err['msg']} (got {err.get('input')!r})")
            lines.append(f"  {where}: {what}")
        raise ConfigError(f"invalid config {path}:\n" + "\n".join(lines)) from None
