"""The runner's guarantees, checked in Spark: identity-level completeness and the error budget.

A count says "rows in = rows out + rows quarantined" even when one row was
lost and another written twice. These checks compare *identities*: the
multiset of ``(id, content_hash)`` keys of the input against the keys of the
scored (or committed) rows, with a full outer join of per-key counts, so a
lost row and a duplicated one are both named. The join is null-safe: with
``source.unique_ids: false`` an id may be null, and a null id is a key like
any other.

Everything runs as Spark aggregations; only the totals (one row) and, on a
mismatch, a small sample of the differing keys reach the driver::

    in_keys = key_counts(inputs, id_column="id").persist()
    check = identity_check(in_keys, key_counts(scored, id_column="doc_id", status_column="status"))
    if not check.ok:
        raise JobError(check.describe())

That join reads the input a second time, so a run pays it only when the cheap form disagrees: the
input's :class:`~pipeline.core.rows.KeyTally` observed as the scoring pass reads it
(:func:`observe_input_tally`) against the scored rows' tallies, written and quarantined, taken in the
same pass (:func:`scored_totals`, which also brings the tasks' counts home). Equal tallies mean the same
multiset of keys but for a 2**-64 chance; unequal ones (a lost row, a duplicated one, a retried stage
counted twice) run the join above, which names the keys.

:func:`error_budget` is pure: it decides whether a run's failed rows are too
many to commit (``run.max_error_fraction``, ``run.max_errors``);
:func:`top_errors` finds the most common messages to show when they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.core.rows import KEY_SEPARATOR, QUARANTINED_STATUSES, KeyTally

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ErrorBudget", "IdentityCheck", "InputTally", "ScoredTotals", "error_budget", "identity_check",
           "key_counts", "key_hash_halves", "observe_input_tally", "scored_totals", "tally_of", "top_errors"]

# the grouped key columns every key_counts frame has
KEY_ID, KEY_HASH, KEY_N, KEY_ERRORS = "_key_id", "_key_hash", "_key_n", "_key_errors"


def key_counts(df: "DataFrame", *, id_column: str, hash_column: str = "content_hash",
               status_column: str | None = None) -> "DataFrame":
    """Rows per ``(id, content hash)`` key of ``df`` (lazy), plus failed rows per key when ``status_column`` is given.

    Columns: ``_key_id``, ``_key_hash``, ``_key_n`` and ``_key_errors`` (rows whose status is quarantined,
    ``error`` or ``malformed``; 0 without
    a status column). Group-by treats null ids as one key, as the null-safe join in :func:`identity_check` does.
    """
    from pyspark.sql import functions as F

    errors = (F.sum(F.when(F.col(status_column).isin(*QUARANTINED_STATUSES), 1).otherwise(0)) if status_column
              else F.lit(0)).cast("long")
    return (df.select(F.col(id_column).cast("string").alias(KEY_ID), F.col(hash_column).alias(KEY_HASH),
                      *([F.col(status_column)] if status_column else []))
            .groupBy(KEY_ID, KEY_HASH)
            .agg(F.count(F.lit(1)).alias(KEY_N), errors.alias(KEY_ERRORS)))


@dataclass(frozen=True)
class IdentityCheck:
    """The input keys against the scored (or written) keys; every count is of rows unless it says keys.

    ``missing``: input rows with no scored row for their key; ``extra``: scored rows beyond their key's
    input rows (keys not in the input, or written more often than read); ``duplicated_keys``: keys of the
    input held more often than the input holds them. ``sample``: up to a few differing keys,
    ``{"id", "content_hash", "rows_in", "rows_out"}``.
    """

    rows_in: int
    rows_out: int
    keys_in: int
    keys_out: int
    missing: int
    extra: int
    duplicated_keys: int
    errors: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every input row has exactly one scored row of its key, and nothing else was scored."""
        return self.missing == 0 and self.extra == 0

    def describe(self, *, what: str = "scored") -> str:
        """One line naming what differs and a sample of the keys, e.g. for a :class:`JobError`.

        >>> check = IdentityCheck(3, 3, 3, 2, missing=1, extra=1, duplicated_keys=1,
        ...                       sample=[{"id": "a", "content_hash": "h", "rows_in": 1, "rows_out": 0}])
        >>> print(*check.describe().split("; "), sep="|")  # doctest: +NORMALIZE_WHITESPACE
        3 rows in (3 distinct (id, content_hash) keys) but 3 scored (2 distinct): 1 input row(s) missing,
        1 extra row(s), 1 key(s) held more often than in the input|ids that differ: 'a' (in 1, scored 0)
        """
        parts = []
        if self.missing:
            parts.append(f"{self.missing} input row(s) missing")
        if self.extra:
            parts.append(f"{self.extra} extra row(s)")
        if self.duplicated_keys:
            parts.append(f"{self.duplicated_keys} key(s) held more often than in the input")
        shown = ", ".join(f"{s['id']!r} (in {s['rows_in']}, {what} {s['rows_out']})" for s in self.sample)
        return (f"{self.rows_in} rows in ({self.keys_in} distinct (id, content_hash) keys) but {self.rows_out} "
                f"{what} ({self.keys_out} distinct): {', '.join(parts) or 'no difference'}"
                + (f"; ids that differ: {shown}" if shown else ""))


