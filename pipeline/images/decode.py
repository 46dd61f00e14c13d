"""Decode untrusted image bytes into RGB arrays, or say exactly why not.

Pure Pillow/numpy, run on the workers. Every image either decodes to an
8-bit RGB array (with notes on what was normalised on the way) or raises
:class:`ImageRejected` carrying a row status and a message that names the
problem and the fix. Nothing else may escape for a *known* bad input: an
unexpected exception is a poison row, which the task quarantines.

What each bad input becomes:

========================  =====================  ==========================================
input                     status                 handling
========================  =====================  ==========================================
null bytes / path         ``skipped_null``       nothing to decode
0-byte file               ``skipped_empty``      nothing to decode
not an image              ``invalid_image``      Pillow cannot identify the format
truncated / corrupt data  ``invalid_image``      never classified from a half-decoded image
decompression bomb        ``too_large``          refused from the header, before decoding
CMYK JPEG                 ``ok``                 converted to RGB (note ``cmyk->rgb``)
16-bit PNG                ``ok``                 scaled to 8 bits (note ``16bit->8bit``)
animated GIF / APNG       ``ok``                 first frame (note ``animated:first of N``)
multi-page TIFF           ``ok``                 first page; every page with :func:`decode_pages`
                                                 (note ``pages:N``; ``pages:K of N`` past the limits)
EXIF-rotated photo        ``ok``                 upright as displayed (note ``exif:orientation N``)
transparency              ``ok``                 composited on white (note ``alpha->white``)
========================  =====================  ==========================================

The pixel guard reads the size from the header (``Image.open`` is lazy) and
refuses anything above ``max_pixels`` before a single pixel is decoded: a
30,000 x 30,000 PNG is under 1 MB on disk and 2.7 GB decoded.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import PipelineError
from pipeline.core.rows import Status

__all__ = [
    "DEFAULT_MAX_PIXELS", "DecodedImage", "ImageRejected", "decode_image", "decode_pages", "read_image_bytes", "resize_center_crop",
    "resize_to_height",
]

# 40 megapixels: an 8K photo (33 MP) passes; decoding one costs 120 MB of RGB.
DEFAULT_MAX_PIXELS = 40_000_000


class ImageRejected(PipelineError, ValueError):
    """A known bad input: ``status`` is the row status, the message says what was wrong and what to do (still a
    ``ValueError``, as it was before it joined the :class:`~pipeline.errors.PipelineError` tree)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class DecodedImage:
    """An upright 8-bit RGB image ``array`` (H, W, 3), its source ``format`` and what was normalised."""

    array: np.ndarray
    format: str
    mode: str
    notes: tuple[str, ...] = ()
    # the pages after the first of a multi-page document (TIFF), when decoded with :func:`decode_pages`
    more_pages: tuple[np.ndarray, ...] = ()
    # pages the document holds that were not decoded (beyond the page or pixel limit)
    pages_left_out: int = 0
    # the resolution the file states (pixels per inch, e.g. a scanner's 300), when it states one
    dpi: int | None = None

    @property
    def height(self) -> int:
        return int(self.array.shape[0])

    @property
    def width(self) -> int:
        return int(self.array.shape[1])


def read_image_bytes(location: str) -> bytes:
    """The bytes of an image at a local path or a URI (``s3://``, ``file://``...), read through ``pyarrow.fs``.

    Raises :class:`ImageRejected` (``missing_file``) when it does not exist,
    so a stale path in a table is a flagged row, not a failed job.
    """
    import pyarrow.fs as pafs

    try:
        if "://" in location:
            fs, path = pafs.FileSystem.from_uri(location)
        else:
            fs, path = pafs.LocalFileSystem(), location
        with fs.open_input_stream(path) as stream:
            return stream.read()
    except FileNotFoundError:
        raise ImageRejected("missing_file", f"no image at {location!r}: file not found") from None
    except (OSError, ValueError) as exc:
        if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
            raise ImageRejected("missing_file", f"no image at {location!r}: {exc}") from None
        raise


