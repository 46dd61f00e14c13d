"""The profile of a run's output: mergeable sketches, filled per chunk on the executors, summed on the driver.

Row counts alone say nothing about what the rows say: a model swapped for the wrong checkpoint, or an
upstream job sending empty texts, commits a full night of rows that are all there and all wrong. So each
inference task also sketches what its output looked like, while it scores (no second pass over the
data): row statuses, input lengths and tokens, and per task kind the output's own shape (labels and
scores, the embedding centroid, completion lengths, OCR confidence, top-K overlap with the night
before). :mod:`pipeline.core.drift` compares the merged sketch with the job's recent runs.

Every sketch adds up, so a task's profile travels as one more key of its counts
(:class:`~pipeline.core.metrics.WorkerCounts`, ``counts["profile"]``) and the driver merges the tasks' with
:func:`~pipeline.core.metrics.merge_counts`, whatever the order or the number of tasks:

- ``cat``: counts per value (``status``, ``label``, ``finish_reason``, hashed item ids);
- ``hist``: counts per bin of a fixed **bin family**, named in the sketch so any reader can read it back
  (``log``: 8 bins per octave of ``1 + v``, exact for 0..11, then about 9% wide, for lengths and counts;
  ``unit``: 100 bins over [0, 1] for probabilities and shares; ``signed``: 200 bins over [-1, 1] for
  cosines). Quantiles are read off the merged bins (:meth:`Histogram.quantile`), good to a bin's width;
- ``vec``: the count, the sum and the sum of squared norms of vectors (an embedding's centroid and spread).

A task's sketch is a few kB of JSON whatever its rows (bins are sparse, a 384-dim sum is 384 numbers).
Pure numpy and pyarrow: no pyspark, no torch.

>>> p = Profile()
>>> p.count("status", pa.array(["ok", "ok", "skipped_empty"]))
>>> p.histogram("tokens", np.array([3, 5, 40]), bins="log")
>>> q = Profile()
>>> q.count("status", pa.array(["ok"]))
>>> merged = merge_counts(merge_counts({}, p.data), q.data)
>>> merged["cat"]["status"]
{'ok': 3, 'skipped_empty': 1}
>>> Histogram.of(merged, "tokens").n, round(Histogram.of(merged, "tokens").quantile(0.5))  # good to a bin
(3, 5)
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.metrics import merge_counts
from pipeline.core.rows import Status

__all__ = ["BINS", "Histogram", "Profile", "Vectors", "item_buckets", "overlap_at_k", "shares"]

# a sketch of more distinct values than this keeps the most frequent (a label per row is a mistake, not a label)
MAX_CATEGORIES = 2000
# rows the model ran on: what token and score measures describe
SCORED = (str(Status.OK), str(Status.TRUNCATED))


@dataclass(frozen=True)
class Bins:
    """A fixed bin family: ``log`` (``per_octave`` bins per doubling of ``1 + v``, from 0) or linear over [lo, hi]."""

    name: str
    lo: float = 0.0
    hi: float = 1.0
    count: int = 0
    per_octave: int = 0

    def index(self, values: np.ndarray) -> np.ndarray:
        """The bin of each value (NaN dropped; out-of-range values in the first or last bin)."""
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        if self.per_octave:
            return np.floor(self.per_octave * np.log2(1.0 + np.maximum(v, 0.0))).astype(np.int64)
        scaled = np.floor((v - self.lo) / (self.hi - self.lo) * self.count)
        return np.clip(scaled, 0, self.count - 1).astype(np.int64)

    def edges(self, i: int) -> tuple[float, float]:
        """``(lower, upper)`` value of bin ``i``.

        >>> BINS["log"].edges(0), BINS["log"].edges(8), BINS["unit"].edges(99)
        ((0.0, 0.09050773266525769), (1.0, 1.1810154653305154), (0.99, 1.0))
        """
        if self.per_octave:
            return 2.0 ** (i / self.per_octave) - 1.0, 2.0 ** ((i + 1) / self.per_octave) - 1.0
        width = (self.hi - self.lo) / self.count
        return round(self.lo + i * width, 12), round(self.lo + (i + 1) * width, 12)


BINS = {"log": Bins("log", per_octave=8), "unit": Bins("unit", 0.0, 1.0, 100),
        "signed": Bins("signed", -1.0, 1.0, 200)}


def _numbers(values: Any) -> np.ndarray:
    """``values`` (an Arrow array, with nulls, or anything numpy takes) as float64 without nulls."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pc.drop_null(values).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float64).ravel()


