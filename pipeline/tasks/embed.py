"""``embed``: sentence embeddings (mean or CLS pooling, L2-normalised), optional zero-shot labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.config import TaskConfig
from pipeline.endpoint.config import EndpointConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.registry import register_task
from pipeline.core.rows import ANSWER_COLUMN, Status
from pipeline.tasks._content import malformed_rows
from pipeline.tasks._endpoint import EndpointBackend, EndpointJob
from pipeline.tasks._torch import check_encoder_precision, forward, label_columns, list_array
from pipeline.tasks.base import LoadedText, TextTask

__all__ = ["EmbedTask", "EmbedTaskConfig"]


class EmbedTaskConfig(TaskConfig):
    """Sentence embeddings (AutoModel + pooling), optionally zero-shot scored against labels."""

    kind: Literal["embed"] = "embed"
    # padding is masked, so batch sizes and padded shapes never change a row's embedding
    fingerprint_batching: ClassVar[tuple[str, ...]] = ("max_length",)
    fingerprint_ignore: ClassVar[frozenset[str]] = frozenset(
        f"endpoint.{k}" for k in (*EndpointConfig.PER_TRY, *EndpointConfig.SAME_ROWS))
    per_try_settings: ClassVar[frozenset[str]] = frozenset(f"endpoint.{k}" for k in EndpointConfig.PER_TRY)
    backend: Literal["transformers", "endpoint"] = Field(
        "transformers", description="`transformers` (the model folder, on the workers) or `endpoint` (an "
        "OpenAI-compatible server's `/embeddings`: `task.endpoint`)")
    endpoint: EndpointConfig | None = Field(
        None, description="the server of `backend: endpoint` (`base_url`, `model`, `api_key`, limits)")
    pooling: Literal["mean", "cls"] = Field("mean", description="`mean` or `cls` pooling")
    normalize: bool = Field(True, description="L2-normalise the embedding")
    store_embedding: bool = Field(True, description="keep the vector in the output")
    labels: dict[str, str] = Field(
        default_factory=dict, description="`{label: description}`, embedded once per worker; rows get a cosine "
        "per label, the best `label` and its `score`")

    def check_job(self, job: Any) -> None:
        if (self.backend == "endpoint") != (self.endpoint is not None):
            raise ValueError("task.backend endpoint and task.endpoint go together: give both (endpoint: "
                             "{base_url: ..., model: ...}) or neither")
        if self.backend != "endpoint" and not job.model.path:
            raise ValueError("model.path is required (a model folder) unless task.backend is endpoint")
        if self.backend != "endpoint":
            check_encoder_precision(job)


class EmbedTask(EndpointBackend, TextTask):
    """Embeds each row; with ``labels`` also scores it against each label description (cosine).

    MiniLM-style sentence encoders list a Normalize module they do not ship as
    weights, so normalisation happens here, after pooling.
    """

    kind: ClassVar[str] = "embed"
    model_kind: ClassVar[str] = "embed"
    # batch mode on the endpoint backend: each row's answer from the provider's batch API, when joined
    optional_input_columns: ClassVar[tuple[str, ...]] = (ANSWER_COLUMN,)

    # -- the endpoint backend (EndpointBackend): rows embedded by a server's /embeddings, one request per row
    request_path: ClassVar[str] = "/embeddings"

    def endpoint_calls(self, chunk: pa.RecordBatch) -> tuple[list[int], list[Any], np.ndarray, np.ndarray]:
        from pipeline.tasks._endpoint import embedding_calls

        texts = chunk.column(chunk.schema.get_field_index("text")).to_pylist()
        return embedding_calls(self, texts, malformed_rows(chunk))

    def load(self, model_dir: Path | None, device: str, *, machine: Any = None) -> Any:
        if self.config.backend != "endpoint":
            return super().load(model_dir, device, machine=machine)
        from pipeline.tasks._endpoint import LoadedEndpoint, attempt_client, embed_rows

        loaded = LoadedEndpoint(self.config.endpoint)
        if self.config.labels:  # the label descriptions, once per worker (not rows: no journal, no budget)
            texts = list(self.config.labels.values())
            vectors, status, error, _ = embed_rows(self, texts, np.zeros(len(texts), dtype=bool), WorkerCounts(),
                                                   attempt_client(self.config.endpoint, None))
            if vectors is None or len(vectors) != len(texts):
                raise RuntimeError(f"the endpoint could not embed the label descriptions: {[e for e in error if e]}")
            loaded.labels = self._normalized(vectors)
        return loaded

    def _normalized(self, vectors: np.ndarray) -> np.ndarray:
        if not self.config.normalize:
            return vectors
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)

    def process_stream(self, loaded: Any, chunks: Iterable[pa.RecordBatch], counts: WorkerCounts, *,
                       cpus: int = 1) -> Iterator[pa.RecordBatch]:
        if getattr(loaded, "backend", None) != "endpoint":
            yield from super().process_stream(loaded, chunks, counts, cpus=cpus)
            return
        for chunk in chunks:
            yield self.process(loaded, chunk, counts, cpus=cpus)

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts, *, cpus: int = 1) -> pa.RecordBatch:
        if getattr(loaded, "backend", None) != "endpoint":
            return super().process(loaded, chunk, counts, cpus=cpus)
        from pipeline.tasks._endpoint import embed_rows
        from pipeline.tasks._endpoint_batch import rows_client

        texts = chunk.column(chunk.schema.get_field_index("text")).to_pylist()
        vectors, status, error, n_tokens = embed_rows(self, texts, malformed_rows(chunk), counts,
                                                      rows_client(self, chunk))
        valid = np.asarray([v is None for v in error], dtype=bool) & (status == Status.OK)
        results = {} if vectors is None else {"embedding": self._normalized(vectors)}
        columns = self.build_columns(loaded, results, valid)
        counts.add("rows", chunk.num_rows)
        counts.add("chunks")
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        columns += [pa.array(n_tokens, pa.int32()), pa.array(np.zeros(chunk.num_rows, dtype=bool), pa.bool_()),
                    pa.array(status.tolist(), pa.string()), pa.array(error.tolist(), pa.string())]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Statuses and tokens, the labels' shares and scores, the embeddings' centroid and spread (and norms,
        unless normalised)."""
        from pipeline.tasks._profile import profile_embedding, profile_labels

        profile.rows(out)
        profile_labels(out, profile)
        profile_embedding(out, profile, norms=not self.config.normalize)

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


register_task(EmbedTaskConfig, EmbedTask, job=EndpointJob())
