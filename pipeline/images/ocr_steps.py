"""OCR pre- and post-processing around the PP-OCR networks: OpenCV and pyclipper for the geometry, numpy for the rest.

The three networks (run by ``pipeline.tasks.ocr`` with onnxruntime) do the
learning; everything between them is here and tested without them:

1. :func:`detection_size` / :func:`detection_input`: the page resized to a
   multiple of 32 (shorter side at least ``min_side``, longer side at most
   ``max_side``: the cap bounds the detector's memory on a 600 dpi scan) and
   normalised.
2. :func:`boxes_from_probability`: the detector's text-probability map ->
   line boxes, as PP-OCR's DB post-processing does it with OpenCV: threshold,
   2x2 dilation, contours, minimum-area **rotated** rectangles, the box score
   (mean probability inside the polygon), DB's unclip with ``pyclipper``.
3. :func:`reading_order`: the page's skew is the median angle of its long
   boxes; line centres are turned back by it, a vertical gutter with no line
   across it splits two columns, and lines read top to bottom, left to right
   within a column, full-width lines (titles) between column blocks.
4. :func:`crop_line`: each box's perspective crop (``cv2.warpPerspective``
   from its four corners) straight to the recogniser's 48 px height, so a
   skewed line comes out level. :func:`direction_input`: the same crops for
   PP-OCR's text-direction classifier (0 or 180 degrees).
5. :func:`plan_line_batches` / :func:`collate_lines`: line crops resized to a
   fixed height (48 px) keep their own width; recognition batches are planned
   like token batches (:func:`pipeline.batching.plan_batches`, widths in place
   of token counts): **sorted by width and cut into fixed-size batches**, each
   padded only to its widest crop. On real manual pages (docs/benchmarks_images.md)
   this keeps padding efficiency above 0.9, against about 0.5 in arrival order.
6. :func:`ctc_decode`: greedy CTC over the recogniser's per-column class
   probabilities -> text and a confidence per line.
7. :func:`char_error_rate`: edit distance / reference length, to compare with
   ``pdftotext``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.batching import Batch, plan_batches

__all__ = [
    "DIRECTION_WIDTH", "LINE_HEIGHT", "LineBox", "boxes_from_probability", "char_error_rate", "collate_lines",
    "crop_line", "ctc_decode", "detection_input", "detection_size", "direction_input", "noise_level",
    "normalize_text", "plan_line_batches", "reading_order", "smooth_line",
]

# the recogniser's input height (PP-OCRv4 rec: 3 x 48 x W)
LINE_HEIGHT = 48
# the direction classifier's input width (PP-OCR mobile v2.0 cls: 3 x 48 x 192)
DIRECTION_WIDTH = 192

Point = tuple[float, float]


@dataclass(frozen=True)
class LineBox:
    """A text line's rotated box in page pixels and the detector's mean probability in it.

    ``points`` are the four corners clockwise from the line's top-left (top-left, top-right,
    bottom-right, bottom-left as the text reads); ``x0, y0, x1, y1`` is the upright box around them.
    """

    points: tuple[Point, Point, Point, Point]
    score: float

    @classmethod
    def upright(cls, x0: float, y0: float, x1: float, y1: float, score: float = 1.0) -> "LineBox":
        """An axis-aligned box."""
        return cls(((x0, y0), (x1, y0), (x1, y1), (x0, y1)), score)

    @property
    def x0(self) -> int:
        return int(math.floor(min(p[0] for p in self.points)))

    @property
    def y0(self) -> int:
        return int(math.floor(min(p[1] for p in self.points)))

    @property
    def x1(self) -> int:
        return int(math.ceil(max(p[0] for p in self.points)))

    @property
    def y1(self) -> int:
        return int(math.ceil(max(p[1] for p in self.points)))

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0

    @property
    def length(self) -> float:
        """Along the text: the longer of the top and bottom edges."""
        (a, b, c, d) = self.points
        return max(math.dist(a, b), math.dist(d, c))

    @property
    def thickness(self) -> float:
        """Across the text: the longer of the left and right edges."""
        (a, b, c, d) = self.points
        return max(math.dist(a, d), math.dist(b, c))

    @property
    def angle(self) -> float:
        """The top edge's angle in degrees (positive: the line climbs to the right, as y grows downward)."""
        (a, b, _, _) = self.points
        return math.degrees(math.atan2(a[1] - b[1], b[0] - a[0]))

    def rotated_180(self, page_size: tuple[int, int]) -> "LineBox":
        """The same box on the page turned upside down (``page_size`` is ``(height, width)``)."""
        h, w = page_size
        a, b, c, d = ((w - x, h - y) for x, y in self.points)
        return LineBox((c, d, a, b), self.score)

    def as_ints(self) -> list[int]:
        """``[x0, y0, x1, y1, x2, y2, x3, y3]``, rounded: the corners for the ``quad`` output column."""
        return [int(round(v)) for p in self.points for v in p]


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


