"""Shared machinery of the image tasks: read and decode each row's image, group, run, restore order.

A chunk's rows arrive as image bytes (a ``binary_file`` source's ``content``,
or a table's binary column) or as paths/URIs read on the worker. Each row is
decoded with :func:`pipeline.images.decode.decode_image`; a known bad input
gets its own status (``skipped_null``, ``skipped_empty``, ``missing_file``,
``invalid_image``, ``too_large``) and message and is written to the output like
any row; an image the decoder or the model fails on in an unforeseen way is a
poison row: bisection isolates it and only that row becomes ``error`` (the
runner sends it to quarantine). Nothing is dropped.

Decoded images are handed to the task in groups (:meth:`ImageTask.group_size`
images at a time), so a chunk of big photos never holds more than one group
of decoded pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Iterator

import numpy as np
import pyarrow as pa

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.images.decode import DecodedImage, ImageRejected, decode_image, read_image_bytes
from pipeline.core.metrics import WorkerCounts
from pipeline.core.rows import STATUS_FIELDS, TRUNCATED, Status
from pipeline.tasks._failures import describe_error

__all__ = ["IMAGE_FIELDS", "ImageTask"]

IMAGE_FIELDS = [
    pa.field("width", pa.int32()),
    pa.field("height", pa.int32()),
    pa.field("image_format", pa.string()),
    # what decoding normalised, e.g. "exif:orientation 6; cmyk->rgb"; null when nothing
    pa.field("image_notes", pa.string()),
]


@dataclass
class _Row:
    """One row on its way through the task: its position, raw value (for fault drills) and decoded image."""

    index: int
    raw: Any
    image: DecodedImage


class ImageTask:
    """Base of the image task kinds: subclasses implement :meth:`result_fields`, :meth:`run_group`, :meth:`empty_result`.

    ``config`` must have ``image_column``, ``image_input`` (``bytes`` or ``path``)
    and ``max_pixels``.
    """

    kind: ClassVar[str]
    # JPEG DCT-scaling hint for decode (width, height), or None for full resolution
    draft_size: tuple[int, int] | None = None

    def __init__(self, config: Any, *, model: ModelConfig, batching: BatchingConfig) -> None:
        self.config = config
        self.model = model
        self.batching = batching
        self.input_columns: tuple[str, ...] = (config.image_column,)

    # the wheel's extras every image task needs (decoding, OpenCV, onnxruntime); a torch model adds transformers
    needs_extras: ClassVar[tuple[str, ...]] = ("images",)

    # -- protocol ------------------------------------------------------------------------------
    def output_schema(self) -> pa.Schema:
        return pa.schema(self.result_fields() + IMAGE_FIELDS + STATUS_FIELDS)

    def cache_key(self) -> Hashable:
        return (self.kind, repr(self.model), repr(self.config))

    def result_fields(self) -> list[pa.Field]:
        raise NotImplementedError

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Statuses, and where the kind has them the top label's share and score and the embeddings."""
        from pipeline.tasks._profile import profile_embedding, profile_labels

        profile.rows(out)
        profile_labels(out, profile)
        profile_embedding(out, profile)

    def group_size(self) -> int:
        """Decoded images handed to :meth:`run_group` at once."""
        return self.batching.batch_size

    def run_group(self, loaded: Any, images: list[DecodedImage], counts: WorkerCounts) -> list[dict[str, Any]]:
        """One result dict per image (keys: :meth:`result_fields` names, plus optional ``n_tokens``, and
        ``truncated: True`` for an image read in part: the row's status is then ``truncated``)."""
        raise NotImplementedError

    def empty_result(self) -> dict[str, Any]:
        """The result columns of a row that was not inferred (all null)."""
        return {f.name: None for f in self.result_fields()}

    # -- the chunk loop -------------------------------------------------------------------------
    def decode(self, value: Any) -> DecodedImage:
        """Decode one row's value (bytes, or a path/URI read here when ``image_input`` is ``path``)."""
        if value is None:
            raise ImageRejected(Status.SKIPPED_NULL, "no image: the value is null")
        data = read_image_bytes(str(value)) if self.config.image_input == "path" else value
        return self.decode_bytes(data)

    def decode_bytes(self, data: bytes) -> DecodedImage:
        """One image's bytes to an upright RGB image (the first frame of a multi-frame file)."""
        return decode_image(data, max_pixels=self.config.max_pixels, draft=self.draft_size)

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        n = chunk.num_rows
        column = chunk.column(chunk.schema.get_field_index(self.config.image_column))
        if self.config.image_input == "bytes" and not (pa.types.is_binary(column.type)
                                                        or pa.types.is_large_binary(column.type)):
            raise TypeError(
                f"task.image_column {self.config.image_column!r} has type {column.type}, not binary; "
                "set task.image_input: path when it holds file paths or URIs"
            )
        status = np.full(n, Status.OK, dtype=object)
        error = np.full(n, None, dtype=object)
        results: list[dict[str, Any]] = [self.empty_result() for _ in range(n)]
        meta: list[tuple[Any, Any, Any, Any]] = [(None, None, None, None)] * n
        n_tokens = np.zeros(n, dtype=np.int32)
        truncated = np.zeros(n, dtype=bool)

        for group in self._groups(column, status, error, meta):
            for row, result in self._run_guarded(loaded, group, counts, error, status):
                n_tokens[row] = int(result.pop("n_tokens", 0) or 0)
                if result.pop("truncated", False):  # read in part (e.g. a document past its page limit)
                    truncated[row], status[row] = True, TRUNCATED
                results[row] = result

        counts.add("rows", n)
        counts.add("chunks")
        counts.add_status({str(s): int(c) for s, c in zip(*np.unique(status.astype(str), return_counts=True))})
        columns = [pa.array([r.get(f.name) for r in results], f.type) for f in self.result_fields()]
        columns += [
            pa.array([m[0] for m in meta], pa.int32()), pa.array([m[1] for m in meta], pa.int32()),
            pa.array([m[2] for m in meta], pa.string()), pa.array([m[3] for m in meta], pa.string()),
            pa.array(n_tokens, pa.int32()),
            pa.array(truncated, pa.bool_()),
            pa.array(status.tolist(), pa.string()),
            pa.array(error.tolist(), pa.string()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=self.output_schema())

    def _groups(self, column: pa.Array, status: np.ndarray, error: np.ndarray,
                meta: list) -> Iterator[list[_Row]]:
        """Decoded rows in groups of :meth:`group_size`; rejected rows get their status on the way."""
        size = self.group_size()
        group: list[_Row] = []
        for i in range(len(column)):
            raw = column[i].as_py()
            try:
                image = self.decode(raw)
            except ImageRejected as exc:
                status[i], error[i] = exc.status, str(exc)
                continue
            except Exception as exc:  # noqa: BLE001 - an unforeseen decoder failure: a poison row
                status[i], error[i] = Status.ERROR, "decode: " + describe_error(exc)
                continue
            meta[i] = (image.width, image.height, image.format, "; ".join(image.notes) or None)
            group.append(_Row(i, raw, image))
            if len(group) >= size:
                yield group
                group = []
        if group:
            yield group

    def _run_guarded(self, loaded: Any, group: list[_Row], counts: WorkerCounts, error: np.ndarray,
                     status: np.ndarray) -> list[tuple[int, dict[str, Any]]]:
        """Run a group; on failure split it in half down to single images, so only a poison image fails."""
        from pipeline.core import faults

        try:
            if faults.enabled:  # drills only: the poison marker is looked for in the image bytes
                faults.check_batch([_as_text(r.raw) for r in group])
            results = self.run_group(loaded, [r.image for r in group], counts)
        except Exception as exc:  # noqa: BLE001 - isolated below
            if len(group) == 1:
                counts.add("row_errors")
                row = group[0].index
                status[row], error[row] = Status.ERROR, describe_error(exc)
                return []
            counts.add("poison_bisections")
            half = len(group) // 2
            return (self._run_guarded(loaded, group[:half], counts, error, status)
                    + self._run_guarded(loaded, group[half:], counts, error, status))
        return [(r.index, res) for r, res in zip(group, results)]


def _as_text(raw: Any) -> str:
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).decode("latin-1")
    return "" if raw is None else str(raw)
