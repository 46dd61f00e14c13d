"""Images made with Pillow on the spot: photo-like patterns, text pages and one of every bad-image class.

Used by the tests and by ``make demo-images`` (whose photo folder gets the bad
images too, so the demo's summary shows each status). Nothing is downloaded.
"""

from __future__ import annotations

import functools
import io
import struct
import zlib

import numpy as np

__all__ = [
    "DOC_LINES", "animated_gif", "bad_image_set", "cmyk_jpeg", "exif_rotated_jpeg", "jpeg", "pattern", "png", "png16",
    "png_bomb", "rgba_png", "text_page", "truncated_jpeg",
]


def _save(im, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def pattern(seed: int, size: tuple[int, int] = (96, 64)) -> np.ndarray:
    """A smooth random colour pattern (H, W, 3) uint8: distinct images that JPEG keeps recognisable."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    chans = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(0.02, 0.15, 2).tolist() + [rng.uniform(0, 6.28)]
        chans.append(127 + 120 * np.sin(fx * xx + fy * yy + phase))
    return np.stack(chans, axis=2).astype(np.uint8)


def jpeg(seed: int = 0, size: tuple[int, int] = (96, 64), **kwargs) -> bytes:
    from PIL import Image

    return _save(Image.fromarray(pattern(seed, size)), "JPEG", quality=92, **kwargs)


def png(seed: int = 0, size: tuple[int, int] = (96, 64)) -> bytes:
    from PIL import Image

    return _save(Image.fromarray(pattern(seed, size)), "PNG")


def truncated_jpeg() -> bytes:
    data = jpeg(1, (256, 192))
    return data[: len(data) // 2]


def cmyk_jpeg() -> bytes:
    from PIL import Image

    return _save(Image.fromarray(pattern(2)).convert("CMYK"), "JPEG", quality=95)


def png16(value: int = 40000, size: tuple[int, int] = (40, 30)) -> bytes:
    """A 16-bit grayscale PNG whose pixels are all ``value`` (of 65535)."""
    from PIL import Image

    arr = np.full((size[1], size[0]), value, dtype=np.uint16)
    return _save(Image.fromarray(arr), "PNG")


def animated_gif(frames: int = 3) -> bytes:
    from PIL import Image

    ims = [Image.fromarray(pattern(10 + i)).convert("P") for i in range(frames)]
    return _save(ims[0], "GIF", save_all=True, append_images=ims[1:], duration=100, loop=0)


def exif_rotated_jpeg(orientation: int = 6) -> tuple[bytes, np.ndarray]:
    """A landscape 96x64 JPEG stored sideways with an EXIF orientation tag; also the upright pixels."""
    from PIL import Image

    upright = pattern(3, (96, 64))
    stored = np.rot90(upright, k=1)  # orientation 6: rotate 90 clockwise to display
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _save(Image.fromarray(np.ascontiguousarray(stored)), "JPEG", quality=95, exif=exif), upright


def png_bomb(side: int = 30_000) -> bytes:
    """A valid all-black ``side`` x ``side`` grayscale PNG: well under 1 MB on disk, side**2 bytes decoded."""
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)

    # All-zero rows: compress one block of rows once with a full flush (the output of an identical
    # block is then identical), repeat it, end with an empty final stored block and the Adler-32
    # of n zero bytes, which is ((n mod 65521) << 16) | 1. Builds in milliseconds.
    rows_per_block = 1000 if side % 1000 == 0 else 1
    block = b"\x00" * ((side + 1) * rows_per_block)  # filter byte + pixels, per row
    comp = zlib.compressobj(9)
    first = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    n = (side + 1) * side
    idat = first + again * (side // rows_per_block - 1) + b"\x01\x00\x00\xff\xff" + struct.pack(
        ">I", ((n % 65521) << 16) | 1)
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def rgba_png() -> bytes:
    from PIL import Image

    arr = np.zeros((20, 20, 4), np.uint8)
    arr[..., 3] = 0  # fully transparent black: must come out white
    return _save(Image.fromarray(arr, mode="RGBA"), "PNG")


@functools.lru_cache(maxsize=1)
def bad_image_set() -> dict[str, bytes | None]:
    """One of each bad-image class (the bomb is a real 30,000 x 30,000 PNG)."""
    return {
        "null": None,
        "empty": b"",
        "not_image": b"this is a text file, not an image\n" * 4,
        "truncated": truncated_jpeg(),
        "cmyk": cmyk_jpeg(),
        "png16": png16(),
        "animated": animated_gif(),
        "exif": exif_rotated_jpeg()[0],
        "bomb": png_bomb(),
    }


DOC_LINES = [
    "Batch inference on Spark",
    "Images are decoded on the workers.",
    "Each page is read line by line, 2026.",
    "The quick brown fox jumps over the lazy dog",
]


def text_page(lines=DOC_LINES, *, size: tuple[int, int] = (900, 420), font_size: int = 30) -> bytes:
    """A white PNG page with ``lines`` of black text (Pillow's built-in FreeType font: no system fonts)."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=font_size)
    for i, line in enumerate(lines):
        draw.text((40, 40 + i * int(font_size * 2.6)), line, fill="black", font=font)
    return _save(page, "PNG")
