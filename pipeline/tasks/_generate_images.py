"""Each row's image for ``generate`` and ``extract`` with ``task.image_column``: read, decoded, checked, handed on.

The same reading and checks as the image tasks (:mod:`pipeline.images.decode`):
bytes, or a path/URI read on the worker (``task.image_input: path``), refused
past ``task.max_pixels`` before decoding; a known bad input gets its status
(``skipped_null``, ``skipped_empty``, ``missing_file``, ``invalid_image``,
``too_large``) and message, an unforeseen decoder failure ``error``: a flagged
row, never a failed task. What goes on: a PIL image (the local backends'
processors take it) or a data URI (the endpoint backend's ``image_url`` part).
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from typing import Any

from pipeline.images.decode import DecodedImage, ImageRejected, decode_image, read_image_bytes
from pipeline.core.rows import Status
from pipeline.tasks._failures import describe_error

__all__ = ["RowImage", "read_row_image"]

# formats an OpenAI-compatible server decodes as they are; anything else is sent as PNG
_AS_IS = {"JPEG": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass(frozen=True)
class RowImage:
    """A row's decoded image and the bytes it came from."""

    decoded: DecodedImage
    data: bytes

    @property
    def digest(self) -> str:
        """What tells two rows' images apart in a sampling seed: the sha256 of the bytes, 16 hex digits."""
        return hashlib.sha256(self.data).hexdigest()[:16]

    def pil(self) -> Any:
        """The upright RGB image, as a processor takes it."""
        from PIL import Image

        return Image.fromarray(self.decoded.array)

    def data_uri(self) -> str:
        """``data:<type>;base64,...``: the file's own bytes where a server reads them as they are and decoding
        changed nothing (no rotation, no conversion), else the decoded image as PNG."""
        mime = _AS_IS.get(self.decoded.format)
        data = self.data
        if mime is None or self.decoded.notes:
            buf = io.BytesIO()
            self.pil().save(buf, "PNG")
            data, mime = buf.getvalue(), "image/png"
        return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"

    @property
    def token_estimate(self) -> int:
        """An upper estimate of what a server counts for the image (one token per 28 x 28 pixels, at least 85),
        for pacing and the budget's reservation; what is paid is the usage the server returns."""
        return max(85, self.decoded.width * self.decoded.height // 784)


def read_row_image(config: Any, value: Any) -> tuple[RowImage | None, tuple[str, str] | None]:
    """``(image, None)``, or ``(None, (status, message))`` for a row whose image is missing or bad."""
    if value is None:
        return None, (Status.SKIPPED_NULL, f"no image: {config.image_column} is null")
    try:
        data = read_image_bytes(str(value)) if config.image_input == "path" else bytes(value)
        return RowImage(decode_image(data, max_pixels=config.max_pixels), data), None
    except ImageRejected as exc:
        return None, (exc.status, str(exc))
    except Exception as exc:  # noqa: BLE001 - an unforeseen decoder failure: this row's error, not the task's
        return None, (Status.ERROR, "decode: " + describe_error(exc))