def identity_check(in_keys: "DataFrame", out_keys: "DataFrame", *, sample: int = 5) -> IdentityCheck:
    """Compare two :func:`key_counts` frames key by key: one Spark action, a second only on a mismatch.

    The full outer join on ``(id, content_hash)`` is null-safe on the id. A key
    counts as missing or extra by how many rows it lacks or has beyond its
    input rows, so one lost row plus one duplicated row shows as 1 missing +
    1 extra although the totals agree.
    """
    from pyspark.sql import functions as F

    i = in_keys.select(F.col(KEY_ID).alias("_i_id"), F.col(KEY_HASH).alias("_i_hash"), F.col(KEY_N).alias("_n_in"))
    o = out_keys.select(F.col(KEY_ID).alias("_o_id"), F.col(KEY_HASH).alias("_o_hash"),
                        F.col(KEY_N).alias("_n_out"), F.col(KEY_ERRORS).alias("_errors"))
    joined = i.join(o, on=(F.col("_i_id").eqNullSafe(F.col("_o_id"))) & (F.col("_i_hash") == F.col("_o_hash")),
                    how="full_outer")
    n_in, n_out = F.coalesce(F.col("_n_in"), F.lit(0)), F.coalesce(F.col("_n_out"), F.lit(0))
    keyed = joined.select(
        F.when(F.col("_n_in").isNotNull(), F.col("_i_id")).otherwise(F.col("_o_id")).alias("id"),
        F.coalesce(F.col("_i_hash"), F.col("_o_hash")).alias("content_hash"),
        n_in.alias("rows_in"), n_out.alias("rows_out"), F.coalesce(F.col("_errors"), F.lit(0)).alias("errors"),
    )

    def long_sum(col: Any) -> Any:
        return F.coalesce(F.sum(col), F.lit(0)).cast("long")

    totals = keyed.agg(
        long_sum(F.col("rows_in")).alias("rows_in"), long_sum(F.col("rows_out")).alias("rows_out"),
        long_sum((F.col("rows_in") > 0).cast("int")).alias("keys_in"),
        long_sum((F.col("rows_out") > 0).cast("int")).alias("keys_out"),
        long_sum(F.greatest(F.col("rows_in") - F.col("rows_out"), F.lit(0))).alias("missing"),
        long_sum(F.greatest(F.col("rows_out") - F.col("rows_in"), F.lit(0))).alias("extra"),
        long_sum(((F.col("rows_in") > 0) & (F.col("rows_out") > F.col("rows_in"))).cast("int")).alias("duplicated"),
        long_sum(F.col("errors")).alias("errors"),
    ).first()
    rows = [] if totals is None else [int(totals[k] or 0) for k in
                                      ("rows_in", "rows_out", "keys_in", "keys_out", "missing", "extra",
                                       "duplicated", "errors")]
    rows_in, rows_out, keys_in, keys_out, missing, extra, duplicated, errors = rows or [0] * 8
    shown: list[dict[str, Any]] = []
    if missing or extra:
        differing = keyed.where(F.col("rows_in") != F.col("rows_out")).orderBy(F.col("id").asc_nulls_first())
        shown = [{"id": r["id"], "content_hash": r["content_hash"], "rows_in": int(r["rows_in"]),
                  "rows_out": int(r["rows_out"])} for r in differing.limit(sample).collect()]
    return IdentityCheck(rows_in, rows_out, keys_in, keys_out, missing, extra, duplicated, errors, shown)


