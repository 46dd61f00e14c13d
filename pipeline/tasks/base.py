"""The task protocol, and the text task every encoder kind (embed, classify) builds on.

A task turns one Arrow chunk of input rows into one Arrow chunk of results,
row for row, in the same order. It is pure Python (pandas/Arrow/torch): the
Spark glue in ``pipeline.spark.udf`` only finds the cached model, hands each
chunk to :meth:`Task.process` and yields the result.

Every result carries ``status`` (``ok``, ``truncated``, ``skipped_null``,
``skipped_empty``, ``skipped_no_content``, ``error``; ``extract`` adds
``invalid_output``) and ``error`` (a message, or null), so no input row is ever
dropped (the names: ``pipeline.core.rows``; which rows are not scored:
``pipeline.tasks._content``).

:class:`TextTask` loads the model through the accuracy gate and runs each
chunk in three steps (``pipeline.tasks._text_chunk``): statuses and tokens
(``pipeline.tasks._tokenize``), the model's batches, then the columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Hashable, Iterable, Iterator, Protocol, Sequence

import numpy as np
import pyarrow as pa

from pipeline.core.batching import BatchSizeMemory, collate, plan_batches
from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.core.rows import STATUS_FIELDS
from pipeline.tasks._text_chunk import finish_chunk, prepare_chunk, run_chunk, scatter
from pipeline.tasks._tokenize import pad_token_id, token_lengths, tokenize

__all__ = ["LoadedText", "Task", "TextTask"]


class Task(Protocol):
    """One inference task. ``load`` is heavy and runs once per worker; ``process`` runs per chunk."""

    kind: ClassVar[str]
    input_columns: ClassVar[tuple[str, ...]]

    def output_schema(self) -> pa.Schema:
        """The columns ``process`` returns (result columns, then :data:`STATUS_FIELDS`)."""
        ...

    def cache_key(self) -> Hashable:
        """What identifies the loaded model in the per-worker cache."""
        ...

    def load(self, model_dir: Path, device: str) -> Any:
        """Load the model (and anything derived once from it, such as label embeddings)."""
        ...

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        """Results for every row of ``chunk``, in the same order."""
        ...


@dataclass
class LoadedText:
    """What a text task keeps per worker in the model cache, for the worker's life.

    ``precision`` is the one in use after the accuracy gate (``gate`` says how
    it was chosen); ``labels`` holds anything derived once from the model (the
    embed task's label embeddings); ``memory`` the batch sizes learned from
    out-of-memory splits.
    """

    tokenizer: Any
    model: Any
    precision: str = "fp32"
    labels: Any = None
    gate: Any = None
    memory: BatchSizeMemory = field(default_factory=BatchSizeMemory)

    @property
    def load_counts(self) -> dict[str, Any]:
        """Counts to report once per load (the precision used, any fallback)."""
        return self.gate.counts() if self.gate is not None else {"precision_used": {self.precision: 1}}


class TextTask:
    """Shared machinery of encoder tasks: classify rows, tokenise, length-sort, batch, forward, restore.

    Subclasses set ``kind``, ``model_kind`` and implement :meth:`result_fields`,
    :meth:`forward` (one padded batch -> a dict of numpy arrays, one row per
    batch row) and :meth:`build_columns` (all rows' results -> Arrow arrays).
    """

    kind: ClassVar[str]
    model_kind: ClassVar[str]
    input_columns: ClassVar[tuple[str, ...]] = ("text",)
    # the runner draws a sample of the job's rows for the accuracy gate (``calibration_rows``)
    calibrates_on_rows: ClassVar[bool] = True

    def __init__(self, config: Any, *, model: ModelConfig, batching: BatchingConfig,
                 calibration_rows: Sequence[str] = (), recall_verdict_only: bool = False) -> None:
        self.config = config
        self.model = model
        self.batching = batching
        # texts of the job's own rows the accuracy gate calibrates on (drawn on the driver; empty: none)
        self.calibration_rows = tuple(calibration_rows)
        # a load standing in for the job's (a warm-up before its rows are drawn): it may only replay the
        # verdict the job's rows made, never measure one of its own
        self.recall_verdict_only = recall_verdict_only

    @classmethod
    def extras(cls, config: Any, model: ModelConfig) -> tuple[str, ...]:
        """The wheel's extras this task needs on the driver and every executor (:mod:`pipeline.core.extras`)."""
        if getattr(config, "backend", None) == "endpoint":
            return ("endpoint",)
        if model.precision == "int8" and model.int8.backend == "onnxruntime":
            return ("transformers", "int8")
        return ("transformers",)

    # -- protocol ---------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        return pa.schema(self.result_fields() + STATUS_FIELDS)

    def cache_key(self) -> Hashable:
        # the whole model config: precision, int8 options and the gate all change what is loaded; so may the rows
        # the gate calibrates on (one job's sample is the same on every worker and in every task), unless the
        # verdict is remembered: then it does not depend on the rows (pipeline.models.verdicts), and a model a
        # warm-up loaded with the remembered verdict serves the job's tasks
        if self._remembers_verdict():
            rows: Any = "run rows" if self.calibration_rows or self.recall_verdict_only else "texts"
        else:
            rows = hash(self.calibration_rows)
        return (self.kind, repr(self.model), repr(self.config), rows)

    def _remembers_verdict(self) -> bool:
        gate = self.model.accuracy_gate
        return gate.enabled and gate.remember and self.model.precision != "fp32"

    def result_fields(self) -> list[pa.Field]:
        raise NotImplementedError

    def positions_needed(self) -> tuple[int, str]:
        """The most tokens a row can reach the model with, and the setting that decides it (checked on the driver)."""
        return self.batching.max_length, "batching.max_length"

    def load(self, model_dir: Path, device: str, *, machine: Any = None) -> LoadedText:
        """Load in fp32, derive :meth:`load_extras`, then move to the configured precision through the accuracy gate.

        The gate's verdict is remembered per model, precision, settings and ``machine``
        (:class:`pipeline.models.verdicts.MachineIdentity`; None: this one): see :meth:`verdict_settings`.
        """
        from pipeline.models.loading import load_model
        from pipeline.models.precision import select_precision
        from pipeline.models.verdicts import MachineIdentity, VerdictMemory

        tokenizer, model = load_model(model_dir, kind=self.model_kind, device=device, precision="fp32",
                                      allow_pickle=self.model.allow_pickle)
        reference = LoadedText(tokenizer, model)
        reference.labels = self.load_extras(reference)

        def run(candidate: Any, precision: str, texts: Sequence[str]) -> dict[str, np.ndarray]:
            return self.score_texts(LoadedText(tokenizer, candidate, precision, reference.labels), texts)

        memory = VerdictMemory.for_model(
            model_dir, self.verdict_settings(), machine=machine or MachineIdentity.here(str(model.device)),
            recall_only=self.recall_verdict_only) if self._remembers_verdict() else None
        model, gate = select_precision(
            model, self.model.precision, run=run, top_labels=lambda out: self.top_labels(reference, out),
            gate=self.model.accuracy_gate, int8=self.model.int8, texts=self.calibration_rows,
            model_dir=model_dir, kind=self.model_kind, memory=memory,
        )
        return LoadedText(tokenizer, model, gate.precision, reference.labels, gate)

    def verdict_settings(self) -> dict[str, Any]:
        """What the accuracy gate's verdict depends on of this task, besides the model's files and the machine.

        The precision asked, the gate's settings (its thresholds, and where the sample comes from and how big it
        is, not its rows), ``model.int8``, the task's config, the batch size and length the sample is scored
        with, and the worker's torch threads (speed is measured per thread count).
        """
        import torch

        gate = self.model.accuracy_gate
        rows = self.calibration_rows or self.recall_verdict_only
        config = self.config.model_dump(mode="json") if hasattr(self.config, "model_dump") else repr(self.config)
        return {
            "kind": self.kind, "task": config, "precision": self.model.precision,
            "gate": gate.model_dump(mode="json", exclude={"remember"}),
            "sample": "run rows" if rows else "configured texts" if gate.calibration_texts else "built-in texts",
            "int8": self.model.int8.model_dump(mode="json"),
            "batching": {"batch_size": self.batching.batch_size, "max_length": self.batching.max_length},
            "threads": torch.get_num_threads(),
        }

    def load_extras(self, loaded: LoadedText) -> Any:
        """Anything computed once per load from the fp32 model (stored as ``loaded.labels``); None by default."""
        return None

    def top_labels(self, loaded: LoadedText, outputs: dict[str, np.ndarray]) -> np.ndarray | None:
        """The top label index per row of ``outputs`` (for the accuracy gate), or None when the task has none."""
        return None

    def score_texts(self, loaded: LoadedText, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """:meth:`forward` outputs for ``texts``, in order (no statuses, no fault handling: calibration)."""
        ids, _ = tokenize(loaded.tokenizer, texts, max_length=self.batching.max_length)
        pad_id = pad_token_id(loaded.tokenizer)
        out: dict[str, np.ndarray] = {}
        for batch in plan_batches(token_lengths(ids), batch_size=self.batching.batch_size, pad_to_multiple_of=1):
            scatter(out, self.forward(loaded, *collate(ids, batch, pad_id=pad_id)), batch.indices, len(ids))
        return out

    def forward(self, loaded: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def build_columns(self, loaded: Any, results: dict[str, np.ndarray | None], valid: np.ndarray) -> list[pa.Array]:
        raise NotImplementedError

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Add an output chunk to the run's profile (:mod:`pipeline.core.sketches`): statuses and tokens; kinds add theirs."""
        profile.rows(out)

    # -- the chunk loop -----------------------------------------------------------------------
    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts, *, cpus: int = 1) -> pa.RecordBatch:
        """Results for every row of ``chunk``, in order: prepare (CPU), run the batches (model), finish (CPU)."""
        work = prepare_chunk(self, loaded, chunk, cpus=cpus)
        run_chunk(self, loaded, work, counts)
        return finish_chunk(self, loaded, work, counts)

    def process_stream(
        self, loaded: Any, chunks: Iterable[pa.RecordBatch], counts: WorkerCounts, *, cpus: int = 1
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`process` for each chunk of a Spark task, in order, with the model kept busy.

        With ``batching.chunks_ahead`` > 0 the model's batches run on one device
        thread (``pipeline.tasks._feed``) while this thread reads and tokenises
        the next chunk and builds the previous one's columns; the same batches
        run in the same order, so every result is the inline worker's. 0 is the
        inline worker: one chunk at a time.
        """
        ahead = getattr(self.batching, "chunks_ahead", 0)
        if ahead <= 0:
            for chunk in chunks:
                yield self.process(loaded, chunk, counts, cpus=cpus)
            return
        from pipeline.tasks._feed import LockedCounts, overlapped

        shared = LockedCounts(counts)
        yield from overlapped(
            chunks,
            prepare=lambda chunk: prepare_chunk(self, loaded, chunk, cpus=cpus),
            run=lambda work: run_chunk(self, loaded, work, shared),
            finish=lambda work: finish_chunk(self, loaded, work, shared),
            ahead=ahead,
        )
