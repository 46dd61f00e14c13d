"""A page's text lines as rotated boxes, and their reading order on a skewed, maybe two-column page.

:class:`LineBox` is what the detector's post-processing
(:func:`pipeline.images.ocr_steps.boxes_from_probability`) finds and the line
crops (:mod:`pipeline.images.ocr_lines`) cut out. :func:`reading_order`: the
page's skew is the median angle of its long boxes (:func:`page_skew`); line
centres are turned back by it, a vertical gutter with no line across it splits
two columns, and lines read top to bottom, left to right within a column,
full-width lines (titles) between column blocks. numpy only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["LineBox", "Point", "page_skew", "reading_order"]

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

    @functools.cached_property
    def bounds(self) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)``: the upright box around the corners in whole pixels (its edges rounded outward);
        computed once per box, however many of its edges are read."""
        xs, ys = [p[0] for p in self.points], [p[1] for p in self.points]
        return int(math.floor(min(xs))), int(math.floor(min(ys))), int(math.ceil(max(xs))), int(math.ceil(max(ys)))

    x0 = property(lambda self: self.bounds[0], doc="The upright box's left edge (an int).")
    y0 = property(lambda self: self.bounds[1], doc="The upright box's top edge (an int).")
    x1 = property(lambda self: self.bounds[2], doc="The upright box's right edge (an int).")
    y1 = property(lambda self: self.bounds[3], doc="The upright box's bottom edge (an int).")

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
