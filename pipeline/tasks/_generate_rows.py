"""Which rows of a ``generate`` (or ``extract``) chunk go to the model, the same on every backend.

A row is not sent when its source line did not parse (``malformed``), when its image is missing or bad
(:func:`pipeline.tasks._generate_images.read_row_image`), or when its template values leave nothing to
generate from: any value null (``skipped_null``) or blank (``skipped_empty``), or none of them carrying
anything for the model (``skipped_no_content``). What "carrying anything" means is the backend's: a local
model asks its tokenizer, the endpoint backend only the characters (:mod:`pipeline.tasks._content`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from pipeline.core.rows import MALFORMED_ERROR, Status
from pipeline.tasks._generate_images import RowImage, read_row_image

__all__ = ["as_text", "sent_rows", "skip_status"]


def as_text(value: Any) -> Any:
    """A binary value decoded as UTF-8 (invalid bytes -> U+FFFD), as the encoder tasks do; others unchanged.

    >>> as_text(b"caf\\xc3\\xa9 \\xff"), as_text(None)
    ('café \\ufffd', None)
    """
    return value.decode("utf-8", errors="replace") if isinstance(value, (bytes, bytearray)) else value


def skip_status(values: Sequence[Any], has_content: Callable[[str], bool]) -> str | None:
    """The status of a row not generated for its template values (None: it is generated). A row with an image
    and no text value is generated: the image is its content.

    >>> [str(skip_status(values, str.isalnum)) for values in (["a", None], ["a", " "], ["?!"], ["?!", "a"])]
    ['skipped_null', 'skipped_empty', 'skipped_no_content', 'None']
    """
    if any(v is None for v in values):
        return Status.SKIPPED_NULL
    # Like a null, a blank value in any column the template needs leaves nothing to generate from.
    if any(not str(v).strip() for v in values):
        return Status.SKIPPED_EMPTY
    if values and not any(has_content(str(v)) for v in values):
        return Status.NO_CONTENT
    return None


def sent_rows(task: Any, cols: Mapping[str, list[Any]], malformed: np.ndarray, status: np.ndarray,
              error: np.ndarray, has_content: Callable[[str], bool]
              ) -> Iterator[tuple[int, dict[str, Any], RowImage | None]]:
    """``(row, its template values, its image or None)`` of each row that goes to the model; the others get
    their status (and message) in ``status`` and ``error``."""
    for i in range(len(malformed)):
        if malformed[i]:
            status[i], error[i] = Status.MALFORMED, MALFORMED_ERROR
            continue
        image = None
        if task.image_column:
            image, bad = read_row_image(task.config, cols[task.image_column][i])
            if bad is not None:
                status[i], error[i] = bad
                continue
        values = {c: as_text(cols[c][i]) for c in task.template_columns}
        skipped = skip_status(list(values.values()), has_content)
        if skipped is not None:
            status[i] = skipped
            continue
        yield i, values, image
