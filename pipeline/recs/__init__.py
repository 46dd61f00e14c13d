"""Recommendations: a two-tower model, batched top-K scoring, and the nightly refresh.

Pure layers (no pyspark): :mod:`~pipeline.recs.data` (MovieLens tables),
:mod:`~pipeline.recs.features`, :mod:`~pipeline.recs.model` (the torch module),
:mod:`~pipeline.recs.registry` (the versioned model folder),
:mod:`~pipeline.recs.train`, :mod:`~pipeline.recs.scoring`,
:mod:`~pipeline.recs.evaluate` and :mod:`~pipeline.recs.task`. The Spark job
is :mod:`~pipeline.recs.job`. Importing this package does not import torch or
pyspark; the submodules that need them do.
"""

from __future__ import annotations

from pipeline.recs.config import RecommendTaskConfig, TrainConfig

__all__ = ["RecommendTaskConfig", "TrainConfig"]
