"""Batch text generation with a causal LM: prompts, static and continuous batching, sampling.

Pure Python over torch/transformers (no pyspark). The ``generate`` task
(``pipeline.tasks.generate``) wires these into the Task protocol::

    gen = BatchGenerator(model, tokenizer, mode="continuous", slots=8, max_seq_len=640)
    results = gen.generate([GenerationRequest(ids, max_new_tokens=32, seed=row_seed(0, row_id))])
"""

from __future__ import annotations

from pipeline.generation.engine import (
    BatchGenerator,
    GenerationMode,
    GenerationRequest,
    GenerationResult,
    prefill_groups,
)
from pipeline.generation.kv import SlotBatch, kv_cache_bytes
from pipeline.generation.sampling import SamplingParams, choose_tokens, make_generator, row_seed
from pipeline.generation.stopping import find_stop

__all__ = [
    "BatchGenerator",
    "GenerationMode",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "SlotBatch",
    "choose_tokens",
    "find_stop",
    "kv_cache_bytes",
    "make_generator",
    "prefill_groups",
    "row_seed",
]