class Profile:
    """One task's sketches, as a plain dict of numbers (``data``) that :func:`merge_counts` adds up."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        # seconds spent sketching (the task reports them as ``profile_seconds``: what the profile costs a run)
        self.seconds = 0.0

    def count(self, measure: str, values: Any) -> None:
        """Count each distinct non-null value of ``values`` (an Arrow array or a sequence of strings)."""
        array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(list(values), pa.string())
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        array = pc.drop_null(array)
        if len(array) == 0:
            return
        found = pc.value_counts(array)
        pairs = zip(found.field("values").to_pylist(), found.field("counts").to_pylist())
        into = self.data.setdefault("cat", {}).setdefault(measure, {})
        merge_counts(into, {str(v): int(n) for v, n in pairs})
        if len(into) > MAX_CATEGORIES:
            kept = sorted(into.items(), key=lambda kv: -kv[1])[:MAX_CATEGORIES]
            self.data["cat"][measure] = dict(kept)

    def tally(self, measure: str, counts: Mapping[str, int]) -> None:
        """Add counts already made (``{value: n}``, zeros left out) to ``measure``."""
        kept = {str(k): int(n) for k, n in counts.items() if n}
        if kept:
            merge_counts(self.data.setdefault("cat", {}).setdefault(measure, {}), kept)

    def histogram(self, measure: str, values: Any, *, bins: str) -> None:
        """Add ``values`` (nulls and NaN skipped) to ``measure``'s histogram in bin family ``bins``."""
        idx = BINS[bins].index(_numbers(values))
        if not idx.size:
            return
        offset = int(idx.min())
        found = np.bincount(idx - offset)
        nonzero = np.flatnonzero(found)
        into = self.data.setdefault("hist", {}).setdefault(measure, {}).setdefault(bins, {})
        merge_counts(into, {str(int(i) + offset): int(found[i]) for i in nonzero})

    def vectors(self, measure: str, matrix: np.ndarray) -> None:
        """Add the rows of ``matrix`` (``[n, dim]``) to ``measure``'s count, sum and sum of squared norms."""
        m = np.asarray(matrix, dtype=np.float64)
        if m.ndim != 2 or not m.shape[0]:
            return
        merge_counts(self.data.setdefault("vec", {}).setdefault(measure, {}),
                     {"n": int(m.shape[0]), "sum": [float(x) for x in m.sum(axis=0)], "sq": float((m * m).sum())})

    def rows(self, out: pa.RecordBatch) -> None:
        """Every task's part: the rows' statuses, and the tokens (``n_tokens``) of the rows the model ran on."""
        names = out.schema.names
        if "status" in names:
            self.count("status", out.column(names.index("status")))
        if "n_tokens" in names and "status" in names:
            scored = pc.is_in(out.column(names.index("status")), pa.array(SCORED))
            self.histogram("tokens", out.column(names.index("n_tokens")).filter(scored), bins="log")

    def inputs(self, column: pa.Array) -> None:
        """The length of each input (characters of a string column, bytes of a binary one; nulls skipped)."""
        started = time.perf_counter()
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            self.histogram("input_chars", pc.utf8_length(column), bins="log")
        elif pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            self.histogram("input_bytes", pc.binary_length(column), bins="log")
        self.seconds += time.perf_counter() - started


