"""``embed``: sentence embeddings (mean or CLS pooling, L2-normalised), optional zero-shot labels."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.config import TaskConfig
from pipeline.registry import register_task
from pipeline.tasks._torch import check_encoder_precision, forward, label_columns, list_array
from pipeline.tasks.base import LoadedText, TextTask

__all__ = ["EmbedTask", "EmbedTaskConfig"]


class EmbedTaskConfig(TaskConfig):
    """Sentence embeddings (AutoModel + pooling), optionally zero-shot scored against labels."""

    kind: Literal["embed"] = "embed"
    # padding is masked, so batch sizes and padded shapes never change a row's embedding
    fingerprint_batching: ClassVar[tuple[str, ...]] = ("max_length",)
    pooling: Literal["mean", "cls"] = Field("mean", description="`mean` or `cls` pooling")
    normalize: bool = Field(True, description="L2-normalise the embedding")
    store_embedding: bool = Field(True, description="keep the vector in the output")
    labels: dict[str, str] = Field(
        default_factory=dict, description="`{label: description}`, embedded once per worker; rows get a cosine "
        "per label, the best `label` and its `score`")

    def check_job(self, job: Any) -> None:
        check_encoder_precision(job)


class EmbedTask(TextTask):
    """Embeds each row; with ``labels`` also scores it against each label description (cosine).

    MiniLM-style sentence encoders list a Normalize module they do not ship as
    weights, so normalisation happens here, after pooling.
    """

    kind: ClassVar[str] = "embed"
    model_kind: ClassVar[str] = "embed"

    def result_fields(self) -> list[pa.Field]:
        fields = []
        if self.config.store_embedding:
            fields.append(pa.field("embedding", pa.list_(pa.float32())))
        if self.config.labels:
            fields += [
                pa.field("label", pa.string()),
                pa.field("score", pa.float32()),
                pa.field("scores", pa.map_(pa.string(), pa.float32())),
            ]
        return fields

    def load_extras(self, loaded: LoadedText) -> np.ndarray | None:
        """The label descriptions' embeddings, once per load, in fp32 whatever precision rows then run in."""
        if not self.config.labels:
            return None
        enc = loaded.tokenizer(list(self.config.labels.values()), padding=True, truncation=True,
                               max_length=self.batching.max_length, return_tensors="np")
        return self._embed(loaded, enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64))

    def top_labels(self, loaded: LoadedText, outputs: dict[str, np.ndarray]) -> np.ndarray | None:
        if loaded.labels is None:
            return None
        return (outputs["embedding"] @ loaded.labels.T).argmax(axis=1)

    def _embed(self, loaded: LoadedText, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        import torch

        out = forward(loaded.model, input_ids, attention_mask, precision=loaded.precision)
        hidden = out.last_hidden_state.float()
        if self.config.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = torch.from_numpy(attention_mask).to(hidden.device).unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        if self.config.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.cpu().numpy().astype(np.float32)

    def forward(self, loaded: LoadedText, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        return {"embedding": self._embed(loaded, input_ids, attention_mask)}

    def build_columns(self, loaded: LoadedText, results: dict[str, np.ndarray | None], valid: np.ndarray) -> list[pa.Array]:
        emb = results.get("embedding")
        columns = []
        if self.config.store_embedding:
            columns.append(list_array(emb, valid, pa.float32()))
        if self.config.labels:
            scores = None if emb is None else emb @ loaded.labels.T
            columns += label_columns(list(self.config.labels), scores, valid)
        return columns


register_task(EmbedTaskConfig, EmbedTask)
