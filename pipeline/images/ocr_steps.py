"""OCR pre- and post-processing around the PP-OCR detection and recognition networks. Pure numpy/scipy.

The two networks (run by ``pipeline.tasks.ocr`` with onnxruntime) do the
learning; everything between them is here and tested without them:

1. :func:`detection_size` / :func:`detection_input`: the page resized to a
   multiple of 32 (shorter side at least 736 px) and normalised.
2. :func:`boxes_from_probability`: the detector's text-probability map ->
   line boxes (threshold, 2x2 dilation, connected components, box score,
   DB "unclip" growth), in page coordinates and reading order. Boxes are
   axis-aligned: pages are upright scans and renders; rotated text is not
   handled (the PP-OCR angle classifier is not used).
3. :func:`plan_line_batches` / :func:`collate_lines`: line crops resized to a
   fixed height (48 px) keep their own width; recognition batches are planned
   like token batches (:func:`pipeline.batching.plan_batches`, widths in place
   of token counts): **sorted by width and cut into fixed-size batches**, each
   padded only to its widest crop. On real manual pages (docs/benchmarks_images.md)
   this keeps padding efficiency above 0.9, against about 0.5 in arrival order.
4. :func:`ctc_decode`: greedy CTC over the recogniser's per-column class
   probabilities -> text and a confidence per line.
5. :func:`char_error_rate`: edit distance / reference length, to compare with
   ``pdftotext``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.batching import Batch, plan_batches

__all__ = [
    "LINE_HEIGHT", "LineBox", "boxes_from_probability", "char_error_rate", "collate_lines", "crop_line", "ctc_decode",
    "detection_input", "detection_size", "normalize_text", "plan_line_batches",
]

# the recogniser's input height (PP-OCRv4 rec: 3 x 48 x W)
LINE_HEIGHT = 48


@dataclass(frozen=True)
class LineBox:
    """A text line's box in page pixels (``x1``/``y1`` exclusive) and the detector's mean probability in it."""

    x0: int
    y0: int
    x1: int
    y1: int
    score: float

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0


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
    """``(1, 3, H, W)`` float32 for the detector: resized (bilinear), scaled to [-1, 1]."""
    from PIL import Image

    h, w = size
    resized = np.asarray(Image.fromarray(image).resize((w, h), Image.BILINEAR), dtype=np.float32)
    return ((resized / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None]


def boxes_from_probability(
    prob: np.ndarray, *, page_size: tuple[int, int], threshold: float = 0.3, box_threshold: float = 0.5,
    unclip_ratio: float = 1.6, min_size: int = 3, max_candidates: int = 1000,
) -> list[LineBox]:
    """Line boxes from the detector's ``(H, W)`` text-probability map, in page pixels and reading order.

    ``page_size`` is the page's ``(height, width)``. A connected region of
    probability above ``threshold`` (after a 2x2 dilation, as PP-OCR) becomes a
    box when its mean probability reaches ``box_threshold``; the box then grows
    on every side by ``area * unclip_ratio / perimeter`` (DB's unclip: the
    network is trained to predict a shrunk text kernel).

    >>> prob = np.zeros((64, 128), np.float32); prob[10:18, 20:100] = 0.9; prob[40:46, 8:40] = 0.8
    >>> [(b.x0, b.y0, b.x1, b.y1) for b in boxes_from_probability(prob, page_size=(128, 256))]
    [(27, 7, 215, 51), (7, 71, 91, 103)]
    """
    from scipy import ndimage

    mask = prob > threshold
    mask = ndimage.binary_dilation(mask, structure=np.ones((2, 2), bool), origin=(-1, -1)) if mask.any() else mask
    labels, count = ndimage.label(mask, structure=np.ones((3, 3), bool))
    page_h, page_w = page_size
    map_h, map_w = prob.shape
    sy, sx = page_h / map_h, page_w / map_w
    boxes: list[LineBox] = []
    for region in ndimage.find_objects(labels)[:max_candidates]:
        if region is None:
            continue
        ys, xs = region
        h, w = ys.stop - ys.start, xs.stop - xs.start
        if min(h, w) < min_size:
            continue
        score = float(prob[region].mean())
        if score < box_threshold:
            continue
        grow = (h * w) * unclip_ratio / (2.0 * (h + w))
        y0, y1 = ys.start - grow, ys.stop + grow
        x0, x1 = xs.start - grow, xs.stop + grow
        if min(y1 - y0, x1 - x0) < min_size + 2:
            continue
        box = LineBox(
            int(np.clip(round(x0 * sx), 0, page_w)), int(np.clip(round(y0 * sy), 0, page_h)),
            int(np.clip(round(x1 * sx), 0, page_w)), int(np.clip(round(y1 * sy), 0, page_h)), score,
        )
        if box.width > 3 and box.height > 3:
            boxes.append(box)
    return reading_order(boxes)


def reading_order(boxes: Sequence[LineBox]) -> list[LineBox]:
    """Top to bottom, and left to right within a line (boxes whose tops differ by under half a line height).

    >>> order = reading_order([LineBox(50, 12, 90, 30, 1), LineBox(0, 10, 40, 30, 1), LineBox(0, 40, 40, 60, 1)])
    >>> [(b.x0, b.y0) for b in order]
    [(0, 10), (50, 12), (0, 40)]
    """
    rest = sorted(boxes, key=lambda b: (b.y0, b.x0))
    out: list[LineBox] = []
    while rest:
        first = rest[0]
        same = [b for b in rest if abs(b.y0 - first.y0) < max(4, first.height // 2)]
        out.extend(sorted(same, key=lambda b: b.x0))
        rest = [b for b in rest if b not in same]
    return out


def crop_line(image: np.ndarray, box: LineBox, *, max_width: int) -> np.ndarray:
    """The box's pixels resized to :data:`LINE_HEIGHT` rows (width kept in proportion, at most ``max_width``).

    A box at least 1.5x taller than wide (vertical text) is turned 90 degrees first, as PP-OCR does.
    """
    from pipeline.images.decode import resize_to_height

    crop = image[box.y0 : box.y1, box.x0 : box.x1]
    if crop.shape[0] >= 1.5 * crop.shape[1]:
        crop = np.ascontiguousarray(np.rot90(crop))
    return resize_to_height(crop, LINE_HEIGHT, max_width=max_width)


def plan_line_batches(widths: Sequence[int] | np.ndarray, *, batch_size: int, sort_by_width: bool = True,
                      multiple: int = 8, bucket_shapes: Sequence[int] | None = None) -> list[Batch]:
    """Recognition batches of line crops: width-sorted (``sort_by_width``), fixed-size, padded per batch.

    Each batch pads to its widest crop rounded up to ``multiple`` columns (or
    to the smallest of ``bucket_shapes`` that fits, for static-shape runtimes).

    >>> [(b.indices.tolist(), b.length) for b in plan_line_batches([300, 40, 310, 50], batch_size=2)]
    [([1, 3], 56), ([0, 2], 312)]
    >>> [(b.indices.tolist(), b.length) for b in plan_line_batches([300, 40, 310, 50], batch_size=2, sort_by_width=False)]
    [([0, 1], 304), ([2, 3], 312)]
    """
    return plan_batches(widths, batch_size=batch_size, pad_to_multiple_of=multiple, sort=sort_by_width,
                        bucket_shapes=bucket_shapes)


def collate_lines(crops: Sequence[np.ndarray], batch: Batch) -> np.ndarray:
    """``(B, 3, 48, batch.length)`` float32: each crop scaled to [-1, 1], right-padded with 0 (mid grey)."""
    out = np.zeros((batch.size, 3, LINE_HEIGHT, batch.length), dtype=np.float32)
    for row, i in enumerate(batch.indices):
        crop = crops[i]
        out[row, :, :, : crop.shape[1]] = ((crop.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    return out


def ctc_decode(probs: np.ndarray, characters: Sequence[str]) -> list[tuple[str, float]]:
    """Greedy CTC decoding of ``(B, T, C)`` class probabilities: ``(text, mean confidence)`` per row.

    Class 0 is the CTC blank; repeats collapse unless a blank separates them.

    >>> p = np.eye(4)[[1, 1, 0, 1, 2, 0, 0]][None] * 0.9
    >>> ctc_decode(p, ["<blank>", "a", "b", " "])
    [('aab', 0.9)]
    """
    best = probs.argmax(axis=2)
    conf = probs.max(axis=2)
    out = []
    for row in range(best.shape[0]):
        ids = best[row]
        keep = ids != 0
        keep[1:] &= ids[1:] != ids[:-1]
        text = "".join(characters[i] for i in ids[keep])
        out.append((text, round(float(conf[row][keep].mean()), 6) if keep.any() else 0.0))
    return out


def normalize_text(text: str) -> str:
    """Whitespace runs collapsed to one space, ends stripped: what a CER compares.

    >>> normalize_text(" a\\n\\n b  c ")
    'a b c'
    """
    return " ".join(text.split())


def char_error_rate(hypothesis: str, reference: str) -> float:
    """Character edit distance (insertions, deletions, substitutions) / reference length, on normalised text.

    >>> char_error_rate("hello wrld", "hello world"), char_error_rate("", "abc"), char_error_rate("x", "")
    (0.09090909090909091, 1.0, 1.0)
    """
    hyp, ref = normalize_text(hypothesis), normalize_text(reference)
    if not ref:
        return 0.0 if not hyp else 1.0
    return _edit_distance(hyp, ref) / len(ref)


def _edit_distance(a: str, b: str) -> int:
    """Levenshtein distance, one numpy row per character of ``a`` (insertions resolved by a running minimum)."""
    bv = np.frombuffer(b.encode("utf-32-le"), dtype=np.uint32)
    cols = np.arange(bv.size + 1, dtype=np.int64)
    row = cols.copy()
    for i, ch in enumerate(np.frombuffer(a.encode("utf-32-le"), dtype=np.uint32)):
        sub = row[:-1] + (bv != ch)
        dele = row[1:] + 1
        cand = np.empty_like(row)
        cand[0] = i + 1
        cand[1:] = np.minimum(sub, dele)
        row = np.minimum.accumulate(cand - cols) + cols
    return int(row[-1])