def decode_image(data: bytes | None, *, max_pixels: int = DEFAULT_MAX_PIXELS, draft: tuple[int, int] | None = None
                 ) -> DecodedImage:
    """Decode ``data`` to an upright 8-bit RGB :class:`DecodedImage`.

    ``draft`` (width, height) lets JPEG decode straight at a reduced scale no
    smaller than that size (DCT scaling: 2-8x faster for big photos that are
    resized to 224 pixels anyway); other formats ignore it.

    >>> decode_image(b"")
    Traceback (most recent call last):
    ...
    pipeline.images.decode.ImageRejected: empty image: 0 bytes
    >>> decode_image(b"%PDF-1.4 not an image")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeline.images.decode.ImageRejected: not an image: Pillow cannot identify the format (first bytes b'%PDF-1.4 n'); ...
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    if data is None:
        raise ImageRejected(Status.SKIPPED_NULL, "no image: the value is null")
    if len(data) == 0:
        raise ImageRejected(Status.SKIPPED_EMPTY, "empty image: 0 bytes")
    notes: list[str] = []
    with warnings.catch_warnings():
        # our own pixel guard below replaces Pillow's warning band
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as exc:
            raise ImageRejected("too_large", f"decompression bomb refused before decoding: {exc}") from None
        except UnidentifiedImageError:
            raise ImageRejected(
                Status.INVALID_IMAGE,
                f"not an image: Pillow cannot identify the format (first bytes {bytes(data[:10])!r}); "
                "check that the source holds image files (JPEG, PNG, GIF, WebP, TIFF, BMP)",
            ) from None
        width, height = im.size
        if width * height > max_pixels:
            raise ImageRejected(
                "too_large",
                f"image is {width:,} x {height:,} = {width * height:,} pixels, above the limit of {max_pixels:,} "
                "(task.max_pixels); refused before decoding (a decompression bomb, or raise the limit)",
            )
        if width <= 0 or height <= 0:
            raise ImageRejected(Status.INVALID_IMAGE, f"image has no pixels ({width} x {height})")
        fmt = im.format or "unknown"
        mode = im.mode
        frames = int(getattr(im, "n_frames", 1) or 1)
        if frames > 1:
            notes.append(f"animated:first of {frames} frames")
            im.seek(0)
        try:
            if draft is not None and fmt == "JPEG":
                im.draft("RGB", draft)
            im.load()
            upright = ImageOps.exif_transpose(im)
        except Image.DecompressionBombError as exc:
            raise ImageRejected("too_large", f"decompression bomb refused: {exc}") from None
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            raise ImageRejected(
                Status.INVALID_IMAGE, f"truncated or corrupt {fmt} data: {exc}; re-export or re-upload the file"
            ) from None
    orientation = _orientation(im)
    if orientation not in (None, 1):
        notes.append(f"exif:orientation {orientation}")
    return DecodedImage(_to_rgb(upright if upright is not None else im, notes), fmt, mode, tuple(notes),
                        dpi=_dpi(im))


def decode_pages(data: bytes | None, *, max_pixels: int = DEFAULT_MAX_PIXELS, max_pages: int = 1) -> DecodedImage:
    """:func:`decode_image`, plus up to ``max_pages - 1`` further pages of a multi-page TIFF in ``more_pages``.

    The pages decoded together stay within ``max_pixels`` (the limit of one image), so a document costs
    no more memory than the biggest image allowed; pages past either limit are counted in
    ``pages_left_out`` and named in the notes (``pages:K of N``). Other multi-frame formats (animated
    GIF, APNG) are animations, not pages: their first frame only, as :func:`decode_image` does.
    """
    from PIL import Image, ImageOps

    first = decode_image(data, max_pixels=max_pixels)
    if first.format != "TIFF":
        return first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        im = Image.open(io.BytesIO(data))  # decoded once above: identifiable, within the pixel limit
        total = int(getattr(im, "n_frames", 1) or 1)
        if total == 1:
            return first
        pages: list[np.ndarray] = []
        budget = max_pixels - first.width * first.height
        notes = [n for n in first.notes if not n.startswith("animated:")]
        for k in range(1, min(total, max_pages)):
            im.seek(k)
            width, height = im.size
            if width * height > budget:
                break
            try:
                im.load()
                page = ImageOps.exif_transpose(im) or im
            except (OSError, SyntaxError, ValueError, EOFError) as exc:
                raise ImageRejected(Status.INVALID_IMAGE, f"page {k + 1} of {total} of this TIFF is truncated or "
                                                     f"corrupt: {exc}; re-export or re-scan the document") from None
            pages.append(_to_rgb(page, []))
            budget -= width * height
    read = 1 + len(pages)
    notes.append(f"pages:{read}" if read == total else f"pages:{read} of {total}")
    return DecodedImage(first.array, first.format, first.mode, tuple(notes), tuple(pages), total - read, first.dpi)


def _dpi(im: Any) -> int | None:
    """The horizontal resolution a file states (PNG pHYs, JPEG JFIF/EXIF, TIFF), rounded; None when absent or
    implausible (a JFIF header's 1 x 1 aspect ratio is not a resolution)."""
    try:
        value = float(im.info.get("dpi", (0, 0))[0])
    except (TypeError, ValueError, IndexError):
        return None
    return int(round(value)) if 50 <= value <= 4800 else None


def _orientation(im: Any) -> int | None:
    try:
        return im.getexif().get(0x0112)
    except Exception:  # noqa: BLE001 - a broken EXIF block only loses the note
        return None


def _to_rgb(im: Any, notes: list[str]) -> np.ndarray:
    """An (H, W, 3) uint8 array from any Pillow mode, scaling deep images instead of clipping them."""
    from PIL import Image

    mode = im.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        # Pillow's own convert("L") clips 16-bit values at 255 (a white image); scale instead
        arr = np.asarray(im, dtype=np.float64)
        top = 65535.0 if mode.startswith("I;16") or (mode == "I" and arr.max(initial=0) > 255) else 255.0
        if mode == "F":
            top = max(1.0, float(arr.max(initial=1.0)))
        gray = np.clip(np.rint(arr * (255.0 / top)), 0, 255).astype(np.uint8)
        notes.append("16bit->8bit" if top == 65535.0 else f"{mode}->8bit")
        return np.repeat(gray[:, :, None], 3, axis=2)
    if mode == "CMYK":
        notes.append("cmyk->rgb")
        return np.asarray(im.convert("RGB"))
    if mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in im.info) or (
        mode in ("RGB", "L") and "transparency" in im.info
    ):
        rgba = im.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        notes.append("alpha->white")
        return np.asarray(Image.alpha_composite(background, rgba).convert("RGB"))
    if mode != "RGB":
        return np.asarray(im.convert("RGB"))
    return np.asarray(im)


