"""Typed options of training the two-tower recommender (the refresh's task config lives in
:mod:`pipeline.tasks.recommend`).

Same conventions as :mod:`pipeline.config`: small frozen pydantic models with
named defaults, unknown keys rejected, so a typo in YAML or ``--set`` fails
before any work instead of silently using a default.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["TrainConfig"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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
