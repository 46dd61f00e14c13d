"""OCR around the PP-OCR networks, and its first steps: the detector's input and the line boxes of its output.

The three networks (run by ``pipeline.tasks.ocr`` with onnxruntime) do the
learning; everything between them is in four modules, tested without them:
the page's detection (steps 1-2, here), its lines and their order
(:mod:`pipeline.images.ocr_layout`), the line crops and their batches
(:mod:`pipeline.images.ocr_lines`), and text (:mod:`pipeline.images.ocr_text`).

1. :func:`detection_size` / :func:`detection_input`: the page resized to a
   multiple of 32 (shorter side at least ``min_side``, longer side at most
   ``max_side``: the cap bounds the detector's memory on a 600 dpi scan) and
   normalised.
2. :func:`boxes_from_probability`: the detector's text-probability map ->
   line boxes, as PP-OCR's DB post-processing does it with OpenCV: threshold,
   2x2 dilation, contours, minimum-area **rotated** rectangles, the box score
   (mean probability inside the polygon), DB's unclip with ``pyclipper``.
3. :func:`~pipeline.images.ocr_layout.reading_order`: the lines in reading order on a skewed page
   that may have two columns.
4. :func:`~pipeline.images.ocr_lines.crop_line`: each box's perspective crop, level, 48 px high;
   :func:`~pipeline.images.ocr_lines.direction_input`: the same crops for the direction classifier.
5. :func:`~pipeline.images.ocr_lines.plan_line_batches` / :func:`~pipeline.images.ocr_lines.collate_lines`:
   recognition batches **sorted by width**, each padded only to its widest crop.
6. :func:`~pipeline.images.ocr_text.ctc_decode`: greedy CTC -> text and a confidence per line.
7. :func:`~pipeline.images.ocr_text.char_error_rate`: edit distance / reference length, to compare
   with ``pdftotext``.
"""

from __future__ import annotations

import numpy as np

from pipeline.images.ocr_layout import LineBox, reading_order

__all__ = ["boxes_from_probability", "detection_input", "detection_size"]


def detection_size(height: int, width: int, *, min_side: int = 736, max_side: int = 2000) -> tuple[int, int]:
    """The detector's input ``(height, width)``: multiples of 32, shorter side raised to ``min_side``,
    longer side capped at ``max_side`` (the cap wins), aspect ratio kept.

    >>> detection_size(1650, 1275), detection_size(100, 400), detection_size(6000, 1000)
    ((1664, 1280), (512, 1984), (1984, 320))
    """
    scale = 1.0
    if min(height, width) < min_side:
        scale = min_side / min(height, width)
    if max(height, width) * scale > max_side:
        scale = max_side / max(height, width)
    h = max(32, int(round(height * scale / 32)) * 32)
    w = max(32, int(round(width * scale / 32)) * 32)
    return h, w


def detection_input(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """``(1, 3, H, W)`` float32 for the detector: resized (bilinear; area-averaged when shrinking), in [-1, 1]."""
    import cv2

    h, w = size
    shrink = h * w < image.shape[0] * image.shape[1]
    resized = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)
    return (resized.astype(np.float32) * (2.0 / 255.0) - 1.0).transpose(2, 0, 1)[None]


