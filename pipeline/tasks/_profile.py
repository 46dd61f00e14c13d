"""What each task kind adds to the profile of its output (:mod:`pipeline.core.sketches`), per chunk on the executors.

The Spark glue hands every output chunk to the task's ``profile_output(out, profile)`` as it is scored
(the task's counts carry the profile to the driver; :mod:`pipeline.core.drift` compares it with the job's
recent runs). Each kind composes these helpers over its own columns; every helper reads only the
rows that carry a value (a skipped or failed row's results are null), and each is a few vectorised
Arrow/numpy passes over the chunk: no Python loop over rows.

- :func:`profile_labels`: the share of each ``label`` and the quantiles of ``score`` (embed, classify,
  classify_image);
- :func:`profile_embedding`: the embeddings' centroid and spread, and their norms;
- :func:`profile_generation`: completion lengths and finish reasons (generate, extract);
- :func:`profile_schema_valid`: the share of completions valid against the schema (extract);
- :func:`profile_ocr`: recognised lines per page and their confidence.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.rows import Status
from pipeline.core.sketches import SCORED, Profile

__all__ = ["column", "embedding_matrix", "profile_embedding", "profile_generation", "profile_labels", "profile_ocr",
           "profile_schema_valid"]


def column(out: pa.RecordBatch, name: str) -> pa.Array | None:
    """``out``'s column ``name``, or None when it has none."""
    index = out.schema.get_field_index(name)
    return out.column(index) if index >= 0 else None


def profile_labels(out: pa.RecordBatch, profile: Profile) -> None:
    """The share of each top ``label`` and the histogram of its ``score`` (a probability or a cosine)."""
    labels, scores = column(out, "label"), column(out, "score")
    if labels is not None:
        profile.count("label", labels)
    if scores is not None:
        values = scores.to_numpy(zero_copy_only=False) if scores.null_count == 0 else pc.drop_null(scores).to_numpy()
        bins = "unit" if values.size == 0 or float(np.nanmin(values)) >= 0 else "signed"
        profile.histogram("score", values, bins=bins)


def embedding_matrix(values: pa.Array) -> np.ndarray:
    """The non-null rows of a ``list<float>`` column as one ``[rows, dim]`` matrix (empty when none)."""
    kept = pc.drop_null(values)
    if len(kept) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    flat = pc.list_flatten(kept).to_numpy(zero_copy_only=False)
    return flat.reshape(len(kept), -1)


def profile_embedding(out: pa.RecordBatch, profile: Profile, name: str = "embedding", *, norms: bool = True) -> None:
    """The embeddings' count, sum and sum of squared norms (centroid and spread), and with ``norms`` the
    histogram of their norms (pointless for normalised embeddings: every norm is 1)."""
    values = column(out, name)
    if values is None:
        return
    matrix = embedding_matrix(values)
    if matrix.size:
        profile.vectors(name, matrix)
        if norms:
            profile.histogram(f"{name}_norm", np.linalg.norm(matrix, axis=1), bins="log")


def profile_generation(out: pa.RecordBatch, profile: Profile) -> None:
    """How long the completions are (tokens) and how they ended (``stop``, ``length``, ``error``)."""
    tokens, reasons = column(out, "completion_tokens"), column(out, "finish_reason")
    if tokens is not None:
        profile.histogram("completion_tokens", tokens, bins="log")
    if reasons is not None:
        profile.count("finish_reason", reasons)


def profile_schema_valid(out: pa.RecordBatch, profile: Profile) -> None:
    """Of the rows the model answered, how many answers were valid against the output schema."""
    status = column(out, "status")
    if status is None:
        return
    valid = int(pc.sum(pc.is_in(status, pa.array(SCORED))).as_py() or 0)
    invalid = int(pc.sum(pc.equal(status, str(Status.INVALID_OUTPUT))).as_py() or 0)
    profile.tally("schema_valid", {"valid": valid, "invalid": invalid})


def profile_ocr(out: pa.RecordBatch, profile: Profile) -> None:
    """Lines recognised per page, and the recogniser's confidence per line."""
    n_lines, lines = column(out, "n_lines"), column(out, "lines")
    if n_lines is not None:
        profile.histogram("lines", n_lines, bins="log")
    if lines is not None:
        flat = pc.list_flatten(pc.drop_null(lines))
        if len(flat):
            profile.histogram("confidence", pc.struct_field(flat, "confidence"), bins="unit")
