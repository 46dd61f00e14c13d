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
"""

from __future__ import annotations

import enum

import pyarrow as pa

__all__ = [
    "ANSWER_COLUMN", "ERROR", "INVALID_ID", "INVALID_OUTPUT", "MALFORMED", "MALFORMED_COLUMN", "MALFORMED_ERROR", "MODEL_LINEAGE_COLUMNS",
    "NO_CONTENT", "OK", "QUARANTINED_STATUSES", "REQUEST_KEY_COLUMN", "SKIPPED_NULL", "STATUS_FIELDS", "Status",
    "TRUNCATED",
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
# batch API gave that request (a JSON line of pipeline.staging.batch_log's answers), joined to the row by key
# before the task parses it; neither is written anywhere.
REQUEST_KEY_COLUMN = "_sbi_request_key"
ANSWER_COLUMN = "_sbi_answer"

# Row statuses that go to the quarantine table instead of the output.
QUARANTINED_STATUSES = (ERROR, MALFORMED, INVALID_ID, INVALID_OUTPUT)

# The columns every task returns after its result columns.
STATUS_FIELDS = [
    pa.field("n_tokens", pa.int32()),
    pa.field("truncated", pa.bool_()),
    pa.field("status", pa.string()),
    pa.field("error", pa.string()),
]

# The lineage every scored row carries, whichever path scored it (run_job adds the run's own: run id, scored at):
# the model's name and revision and the task fingerprint (pipeline.fingerprint).
MODEL_LINEAGE_COLUMNS = ("model_name", "model_revision", "task_fingerprint")
