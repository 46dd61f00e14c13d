"""Typed job configuration: YAML in, validated pydantic models out.

One config drives spark-submit, the CLI and notebooks::

    config = load_config("conf/score_documents.yaml",
                         overrides=["batching.batch_size=128", "source.limit=1000"])

Unknown keys and bad values raise :class:`ConfigError` naming the key path and
what is allowed. ``${VAR}`` / ``${VAR:-default}`` in string values read the
environment, so secrets stay out of YAML.

The config layer, a module per concern: the sections' base (:mod:`.base`),
the source, sink and storage sections (:mod:`.data`), the model and batching
sections (:mod:`.inference`), the job, Spark, task and run sections
(:mod:`.models`), the task config classes by kind (:mod:`.kinds`), loading
(:mod:`.loading`) and secrets kept out of what is printed or recorded
(:mod:`.redaction`).
"""

from __future__ import annotations

from pipeline.config.data import SinkConfig, SourceConfig, StorageConfig
from pipeline.config.data import __all__ as _data_names
from pipeline.config.inference import AccuracyGateConfig, BatchingConfig, Int8Config, ModelConfig
from pipeline.config.inference import __all__ as _inference_names
from pipeline.config.loading import build_config, load_config, merged_config_data, parse_overrides
from pipeline.config.models import (
    DELTA_CONNECTOR_CONF, RUN_ID_PATTERN, JobConfig, MlflowConfig, QualityConfig, RunConfig, SparkConfig, TaskConfig,
)
from pipeline.config.models import __all__ as _model_names
from pipeline.errors import ConfigError

__all__ = sorted([*_data_names, *_inference_names, *_model_names, "ConfigError", "build_config", "load_config",
                  "merged_config_data", "parse_overrides"])
