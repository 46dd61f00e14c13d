"""Every run on the record: one row per run in a small Delta table next to the output.

A nightly job is judged over many nights, so each run leaves a row in the
runs table (``run.runs_path``, default ``<sink.path>_runs``): who ran what,
on which ``ds``, with which resolved config (secrets redacted) and model, how
it ended (``ok``, or ``failed`` with the error class and message), its counts,
throughput, padding, per-batch metrics, the Delta version it wrote, and the profile of its output with
the drift verdict against the job's recent runs (which later runs read as their history).

The row is written twice from the driver with ``deltalake`` (no Spark job), on a local or
mounted path or on S3 (``s3://``, ``s3a://``: delta-rs's object store with the settings of
:mod:`pipeline.io.stores`, every commit a conditional put):
``started`` when the run begins, so a run that crashes half-way still leaves
a trace, then replaced in one MERGE by its final row. Recording is best
effort by design: a runs table that cannot be written prints a warning and
never turns a successful run into a failed one. The report
(:mod:`pipeline.report`) and MLflow logging (:mod:`pipeline.tracking`) read
what is recorded here.

The runner records through :class:`pipeline.recorder.RunRecorder`, which
writes these rows and then the report and MLflow; this module knows neither.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from pipeline.compat import runtime_versions
from pipeline.config.redaction import redact_config, scrub
from pipeline.identity import config_hash
from pipeline.io.stores import delta_uri, is_table, open_table, storage_options

if TYPE_CHECKING:
    from pipeline.config import JobConfig
    from pipeline.summary import RunSummary

__all__ = [
    "RUNS_SCHEMA", "read_runs", "redact_config", "run_row", "spark_identity",
    "write_run_row",
]

_MESSAGE_CHARS = 4000
_WRITE_ATTEMPTS = 4

_TS = pa.timestamp("us", tz="UTC")
RUNS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("job", pa.string()), ("ds", pa.date32()),
    # started | ok | failed | stopped (SIGTERM or run.max_tokens: nothing committed, resumable) | refused (the drift
    # gate: nothing committed, the scored rows staged for --accept-drift) | submitted (a served model's batches are
    # at the provider, --submit-only: nothing committed, the same command again collects and commits)
    ("outcome", pa.string()),
    ("started_at", _TS), ("ended_at", _TS), ("seconds", pa.float64()),
    ("error_class", pa.string()), ("error_message", pa.string()),
    ("config_json", pa.string()), ("config_hash", pa.string()), ("task_kind", pa.string()),
    ("model_name", pa.string()), ("model_revision", pa.string()), ("precision", pa.string()),
    ("rows_in", pa.int64()), ("rows_out", pa.int64()), ("rows_flagged", pa.int64()),
    ("rows_quarantined", pa.int64()), ("status_counts", pa.string()),
    ("tokens", pa.int64()), ("padded_tokens", pa.int64()), ("padding_efficiency", pa.float64()),
    ("batches", pa.int64()), ("docs_per_s", pa.float64()), ("tokens_per_s", pa.float64()),
    ("model_loads", pa.int64()), ("workers", pa.int64()),
    ("spark_app_id", pa.string()), ("spark_master", pa.string()),
    ("output", pa.string()), ("delta_version", pa.int64()), ("writer", pa.string()),
    ("batch_metrics", pa.string()),  # JSON: see pipeline.metrics.batch_metrics
    ("summary_json", pa.string()),  # JSON: the rest of the RunSummary (retries, fallbacks, backend, ...)
    # JSON: what the driver ran with (pipeline.compat.runtime_versions); a table from before gains the column
    ("versions", pa.string()),
    # JSON: the output's profile (pipeline.sketches) and its drift verdict against the job's history
    # (pipeline.drift); a table from before gains the columns on its next write
    ("profile", pa.string()), ("drift", pa.string()),
    # JSON: a served model in batch mode: its batches, their states, tokens and the wait (RunSummary.batch_api)
    ("batch_api", pa.string()),
])


# ------------------------------------------------------------------ pure: the row


def run_row(
    *, config: "JobConfig", run_id: str, ds: dt.date, started_at: dt.datetime, outcome: str,
    ended_at: dt.datetime | None = None, summary: "RunSummary | None" = None, error: BaseException | None = None,
    model_name: str | None = None, model_revision: str | None = None,
    spark_app_id: str | None = None, spark_master: str | None = None,
) -> dict[str, Any]:
    """One runs-table row (a dict matching :data:`RUNS_SCHEMA`) from plain values. Pure."""
    redacted = redact_config(config.model_dump(mode="json"), getattr(config, "_env_paths", frozenset()))
    row: dict[str, Any] = {name: None for name in RUNS_SCHEMA.names}
    row.update(
        run_id=run_id, job=config.job, ds=ds, outcome=outcome, started_at=started_at, ended_at=ended_at,
        seconds=(ended_at - started_at).total_seconds() if ended_at else None,
        config_json=json.dumps(redacted, sort_keys=True), config_hash=config_hash(redacted),
        task_kind=config.task.kind, model_name=model_name or config.model.name,
        model_revision=model_revision, spark_app_id=spark_app_id, spark_master=spark_master,
        versions=json.dumps(summary.versions if summary is not None and summary.versions else runtime_versions(),
                            sort_keys=True),
    )
    if error is not None:
        row["error_class"] = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
        message = scrub(str(error), config.secret_values())
        row["error_message"] = message if len(message) <= _MESSAGE_CHARS else message[:_MESSAGE_CHARS] + "…"
        if getattr(error, "tokens", None) is not None:  # a run its token budget stopped: what it spent
            row["tokens"] = int(error.tokens)
        _quality_columns(row, getattr(error, "quality", None))  # a run the drift gate refused: what moved
    if summary is not None:
        s = summary
        rest = s.to_dict()
        for key in ("samples", "batch_metrics", "status", "config", "quality", "batch_api"):
            rest.pop(key, None)
        _quality_columns(row, s.quality)
        row.update(
            model_name=s.model_name, model_revision=s.model_revision,
            precision=",".join(sorted(s.precision_used)) or config.model.precision,
            rows_in=s.rows_in, rows_out=s.rows_out, rows_flagged=s.rows_flagged,
            rows_quarantined=s.rows_quarantined, status_counts=json.dumps(s.status, sort_keys=True),
            tokens=s.tokens, padded_tokens=s.padded_tokens, padding_efficiency=s.padding_efficiency,
            batches=s.batches, docs_per_s=s.docs_per_s, tokens_per_s=s.tokens_per_s,
            model_loads=sum(s.model_loads.values()), workers=len(s.model_loads),
            output=s.output, delta_version=s.delta_version, writer=s.writer,
            batch_metrics=json.dumps(s.batch_metrics, default=str),
            batch_api=json.dumps(s.batch_api, default=str, sort_keys=True) if s.batch_api else None,
            summary_json=json.dumps(rest, default=str, sort_keys=True),
        )
    return row


def _quality_columns(row: dict[str, Any], quality: Mapping[str, Any] | None) -> None:
    """The ``profile`` and ``drift`` columns of ``row`` from a run's quality record (left as they are without one)."""
    if quality:
        row["profile"] = json.dumps(quality.get("profile") or {}, sort_keys=True)
        row["drift"] = json.dumps(quality.get("drift") or {}, sort_keys=True)


