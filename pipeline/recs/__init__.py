"""Recommendations: a two-tower model, batched top-K scoring, training and evaluation.

Pure layers (no pyspark): :mod:`~pipeline.recs.data` (MovieLens tables),
:mod:`~pipeline.recs.features`, :mod:`~pipeline.recs.model` (the torch module),
:mod:`~pipeline.recs.registry` (the versioned model folder),
:mod:`~pipeline.recs.train`, :mod:`~pipeline.recs.scoring` and
:mod:`~pipeline.recs.evaluate`. The nightly refresh is the ``recommend`` task
kind (:mod:`pipeline.tasks.recommend`), run by the shared runner like every
other task. Importing this package does not import torch or pyspark; the
submodules that need them do.
"""

from __future__ import annotations

from pipeline.recs.config import TrainConfig

__all__ = ["TrainConfig"]