def _quoted(name: str) -> str:
    """A column name as SQL text (backquoted)."""
    return "`" + name.replace("`", "``") + "`"


def key_hash_halves(id_column: str, hash_column: str) -> tuple[str, str]:
    """The high and low 32 bits of a key's 64-bit hash as SQL expressions of two long values: what
    :meth:`pipeline.core.rows.KeyTally.of_keys` computes in Python (sha256 of ``s:<id>`` or ``n``, the separator and
    the content hash), so Spark's tallies and a writer's agree. SQL text, parsed by Spark in one call per
    aggregate: built of ``functions`` calls, a run's tallies took some 150 py4j round trips (0.1 s a run on
    a classic session).

    >>> hi, lo = key_hash_halves("doc`id", "content_hash")
    >>> "cast(`doc``id` as string)" in hi and hi.replace("1, 8", "9, 8") == lo
    True
    """
    text = (f"concat(coalesce(concat('s:', cast({_quoted(id_column)} as string)), 'n'), chr({ord(KEY_SEPARATOR)}), "
            f"coalesce(cast({_quoted(hash_column)} as string), 'null'))")
    digest = f"sha2({text}, 256)"
    return (f"cast(conv(substring({digest}, 1, 8), 16, 10) as bigint)",
            f"cast(conv(substring({digest}, 9, 8), 16, 10) as bigint)")


def _tally_columns(id_column: str, hash_column: str, *, where: str | None = None, prefix: str = "") -> list[Any]:
    """Three aggregate columns, ``<prefix>rows``, ``<prefix>hi``, ``<prefix>lo``: the rows (where the SQL condition
    ``where`` holds) and the sums of their hashes' halves, as decimals (no sum of 32-bit halves overflows them)."""
    from pyspark.sql import functions as F

    hi, lo = key_hash_halves(id_column, hash_column)
    one = "1"
    if where is not None:
        hi, lo, one = (f"case when {where} then {c} end" for c in (hi, lo, one))
    return [F.expr(f"cast(coalesce(sum({one}), 0) as bigint)").alias(f"{prefix}rows"),
            F.expr(f"sum(cast({hi} as decimal(20,0)))").alias(f"{prefix}hi"),
            F.expr(f"sum(cast({lo} as decimal(20,0)))").alias(f"{prefix}lo")]


def tally_of(row: Any, prefix: str = "") -> KeyTally:
    """The :class:`KeyTally` in a row of :func:`_tally_columns`."""
    return KeyTally.of_halves(row[f"{prefix}rows"], row[f"{prefix}hi"], row[f"{prefix}lo"])


class InputTally:
    """The input's :class:`KeyTally`, observed while the scoring pass reads it (:func:`observe_input_tally`)."""

    def __init__(self, observation: Any) -> None:
        self.observation = observation

    def get(self, *, wait_s: float = 10.0) -> KeyTally | None:
        """The tally once the pass ran; None when it was not observed (then the exact join decides)."""
        from pipeline.spark.run_metrics import observed_row

        row = observed_row(self.observation, wait_s)
        if not row or row.get("rows") is None:
            return None
        return tally_of(row)


def observe_input_tally(inputs: "DataFrame", *, id_column: str = "id",
                        hash_column: str = "content_hash") -> tuple["DataFrame", InputTally]:
    """``(inputs, tally)``: ``inputs`` observed for its keys' :class:`KeyTally` (filled by the first action
    that reads them: the scoring pass, no job of its own)."""
    from pyspark.sql import Observation

    import uuid

    # one name per observation: a plan holding two (the rows to write, observed again above the input's) needs both
    observation = Observation(f"sbi_tally_{uuid.uuid4().hex[:12]}")
    observed = inputs.observe(observation, *_tally_columns(id_column, hash_column))
    return observed, InputTally(observation)


@dataclass(frozen=True)
class ScoredTotals:
    """What the scoring pass brought home: the tallies of the rows for the output and for the quarantine, and
    the tasks' counts as JSON (the metrics column's values)."""

    written: KeyTally
    quarantined: KeyTally
    metrics: list[str]

    @property
    def errors(self) -> int:
        return self.quarantined.rows

    @property
    def total(self) -> KeyTally:
        return self.written + self.quarantined


