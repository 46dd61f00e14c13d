"""Scan-like pages from clean renders: skew, noise, blur, grayscale, JPEG, as a flatbed scanner and its driver
would leave them. Used by the OCR bench, ``make demo-images`` and the OCR tests, so that accuracy is measured on
the kind of page users bring and not only on perfect renders.

Each transform is one OpenCV or Pillow call on an ``(H, W, 3)`` uint8 page;
:func:`scan_like` chains them with values drawn from a seed, and returns the
JPEG bytes (the compression is part of the damage) with the values used.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["ScanParams", "add_noise", "blur", "grayscale", "jpeg_bytes", "rotate_page", "scan_like", "skew_page"]


@dataclass(frozen=True)
class ScanParams:
    """The damage done to one page: skew in degrees (positive: counter-clockwise), noise and blur sigmas, JPEG
    quality."""

    skew: float
    noise_sigma: float
    blur_sigma: float
    jpeg_quality: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def skew_page(image: np.ndarray, degrees: float) -> np.ndarray:
    """The page turned by ``degrees`` about its centre, same size, white filled in: a sheet laid askew.

    >>> page = np.full((100, 200, 3), 255, np.uint8); page[45:55, 20:180] = 0
    >>> turned = skew_page(page, 3.0); turned.shape, int(turned[50, 100, 0]), int(turned[0, 0, 0])
    ((100, 200, 3), 0, 255)
    """
    import cv2

    h, w = image.shape[:2]
    matrix = cv2.getRotationMatrix2D((w / 2, h / 2), degrees, 1.0)
    return cv2.warpAffine(image, matrix, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                          borderValue=(255, 255, 255))


def rotate_page(image: np.ndarray, quarter_turns: int) -> np.ndarray:
    """The page turned by 90-degree steps (counter-clockwise), e.g. 2 for a page scanned upside down."""
    return np.ascontiguousarray(np.rot90(image, quarter_turns))


def add_noise(image: np.ndarray, sigma: float, *, seed: int) -> np.ndarray:
    """Gaussian noise of ``sigma`` grey levels on every pixel (sensor noise)."""
    rng = np.random.default_rng(seed)
    noisy = image.astype(np.float32) + rng.normal(0.0, sigma, image.shape[:2])[..., None].astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """A Gaussian blur of ``sigma`` pixels (a scanner slightly out of focus)."""
    import cv2

    return cv2.GaussianBlur(image, (0, 0), sigma) if sigma > 0 else image


def grayscale(image: np.ndarray) -> np.ndarray:
    """Grey, as three equal channels (the shape the OCR steps expect)."""
    import cv2

    return cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)


def jpeg_bytes(image: np.ndarray, quality: int) -> bytes:
    """The page as a JPEG of ``quality`` (Pillow)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def scan_like(image: np.ndarray, *, seed: int, max_skew: float = 3.0, noise_sigma: float = 12.0,
              blur_sigma: float = 0.8, jpeg_quality: int = 50) -> tuple[bytes, ScanParams]:
    """A scan-like JPEG of a clean page: skew drawn from ``[-max_skew, max_skew]`` degrees, grayscale, blur,
    noise, then JPEG at ``jpeg_quality``; the same ``seed`` gives the same bytes.

    >>> page = np.full((120, 160, 3), 255, np.uint8); page[50:60, 20:140] = 0
    >>> data, params = scan_like(page, seed=1); data[:2], -3 <= params.skew <= 3, params.jpeg_quality
    (b'\\xff\\xd8', True, 50)
    """
    rng = np.random.default_rng(seed)
    params = ScanParams(skew=round(float(rng.uniform(-max_skew, max_skew)), 2), noise_sigma=noise_sigma,
                        blur_sigma=blur_sigma, jpeg_quality=jpeg_quality)
    page = grayscale(skew_page(image, params.skew))
    page = add_noise(blur(page, blur_sigma), noise_sigma, seed=seed)
    return jpeg_bytes(page, jpeg_quality), params