def page_skew(boxes: Sequence[LineBox]) -> float:
    """The page's skew in degrees: the median angle of its long boxes (at least 3x longer than thick), else 0.

    >>> round(page_skew([LineBox(((0, 10), (100, 8), (100, 18), (0, 20)), 1)] * 3), 3)
    1.146
    """
    angles = [b.angle for b in boxes if b.length >= 3 * b.thickness]
    return float(np.median(angles)) if angles else 0.0


def reading_order(boxes: Sequence[LineBox]) -> list[LineBox]:
    """Lines in reading order on a page that may be skewed and may have two columns.

    Centres are turned back by :func:`page_skew`, so a skewed line keeps its
    place. A vertical gutter that at most a fifth of the lines cross, with at
    least 3 lines on either side, makes two columns: lines that cross it
    (titles, full-width paragraphs) cut the page into blocks; within each block
    the left column reads before the right one. Within a column, lines read top
    to bottom, and boxes whose centres are within half a line height form one
    line, read left to right.

    >>> order = reading_order([LineBox.upright(50, 12, 90, 30), LineBox.upright(0, 10, 40, 30),
    ...                        LineBox.upright(0, 40, 40, 60)])
    >>> [(b.x0, b.y0) for b in order]
    [(0, 10), (50, 12), (0, 40)]
    """
    if len(boxes) < 2:
        return list(boxes)
    theta = math.radians(page_skew(boxes))
    # de-skew: y grows downward and a positive angle climbs to the right, so turn by +theta
    cos, sin = math.cos(theta), math.sin(theta)
    corners = np.array([b.points for b in boxes], np.float64)  # (n, 4, 2)
    u = corners[..., 0] * cos - corners[..., 1] * sin
    v = corners[..., 0] * sin + corners[..., 1] * cos
    u0, u1, vc = u.min(axis=1), u.max(axis=1), v.mean(axis=1)
    heights = np.array([b.thickness for b in boxes])
    gutter = _find_gutter(u0, u1, heights)
    order = np.argsort(vc, kind="stable")
    if gutter is None:
        ranked = _lines_in_order(order, u0, vc, heights)
    else:
        ranked = []
        block: list[int] = []
        for i in order:
            if u0[i] < gutter < u1[i]:  # a line across the gutter ends the column block above it
                ranked += _block_in_order(block, gutter, u0, u1, vc, heights) + [int(i)]
                block = []
            else:
                block.append(int(i))
        ranked += _block_in_order(block, gutter, u0, u1, vc, heights)
    return [boxes[i] for i in ranked]


def _find_gutter(u0: np.ndarray, u1: np.ndarray, heights: np.ndarray) -> float | None:
    """The x (de-skewed) of a gutter between two columns, or None for a one-column page."""
    n = len(u0)
    if n < 6:
        return None
    lo, hi = float(u0.min()), float(u1.max())
    span = hi - lo
    step = max(1.0, span / 400)
    candidates = np.arange(lo + 0.3 * span, lo + 0.7 * span, step)
    if candidates.size == 0:
        return None
    crossing = ((u0[None, :] < candidates[:, None]) & (u1[None, :] > candidates[:, None])).sum(axis=1)
    best = int(crossing.min())
    if best > 0.2 * n:
        return None
    # the middle of the widest run of positions that only the fewest lines cross
    runs, start = [], None
    for k, c in enumerate(np.append(crossing, n + 1)):
        if c == best and start is None:
            start = k
        elif c != best and start is not None:
            runs.append((k - start, start, k - 1))
            start = None
    width, first, last = max(runs)
    g = float((candidates[first] + candidates[last]) / 2)
    left, right = int((u1 <= g).sum()), int((u0 >= g).sum())
    if min(left, right) < 3 or width * step < 0.5 * float(np.median(heights)):
        return None
    return g


def _block_in_order(block: list[int], gutter: float, u0: np.ndarray, u1: np.ndarray, vc: np.ndarray,
                    heights: np.ndarray) -> list[int]:
    left = [i for i in block if u1[i] <= gutter]
    right = [i for i in block if u1[i] > gutter]
    return _lines_in_order(left, u0, vc, heights) + _lines_in_order(right, u0, vc, heights)


def _lines_in_order(indices: Sequence[int] | np.ndarray, u0: np.ndarray, vc: np.ndarray,
                    heights: np.ndarray) -> list[int]:
    """Top to bottom; boxes whose centres are within half a line height of the line's first box, left to right."""
    rest = sorted((int(i) for i in indices), key=lambda i: vc[i])
    out: list[int] = []
    while rest:
        first = rest[0]
        same = [i for i in rest if abs(vc[i] - vc[first]) < max(2.0, heights[first] / 2)]
        out += sorted(same, key=lambda i: u0[i])
        taken = set(same)
        rest = [i for i in rest if i not in taken]
    return out