def resize_center_crop(image: np.ndarray, size: int, *, crop_fraction: float = 0.875) -> np.ndarray:
    """ImageNet evaluation geometry: shorter side to ``size / crop_fraction``, then the centre ``size`` square.

    Bilinear (Pillow, antialiased when shrinking). Always returns ``(size, size, 3)`` uint8.

    >>> resize_center_crop(np.zeros((480, 640, 3), np.uint8), 224).shape
    (224, 224, 3)
    >>> resize_center_crop(np.zeros((10, 3000, 3), np.uint8), 32).shape
    (32, 32, 3)
    """
    from PIL import Image

    h, w = image.shape[:2]
    short = max(size, int(round(size / crop_fraction)))
    scale = short / min(h, w)
    new_w, new_h = max(size, int(round(w * scale))), max(size, int(round(h * scale)))
    resized = np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BILINEAR))
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return resized[top : top + size, left : left + size]


def resize_to_height(image: np.ndarray, height: int, *, max_width: int | None = None) -> np.ndarray:
    """Scale to ``height`` rows keeping the aspect ratio (width at least 1, at most ``max_width``).

    >>> resize_to_height(np.zeros((20, 100, 3), np.uint8), 48).shape
    (48, 240, 3)
    >>> resize_to_height(np.zeros((20, 1000, 3), np.uint8), 48, max_width=320).shape
    (48, 320, 3)
    """
    from PIL import Image

    h, w = image.shape[:2]
    width = max(1, int(np.ceil(height * w / h)))
    if max_width is not None:
        width = min(width, max_width)
    return np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))
