"""Typed options of the recommendation stack: training, scoring (the task) and the refresh job.

Same conventions as :mod:`pipeline.config`: small frozen pydantic models with
named defaults, unknown keys rejected, so a typo in YAML or ``--set`` fails
before any work instead of silently using a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RecommendTaskConfig", "TrainConfig"]


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