@dataclass(frozen=True)
class Histogram:
    """A merged histogram read back: its bin family and ``{bin index: count}``."""

    bins: Bins
    counts: Mapping[int, float]

    @classmethod
    def of(cls, profile: Mapping[str, Any], measure: str) -> "Histogram | None":
        """``measure``'s histogram in a (merged) profile's ``data``, or None when it has none."""
        families = (profile.get("hist") or {}).get(measure) or {}
        if not families:
            return None
        family = sorted(families)[0]  # a measure is sketched in one family
        return cls(BINS[family], {int(k): float(v) for k, v in families[family].items() if v})

    @property
    def n(self) -> int:
        return int(round(sum(self.counts.values())))

    def cdf(self, indices: Sequence[int]) -> np.ndarray:
        """The share of values in bins up to and including each of ``indices``."""
        keys = np.array(sorted(self.counts), dtype=np.int64)
        cum = np.cumsum([self.counts[int(k)] for k in keys]) / max(self.n, 1)
        pos = np.searchsorted(keys, np.asarray(indices, dtype=np.int64), side="right") - 1
        return np.where(pos >= 0, cum[np.maximum(pos, 0)], 0.0)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile, interpolated within its bin (NaN for an empty histogram).

        >>> h = Histogram(BINS["unit"], {10: 1, 50: 2, 90: 1})
        >>> h.quantile(0.5), h.quantile(1.0)
        (0.505, 0.91)
        """
        if not self.counts:
            return math.nan
        target, seen = q * self.n, 0.0
        for i in sorted(self.counts):
            c = self.counts[i]
            if seen + c >= target:
                lo, hi = self.bins.edges(i)
                return round(lo + (hi - lo) * ((target - seen) / c if c else 0.0), 6)
            seen += c
        return self.bins.edges(max(self.counts))[1]

    def mean(self) -> float:
        """The mean, each value taken at its bin's middle."""
        if not self.counts:
            return math.nan
        return sum(c * sum(self.bins.edges(i)) / 2 for i, c in self.counts.items()) / self.n


@dataclass(frozen=True)
class Vectors:
    """A merged vector sketch read back: ``n`` vectors, their ``centroid`` and total variance (``spread`` squared)."""

    n: int
    centroid: np.ndarray
    variance: float

    @classmethod
    def of(cls, profile: Mapping[str, Any], measure: str) -> "Vectors | None":
        """``measure``'s vectors in a (merged) profile's ``data``, or None when it has none.

        >>> v = Vectors.of({"vec": {"e": {"n": 2, "sum": [1.0, 1.0], "sq": 2.0}}}, "e")
        >>> v.n, v.centroid.tolist(), v.variance
        (2, [0.5, 0.5], 0.5)
        """
        sketch = (profile.get("vec") or {}).get(measure) or {}
        n = int(sketch.get("n", 0))
        if not n:
            return None
        centroid = np.asarray(sketch["sum"], dtype=np.float64) / n
        return cls(n, centroid, max(float(sketch.get("sq", 0.0)) / n - float(centroid @ centroid), 0.0))


def shares(counts: Mapping[str, float]) -> dict[str, float]:
    """Each value's share of the total.

    >>> shares({"ok": 3, "skipped_empty": 1})
    {'ok': 0.75, 'skipped_empty': 0.25}
    """
    total = float(sum(counts.values()))
    return {k: (v / total if total else 0.0) for k, v in counts.items()}


def overlap_at_k(today: Sequence[Sequence[int] | None], before: Sequence[Sequence[int] | None]) -> np.ndarray:
    """Per row with both lists: the share of today's list that was in the list before (NaN where either is missing).

    >>> overlap_at_k([[1, 2, 3, 4], [5, 6], None], [[4, 3, 9, 8], None, [1]]).tolist()
    [0.5, nan, nan]
    """
    out = np.full(len(today), np.nan)
    for i, (a, b) in enumerate(zip(today, before)):
        if a is not None and b is not None and len(a):
            out[i] = len(set(a).intersection(b)) / len(a)
    return out


def item_buckets(item_ids: np.ndarray, buckets: int = 1024) -> np.ndarray:
    """Item ids hashed into ``buckets`` (a power of two) fixed buckets: a catalog of millions in a bounded dict.

    Knuth's multiplicative hashing (the high bits of ``id * 2654435761 mod 2**32``), so neighbouring ids
    spread; the same id lands in the same bucket on every worker and every night.

    >>> item_buckets(np.array([1, 2, 1])).tolist()
    [632, 241, 632]
    """
    bits = int(buckets).bit_length() - 1
    if buckets <= 0 or 1 << bits != buckets:
        raise ValueError(f"buckets must be a power of two, got {buckets}")
    ids = np.asarray(item_ids, dtype=np.int64).astype(np.uint64)
    hashed = (ids * np.uint64(2654435761)) % np.uint64(2**32)
    return (hashed >> np.uint64(32 - bits)).astype(np.int64)
