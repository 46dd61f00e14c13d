"""The row vocabulary: the status every scored row carries, and the columns that hold it.

Every task returns :data:`STATUS_FIELDS` after its result columns; the
runner sends the rows whose status is in :data:`QUARANTINED_STATUSES` to the
quarantine table and the rest to the output. This is the one place these
names are defined; tasks, the UDF glue, the checks and the runner import
them from here. A :class:`Status` is a ``str`` (``enum.StrEnum``): what is
stored in a table, a counter or a JSON summary is its value, unchanged.

>>> sorted(str(s) for s in QUARANTINED_STATUSES)
['error', 'invalid_id', 'invalid_output', 'malformed']
>>> [f.name for f in STATUS_FIELDS]
['n_tokens', 'truncated', 'status', 'error']
>>> Status.SKIPPED_NULL == "skipped_null", f"{Status.OK}", Status("invalid_image")
(True, 'ok', <Status.INVALID_IMAGE: 'invalid_image'>)

A row is keyed on ``(id, content_hash)``; a :class:`KeyTally` is the order-free tally of a multiset of keys
(its rows and the sum of a 64-bit hash of each key), so two sides that must hold the same rows are compared
by their tallies, and the exact key-by-key join runs only when those disagree. The Spark side computes the
same hash as a column (``pipeline.spark.checks.key_hash_halves``), the Delta writer per file in Python
(:meth:`KeyTally.of_keys`):

>>> a = KeyTally.of_keys(pa.array(["d1", None, "d3"]), pa.array(["h1", "h2", "h3"]))
>>> b = KeyTally.of_keys(pa.array([None, "d3"]), pa.array(["h2", "h3"])) + KeyTally.of_keys(pa.array(["d1"]),
...                                                                                         pa.array(["h1"]))
>>> a == b, a.rows, a == KeyTally.of_keys(pa.array(["d1", "d1", "d3"]), pa.array(["h1", "h1", "h3"]))
(True, 3, False)
>>> KeyTally.of_keys(pa.array([1, 2]), pa.array(["h1", "h2"])) == KeyTally.of_keys(pa.array(["1", "2"]),
...                                                                                  pa.array(["h1", "h2"]))
True
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "ANSWER_COLUMN", "ERROR", "INVALID_ID", "INVALID_OUTPUT", "KEY_SEPARATOR", "KeyTally", "MALFORMED", "MALFORMED_COLUMN",
    "MALFORMED_ERROR", "MODEL_LINEAGE_COLUMNS", "NO_CONTENT", "OK", "QUARANTINED_STATUSES", "REQUEST_KEY_COLUMN",
    "SKIPPED_NULL", "STATUS_FIELDS", "Status", "TRUNCATED",
]


class Status(enum.StrEnum):
    """A scored row's status (its ``status`` column)."""

    # Written to the output.
    OK = "ok"
    # Scored, but the input was cut to the model's length (the row's ``truncated`` flag is set too).
    TRUNCATED = "truncated"
    # The input was null: nothing to score.
    SKIPPED_NULL = "skipped_null"
    # The input was empty or blank.
    SKIPPED_EMPTY = "skipped_empty"
    # A row with text but nothing in it for the model (see pipeline.tasks._content).
    NO_CONTENT = "skipped_no_content"
    # An image that cannot be decoded (pipeline.images.decode): flagged, written to the output.
    INVALID_IMAGE = "invalid_image"
    # Quarantined, with the reason in the row's ``error``.
    # Scoring the row failed.
    ERROR = "error"
    # A source line that did not parse (JSON lines): quarantined with its raw text, never scored.
    MALFORMED = "malformed"
    # A row without an id: it cannot be keyed, so written to the output it would be written again every night.
    INVALID_ID = "invalid_id"
    # A model output that does not follow the task's output schema (the extract kind).
    INVALID_OUTPUT = "invalid_output"


# the short names the tasks use
OK, TRUNCATED, SKIPPED_NULL, NO_CONTENT = Status.OK, Status.TRUNCATED, Status.SKIPPED_NULL, Status.NO_CONTENT
ERROR, MALFORMED, INVALID_ID, INVALID_OUTPUT = Status.ERROR, Status.MALFORMED, Status.INVALID_ID, Status.INVALID_OUTPUT

