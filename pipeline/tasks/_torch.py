"""Torch helpers shared by encoder tasks (imported lazily, on executors)."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

__all__ = ["check_encoder_precision", "forward", "label_columns", "label_map_array", "list_array", "to_device"]


def check_encoder_precision(job: Any) -> None:
    """Refuse, at config time, a precision encoder tasks do not run (int4 is the generation kinds' GGUF path)."""
    if job.model.precision == "int4":
        raise ValueError("model.precision int4 is for generate/extract (a GGUF on llama.cpp); encoder tasks run "
                         "fp32, bf16, fp16, int8 or auto")


def forward(model: Any, input_ids: np.ndarray, attention_mask: np.ndarray, *, precision: str) -> Any:
    """Run ``model`` on one padded batch under inference mode (and CPU autocast for bf16/fp16).

    ``precision`` is the one the model was prepared for (``pipeline.models.precision``):
    an int8 model is already quantised (or an ONNX Runtime session that takes the same
    inputs), CUDA half-precision weights already cast.
    """
    import torch

    from pipeline.models.precision import autocast_dtype

    device = model.device
    ids, mask = to_device(input_ids, device), to_device(attention_mask, device)
    dtype = autocast_dtype(precision, device.type)
    autocast: Any = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with torch.inference_mode(), autocast:
        return model(input_ids=ids, attention_mask=mask)


def to_device(array: np.ndarray, device: Any) -> Any:
    """``array`` as a tensor on ``device``; on CUDA through page-locked host memory, copied asynchronously.

    A copy from ordinary (pageable) memory makes the calling thread wait for it;
    from pinned memory it is a DMA the GPU does while this thread queues the
    forward's kernels behind it on the same stream (``non_blocking``), and
    torch's caching host allocator keeps the pinned block until the copy is
    done. UNTESTED on a GPU: no GPU runs in this project's tests; run
    ``bench/gpu.sh`` where one is lent. On CPU: a zero-copy view, as before.
    """
    import torch

    tensor = torch.from_numpy(array)
    if device.type == "cuda":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def list_array(values: np.ndarray | None, valid: np.ndarray, value_type: Any) -> Any:
    """A list<value_type> Arrow array: row i of ``values`` for each valid row, null elsewhere."""
    import pyarrow as pa

    n = valid.size
    width = 0 if values is None else values.shape[1]
    counts = np.where(valid, width, 0)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    flat = pa.array(np.empty(0, dtype=np.float32) if values is None else values.reshape(-1), value_type)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=pa.array(~valid))


def label_map_array(names: list[str], scores: np.ndarray | None, valid: np.ndarray) -> Any:
    """A map<string, float> Arrow array {label: score} for valid rows, null elsewhere."""
    import pyarrow as pa

    n, k = valid.size, len(names)
    counts = np.where(valid, k, 0)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    nvalid = int(valid.sum())
    keys = pa.array(names * nvalid, pa.string())
    items = pa.array(
        np.empty(0, dtype=np.float32) if scores is None else scores.astype(np.float32).reshape(-1), pa.float32()
    )
    return pa.MapArray.from_arrays(pa.array(offsets), keys, items, mask=pa.array(~valid))


def label_columns(names: list[str], scores: np.ndarray | None, valid: np.ndarray) -> list[Any]:
    """``label`` (the best name), ``score`` (its score) and ``scores`` ({name: score}) for valid rows.

    ``scores`` has one row per valid row (None when there are none); other rows get nulls.
    """
    import pyarrow as pa

    label = np.full(valid.size, None, dtype=object)
    score = np.full(valid.size, np.nan, dtype=np.float32)
    if scores is not None and scores.size:
        best = scores.argmax(axis=1)
        label[valid] = [names[j] for j in best]
        score[valid] = scores[np.arange(best.size), best]
    return [
        pa.array(label.tolist(), pa.string()),
        pa.array(score, pa.float32(), mask=~valid),
        label_map_array(names, scores, valid),
    ]