def _warp(image: np.ndarray, corners: Sequence[Point], width: int, height: int) -> np.ndarray:
    import cv2

    src = np.array(corners, np.float32)
    dst = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    matrix = cv2.getPerspectiveTransform(src, dst)
    return cv2.warpPerspective(image, matrix, (width, height), flags=cv2.INTER_LINEAR,
                               borderMode=cv2.BORDER_REPLICATE)


def crop_line(image: np.ndarray, box: LineBox, *, max_width: int, height: int = LINE_HEIGHT) -> np.ndarray:
    """The box's perspective crop, level, ``height`` rows high (width in proportion, at most ``max_width``).

    One ``cv2.warpPerspective`` from the box's corners straight to the
    recogniser's size: a skewed line comes out level, with one resampling.
    A box at least 1.5x taller than wide (vertical text) is turned 90 degrees, as PP-OCR does.

    >>> page = np.full((100, 200, 3), 255, np.uint8); page[40:50, 20:180] = 0
    >>> crop_line(page, LineBox.upright(10, 35, 190, 55), max_width=1000).shape
    (48, 432, 3)
    """
    corners = box.points
    if box.thickness >= 1.5 * box.length:
        a, b, c, d = corners
        corners = (b, c, d, a)
    (a, b, c, d) = corners
    length = max(math.dist(a, b), math.dist(d, c))
    thickness = max(math.dist(a, d), math.dist(b, c), 1.0)
    width = max(1, min(max_width, int(math.ceil(height * length / thickness))))
    if thickness > 2 * height:
        # a big line (a 600 dpi scan, a heading): warp at its own size, then shrink with area averaging, which
        # a one-step bilinear warp would alias
        import cv2

        native = _warp(image, corners, max(1, int(round(length))), int(round(thickness)))
        return cv2.resize(native, (width, height), interpolation=cv2.INTER_AREA)
    return _warp(image, corners, width, height)


def noise_level(image: np.ndarray) -> float:
    """How noisy a page is: the share of its background pixels (a 5x5 median of at least 200) that differ from
    that median by 3 grey levels or more. A clean render scores a few percent (anti-aliased glyph edges), a
    scan with sensor noise and JPEG artifacts a third or more.

    >>> clean = np.full((60, 200, 3), 255, np.uint8); clean[20:40, 20:180] = 0
    >>> noisy = np.clip(clean + np.random.default_rng(0).normal(0, 12, clean.shape[:2])[..., None], 0, 255)
    >>> noise_level(clean) < 0.01, noise_level(noisy.astype(np.uint8)) > 0.3
    (True, True)
    """
    import cv2

    gray = np.ascontiguousarray(image[..., 0] if image.ndim == 3 else image)
    median = cv2.medianBlur(gray, 5)
    resid = np.abs(gray.astype(np.int16) - median.astype(np.int16))[median >= 200]
    return float((resid >= 3).mean()) if resid.size else 0.0


def smooth_line(crop: np.ndarray, *, sigma: float) -> np.ndarray:
    """A Gaussian blur of ``sigma`` px on a 48 px line crop of a noisy page (:func:`noise_level`).

    On scan-like pages (noise, JPEG) the recogniser drops spaces between
    words; a blur of about 1 px on the crop brings most of them back (on a
    Debian FAQ page: CER 0.063 -> 0.034 against the clean page's reading).
    """
    import cv2

    return cv2.GaussianBlur(crop, (0, 0), sigma) if sigma > 0 else crop


def direction_input(crops: Sequence[np.ndarray], *, windows: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Inputs for the direction classifier: ``(N, 3, 48, 192)`` float32 windows of the 48 px crops, and the
    crop each window comes from.

    A crop up to 192 columns wide is one window, right-padded with 0. A wider
    one gives up to ``windows`` windows of 192 columns at its own scale (start,
    middle, end), not the whole line squeezed into 192 columns as PP-OCR does:
    squeezed, a long line's glyphs are a few pixels wide, and the classifier
    then called one line in four of a clean manual page upside down.

    >>> x, owner = direction_input([np.zeros((48, 96, 3), np.uint8), np.zeros((48, 960, 3), np.uint8)])
    >>> x.shape, owner.tolist()
    ((4, 3, 48, 192), [0, 1, 1, 1])
    """
    parts: list[np.ndarray] = []
    owner: list[int] = []
    for i, crop in enumerate(crops):
        w = crop.shape[1]
        starts = [0] if w <= DIRECTION_WIDTH else np.linspace(0, w - DIRECTION_WIDTH, windows).astype(int).tolist()
        for start in starts:
            parts.append(crop[:, start : start + DIRECTION_WIDTH])
            owner.append(i)
    out = np.zeros((len(parts), 3, LINE_HEIGHT, DIRECTION_WIDTH), np.float32)
    for row, part in enumerate(parts):
        out[row, :, :, : part.shape[1]] = (part.astype(np.float32) * (2.0 / 255.0) - 1.0).transpose(2, 0, 1)
    return out, np.array(owner, np.int64)


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