MALFORMED_ERROR = ("malformed source line: Spark could not parse it as JSON; its raw text is kept in the "
                   "quarantine table's input column. Fix or drop the line at the source and rerun the day")
# The column that carries a JSON line Spark could not parse, raw, from the source to the task and the quarantine.
MALFORMED_COLUMN = "_malformed"

# A served model in batch mode (task.endpoint.mode batch): each row's request key, and the answer the provider's
# batch API gave that request (a JSON line of pipeline.journal.batch_log's answers), joined to the row by key
# before the task parses it; neither is written anywhere.
REQUEST_KEY_COLUMN = "_sbi_request_key"
ANSWER_COLUMN = "_sbi_answer"

# Row statuses that go to the quarantine table instead of the output.
QUARANTINED_STATUSES = (ERROR, MALFORMED, INVALID_ID, INVALID_OUTPUT)

STATUS_FIELDS = [
    pa.field("n_tokens", pa.int32()),
    pa.field("truncated", pa.bool_()),
    pa.field("status", pa.string()),
    pa.field("error", pa.string()),
]
"""The columns every task returns after its result columns (a task's ``output_schema`` ends with them): the
row's tokens, whether its input was cut, its :class:`Status` and, for a failed row, the error."""

# The lineage every scored row carries, whichever path scored it (run_job adds the run's own: run id, scored at):
# the model's name and revision and the task fingerprint (pipeline.config.fingerprint).
MODEL_LINEAGE_COLUMNS = ("model_name", "model_revision", "task_fingerprint")


# ---------------------------------------------------------------- the order-free key tally
# between a key's id and its content hash in the text a key is hashed as (ids and hex hashes never hold it)
KEY_SEPARATOR = "\x1f"
_MASK = (1 << 64) - 1


def _key_hash(id_text: str | None, content_hash: str | None) -> int:
    """The 64-bit hash of one key: the first 8 bytes of the sha256 of ``s:<id>`` (``n`` for a null id), the
    separator and the content hash (``null`` when missing), as Spark's ``sha2`` computes it too."""
    text = ("n" if id_text is None else "s:" + id_text) + KEY_SEPARATOR + ("null" if content_hash is None
                                                                           else content_hash)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@dataclass(frozen=True)
class KeyTally:
    """Rows and the sum (mod 2**64) of their keys' hashes: equal for two multisets of ``(id, content_hash)``
    keys that are equal, and (but for a 2**-64 chance) different when a row was lost, added or duplicated."""

    rows: int = 0
    hash: int = 0

    def __add__(self, other: "KeyTally") -> "KeyTally":
        return KeyTally(self.rows + other.rows, (self.hash + other.hash) & _MASK)

    def __sub__(self, other: "KeyTally") -> "KeyTally":
        return KeyTally(self.rows - other.rows, (self.hash - other.hash) & _MASK)

    @classmethod
    def of_halves(cls, rows: Any, hi: Any, lo: Any) -> "KeyTally":
        """From Spark's sums of the hashes' high and low 32 bits (sums that cannot overflow)."""
        return cls(int(rows or 0), ((int(hi or 0) << 32) + int(lo or 0)) & _MASK)

    @classmethod
    def of_keys(cls, ids: Any, hashes: Any) -> "KeyTally | None":
        """The tally of the keys in two Arrow arrays (ids, content hashes); None when the ids' type has no
        string form both Spark and Arrow agree on (strings, integers, booleans and dates do)."""
        import pyarrow.compute as pc

        kind = ids.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)
                or pa.types.is_boolean(kind) or pa.types.is_date(kind)):
            return None
        texts = pc.cast(ids, pa.string()).to_pylist()
        total = 0
        for id_text, content_hash in zip(texts, hashes.to_pylist()):
            total += _key_hash(id_text, content_hash)
        return cls(len(texts), total & _MASK)

    def to_text(self) -> str:
        """``rows:hash`` (what a commit records)."""
        return f"{self.rows}:{self.hash}"

    @classmethod
    def from_text(cls, text: Any) -> "KeyTally | None":
        """:meth:`to_text` read back; None for anything else."""
        try:
            rows, value = str(text).split(":")
            return cls(int(rows), int(value) & _MASK)
        except (TypeError, ValueError):
            return None