def boxes_from_probability(
    prob: np.ndarray, *, page_size: tuple[int, int], threshold: float = 0.3, box_threshold: float = 0.5,
    unclip_ratio: float = 1.6, min_size: int = 3, max_candidates: int = 1000,
) -> list[LineBox]:
    """Rotated line boxes from the detector's ``(H, W)`` text-probability map, in page pixels and reading order.

    PP-OCR's DB post-processing with OpenCV: pixels above ``threshold``
    (dilated 2x2) form contours; each contour's minimum-area rotated
    rectangle is kept when the mean probability inside it reaches
    ``box_threshold``, then grown by ``area * unclip_ratio / perimeter``
    (``pyclipper``; the network predicts a shrunk text kernel) and boxed again.
    ``page_size`` is the page's ``(height, width)``.

    >>> prob = np.zeros((64, 128), np.float32); prob[10:18, 20:100] = 0.9; prob[40:46, 8:40] = 0.8
    >>> [(b.x0, b.y0, b.x1, b.y1) for b in boxes_from_probability(prob, page_size=(128, 256))]
    [(28, 8, 212, 48), (8, 72, 88, 100)]
    """
    import cv2

    mask = (prob > threshold).astype(np.uint8)
    mask = cv2.dilate(mask, np.ones((2, 2), np.uint8))
    contours, _ = cv2.findContours(mask, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
    page_h, page_w = page_size
    map_h, map_w = prob.shape
    scale = np.array([page_w / map_w, page_h / map_h], np.float32)
    boxes: list[LineBox] = []
    for contour in contours[:max_candidates]:
        points, short = _min_area_box(contour)
        if short < min_size:
            continue
        score = _box_score(prob, points)
        if score < box_threshold:
            continue
        grown = _unclip(points, unclip_ratio)
        if grown is None:
            continue
        points, short = _min_area_box(grown)
        if short < min_size + 2:
            continue
        points = points * scale
        points[:, 0] = np.clip(points[:, 0], 0, page_w)
        points[:, 1] = np.clip(points[:, 1], 0, page_h)
        box = LineBox(tuple((float(x), float(y)) for x, y in points), score)  # type: ignore[arg-type]
        if box.length > 3 and box.thickness > 3:
            boxes.append(box)
    return reading_order(boxes)


def _min_area_box(contour: np.ndarray) -> tuple[np.ndarray, float]:
    """The contour's minimum-area rotated rectangle as 4 corners (top-left first, clockwise), and its short side."""
    import cv2

    rect = cv2.minAreaRect(contour.reshape(-1, 1, 2).astype(np.float32))
    pts = cv2.boxPoints(rect)
    pts = pts[np.argsort(pts[:, 0], kind="stable")]
    left, right = pts[:2], pts[2:]
    tl, bl = (left[0], left[1]) if left[0, 1] <= left[1, 1] else (left[1], left[0])
    tr, br = (right[0], right[1]) if right[0, 1] <= right[1, 1] else (right[1], right[0])
    return np.array([tl, tr, br, bl], np.float32), float(min(rect[1]))


def _box_score(prob: np.ndarray, points: np.ndarray) -> float:
    """Mean probability inside the polygon (PP-OCR's "fast" score: the polygon rasterised in its bounding box)."""
    import cv2

    h, w = prob.shape
    x0, x1 = int(np.clip(np.floor(points[:, 0].min()), 0, w - 1)), int(np.clip(np.ceil(points[:, 0].max()), 0, w - 1))
    y0, y1 = int(np.clip(np.floor(points[:, 1].min()), 0, h - 1)), int(np.clip(np.ceil(points[:, 1].max()), 0, h - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), np.uint8)
    cv2.fillPoly(mask, [(points - [x0, y0]).round().astype(np.int32)], 1)
    return float(cv2.mean(prob[y0 : y1 + 1, x0 : x1 + 1], mask)[0])


def _unclip(points: np.ndarray, ratio: float) -> np.ndarray | None:
    """DB's unclip: the polygon offset outward by ``area * ratio / perimeter`` (round joins, pyclipper)."""
    import cv2
    import pyclipper

    distance = cv2.contourArea(points) * ratio / max(cv2.arcLength(points, True), 1e-6)
    offset = pyclipper.PyclipperOffset()
    offset.AddPath([tuple(p) for p in points.round().astype(np.int64).tolist()], pyclipper.JT_ROUND,
                   pyclipper.ET_CLOSEDPOLYGON)
    grown = offset.Execute(distance)
    if len(grown) != 1:
        return None
    return np.asarray(grown[0], np.float32)
