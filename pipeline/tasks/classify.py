"""``classify``: a sequence classifier's probability per label, top label and top score."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.config import TaskConfig
from pipeline.registry import register_task
from pipeline.tasks._torch import check_encoder_precision, forward, label_columns
from pipeline.tasks.base import LoadedText, TextTask

__all__ = ["ClassifyTask", "ClassifyTaskConfig"]


class ClassifyTaskConfig(TaskConfig):
    """Sequence classification: a probability per label from the model's id2label."""

    kind: Literal["classify"] = "classify"
    # padding is masked, so batch sizes and padded shapes never change a row's probabilities
    fingerprint_batching: ClassVar[tuple[str, ...]] = ("max_length",)
    multi_label: bool = Field(False, description="sigmoid per label instead of softmax")

    def check_job(self, job: Any) -> None:
        check_encoder_precision(job)


class ClassifyTask(TextTask):
    """Softmax over the model's labels (sigmoid per label with ``multi_label``); names from ``id2label``."""

    kind: ClassVar[str] = "classify"
    model_kind: ClassVar[str] = "classify"

    def result_fields(self) -> list[pa.Field]:
        return [
            pa.field("label", pa.string()),
            pa.field("score", pa.float32()),
            pa.field("scores", pa.map_(pa.string(), pa.float32())),
        ]

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Statuses and tokens, each top label's share and the top score's quantiles."""
        from pipeline.tasks._profile import profile_labels

        profile.rows(out)
        profile_labels(out, profile)

    @staticmethod
    def label_names(model: Any) -> list[str]:
        id2label = model.config.id2label or {}
        return [str(id2label.get(i, f"LABEL_{i}")) for i in range(model.config.num_labels)]

    def top_labels(self, loaded: LoadedText, outputs: dict[str, np.ndarray]) -> np.ndarray:
        return outputs["probs"].argmax(axis=1)

    def forward(self, loaded: LoadedText, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        import torch

        logits = forward(loaded.model, input_ids, attention_mask, precision=loaded.precision).logits.float()
        probs = torch.sigmoid(logits) if self.config.multi_label else torch.softmax(logits, dim=-1)
        return {"probs": probs.cpu().numpy().astype(np.float32)}

    def build_columns(self, loaded: LoadedText, results: dict[str, np.ndarray | None], valid: np.ndarray) -> list[pa.Array]:
        return label_columns(self.label_names(loaded.model), results.get("probs"), valid)


register_task(ClassifyTaskConfig, ClassifyTask)