# ------------------------------------------------------------------ the table


def write_run_row(path: str, row: Mapping[str, Any]) -> int:
    """Insert ``row``, or replace the row of its ``run_id``, in one Delta commit; returns the table version.

    ``path``: a local path or an S3 URI (:mod:`pipeline.io.stores` resolves its settings). Creates the
    table on first use. Concurrent runs writing the same runs table conflict only at commit time; the
    write is retried a few times. Two first runs that both create the table: the create runs without
    delta-rs's commit retries (which would commit the loser as a second table, a new table id, at the
    next version), so the loser fails and merges its row into the table that won (its data file stays
    in no version until ``VACUUM``).
    """
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    data = pa.Table.from_pylist([dict(row)], schema=RUNS_SCHEMA)
    options = storage_options(path)
    for attempt in range(_WRITE_ATTEMPTS):
        try:
            if not is_table(path, options=options or {}):
                _ensure_parent(path)
                write_deltalake(delta_uri(path), data, mode="append", description="sbi runs table",
                                storage_options=options, commit_properties=CommitProperties(max_commit_retries=0))
                return open_table(path, options=options or {}).version()
            table = open_table(path, options=options or {})
            # merge_schema: a runs table written by an older version gains the columns added since (versions,
            # profile, drift)
            (table.merge(source=data, predicate="t.run_id = s.run_id", source_alias="s", target_alias="t",
                         merge_schema=True)
             .when_matched_update_all().when_not_matched_insert_all().execute())
            return table.version()
        except (CommitFailedError, DeltaError) as exc:
            if attempt == _WRITE_ATTEMPTS - 1 or not _is_conflict(exc):
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _is_conflict(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("conflict", "commitfailed", "concurrent", "version already exists"))


def _ensure_parent(path: str) -> None:
    if "://" not in path:  # paths are URIs: only local paths get their folder made here
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def read_runs(path: str, *, job: str | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
    """The rows of a runs table (local or S3), oldest first (by ``started_at``), optionally one job's or one run's."""
    rows = open_table(path).to_pyarrow_table().to_pylist()
    if job is not None:
        rows = [r for r in rows if r["job"] == job]
    if run_id is not None:
        rows = [r for r in rows if r["run_id"] == run_id]
    return sorted(rows, key=lambda r: (r["started_at"] or dt.datetime.min.replace(tzinfo=dt.timezone.utc)))


def spark_identity(spark: Any) -> tuple[str | None, str | None]:
    """``(application id, master)`` of a classic or Spark Connect session; ``None`` where it will not say."""
    values = []
    for key in ("spark.app.id", "spark.master"):
        try:
            values.append(spark.conf.get(key, None))
        except Exception:  # noqa: BLE001 - Connect may refuse a key; the row just lacks it
            values.append(None)
    return values[0], values[1]