def scored_totals(scored: "DataFrame", *, id_column: str, hash_column: str = "content_hash",
                  status_column: str = "status", metrics_column: str | None = None) -> ScoredTotals:
    """One Spark action over ``scored`` (the scoring pass itself when ``scored`` is persisted and not computed
    yet): the tallies of its rows to write and to quarantine, and its tasks' counts."""
    from pyspark.sql import functions as F

    statuses = ", ".join(f"'{status}'" for status in QUARANTINED_STATUSES)  # plain words: no quote to escape
    failed = f"coalesce({_quoted(status_column)} in ({statuses}), false)"
    columns = [*_tally_columns(id_column, hash_column, where=f"not {failed}", prefix="w_"),
               *_tally_columns(id_column, hash_column, where=failed, prefix="q_")]
    if metrics_column:  # one string: Spark 4.0's Connect server cannot return an array of them
        columns.append(F.concat_ws("\n", F.collect_list(F.col(metrics_column))).alias("metrics"))
    row = scored.agg(*columns).first()
    metrics = [v for v in (row["metrics"] or "").split("\n") if v] if metrics_column else []
    return ScoredTotals(tally_of(row, "w_"), tally_of(row, "q_"), metrics)


@dataclass(frozen=True)
class ErrorBudget:
    """A run's failed rows against its budget; ``exceeded`` means: commit nothing."""

    errors: int
    rows: int
    max_fraction: float | None
    max_errors: int | None

    @property
    def fraction(self) -> float:
        return self.errors / self.rows if self.rows else 0.0

    @property
    def exceeded(self) -> bool:
        """Beyond ``max_errors`` rows, or beyond ``max_fraction`` of the rows (at the limit is within it)."""
        if self.max_errors is not None and self.errors > self.max_errors:
            return True
        return self.max_fraction is not None and self.rows > 0 and self.fraction > self.max_fraction

    def describe(self, top: list[tuple[str, int]] = ()) -> str:  # type: ignore[assignment]
        """What was over budget and the most common error messages.

        >>> print(*ErrorBudget(20, 20, 0.05, None).describe([("ValueError: bad", 20)]).split("; "), sep="|")
        ... # doctest: +NORMALIZE_WHITESPACE
        20 of 20 rows failed (100.0%), over the error budget (run.max_error_fraction 0.05)|most common
        errors: 20 x 'ValueError: bad'
        """
        limits = []
        if self.max_fraction is not None:
            limits.append(f"run.max_error_fraction {self.max_fraction:g}")
        if self.max_errors is not None:
            limits.append(f"run.max_errors {self.max_errors}")
        common = "; ".join(f"{n} x {_clip(message)!r}" for message, n in top)
        return (f"{self.errors} of {self.rows} rows failed ({self.fraction:.1%}), over the error budget "
                f"({', '.join(limits)})" + (f"; most common errors: {common}" if common else ""))


def error_budget(errors: int, rows: int, *, max_fraction: float | None, max_errors: int | None) -> ErrorBudget:
    """Whether ``errors`` failed rows out of ``rows`` are within budget (see :attr:`ErrorBudget.exceeded`).

    >>> error_budget(1, 20, max_fraction=0.05, max_errors=None).exceeded
    False
    >>> error_budget(2, 20, max_fraction=0.05, max_errors=None).exceeded
    True
    >>> error_budget(2, 1000, max_fraction=0.05, max_errors=1).exceeded
    True
    """
    return ErrorBudget(int(errors), int(rows), max_fraction, max_errors)


def top_errors(scored: "DataFrame", *, n: int = 3, status_column: str = "status",
               error_column: str = "error") -> list[tuple[str, int]]:
    """The ``n`` most common error messages of the failed rows, with their counts (one Spark action)."""
    from pyspark.sql import functions as F

    rows = (scored.where(F.col(status_column).isin(*QUARANTINED_STATUSES)).groupBy(error_column).count()
            .orderBy(F.col("count").desc(), F.col(error_column).asc_nulls_first()).limit(n).collect())
    return [(str(r[error_column]), int(r["count"])) for r in rows]


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
