"""Every run on the record: one row per run in a small Delta table next to the output.

A nightly job is judged over many nights, so each run leaves a row in the
runs table (``run.runs_path``; default ``<run.state_path>/<job>/runs``, else
``<sink.path>_runs``): who ran what,
on which ``ds``, with which resolved config (secrets redacted) and model, how
it ended (``ok``, or ``failed`` with the error class and message), its counts,
throughput, padding, per-batch metrics, the Delta version it wrote, and the profile of its output with
the drift verdict against the job's recent runs (which later runs read as their history).

The row is written twice from the driver, ``started`` when the run begins, so a run that crashes half-way
still leaves a trace, then replaced in one MERGE by its final row. Two ways, by where the table is:

- with ``deltalake`` (no Spark job) on a local or mounted path or on S3 (``s3://``, ``s3a://``: delta-rs's
  object store with the settings of :mod:`pipeline.io.stores`, every commit a conditional put);
- through the run's Spark session and its Delta connector (:func:`write_run_row_through_spark`) where
  deltalake cannot commit: another store (``abfss://``, ``gs://``), or a mount whose FUSE refuses the hard
  link (and rename) delta-rs's commit makes, "Function not implemented (os error 38)": a Unity Catalog
  Volume or DBFS (:data:`SPARK_MOUNTS`), which Spark reaches through the cloud store instead.

:func:`through_spark` says which. Whether a row that cannot be written fails the run is ``run.record``
(:class:`pipeline.records.recorder.RunRecorder`). The report (:mod:`pipeline.report`) and MLflow logging
(:mod:`pipeline.records.tracking`) read what is recorded here.

The runner records through :class:`pipeline.records.recorder.RunRecorder`, which
writes these rows and then the report and MLflow; this module knows neither.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pyarrow as pa

from pipeline.core.compat import runtime_versions
from pipeline.config.redaction import redact_config, scrub
from pipeline.config.identity import config_hash
from pipeline.io.stores import delta_uri, is_table, open_table, storage_options, unreachable_reason
from pipeline.core.locations import is_local, local_path, resolve_location

if TYPE_CHECKING:
    from pipeline.config import JobConfig
    from pipeline.core.run_summary import RunSummary

__all__ = [
    "RUNS_SCHEMA", "SPARK_MOUNTS", "read_runs", "redact_config", "refused_by_mount", "run_row", "spark_identity",
    "through_spark", "write_run_row", "write_run_row_through_spark",
]

# FUSE mounts of Databricks (a Unity Catalog Volume, DBFS): the driver's file calls go through a FUSE that refuses
# the hard link delta-rs's commit makes (and renames), while Spark reaches the same paths through the cloud store
SPARK_MOUNTS = ("/Volumes/", "/dbfs/")
# what a mount answers to a file operation it does not implement: ENOSYS (os error 38), EOPNOTSUPP (os error 95)
_MOUNT_REFUSALS = ("os error 38", "os error 95", "function not implemented", "operation not supported")

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
    ("batch_metrics", pa.string()),  # JSON: see pipeline.core.metrics.batch_metrics
    ("summary_json", pa.string()),  # JSON: the rest of the RunSummary (retries, fallbacks, backend, ...)
    # JSON: what the driver ran with (pipeline.core.compat.runtime_versions); a table from before gains the column
    ("versions", pa.string()),
    # JSON: the output's profile (pipeline.core.sketches) and its drift verdict against the job's history
    # (pipeline.core.drift); a table from before gains the columns on its next write
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


def through_spark(path: str) -> str | None:
    """Why the runs table at ``path`` is written through the run's Spark session (the Delta connector) and not
    with deltalake from the driver; None when deltalake writes it.

    >>> through_spark("/lake/scores_runs") is None, through_spark("s3a://lake/runs") is None
    (True, True)
    >>> print(through_spark("/Volumes/main/sbi/state/job/runs"))
    a Databricks FUSE mount (a Unity Catalog Volume or DBFS), where deltalake's commit is refused (os error 38)
    >>> through_spark("abfss://c@a.dfs.core.windows.net/runs").endswith("not abfss:")
    True
    """
    if reason := unreachable_reason(path):
        return reason
    if is_local(path) and (local_path(path) + "/").startswith(SPARK_MOUNTS):
        return ("a Databricks FUSE mount (a Unity Catalog Volume or DBFS), where deltalake's commit is refused "
                "(os error 38)")
    return None


def refused_by_mount(exc: BaseException) -> bool:
    """Whether ``exc`` is a mount refusing a file operation deltalake's commit needs (a hard link, a rename):
    ``Function not implemented (os error 38)`` or ``Operation not supported (os error 95)``."""
    text = str(exc).lower()
    return any(word in text for word in _MOUNT_REFUSALS)


def write_run_row_through_spark(spark: Any, path: str, row: Mapping[str, Any]) -> int | None:
    """:func:`write_run_row` through ``spark``'s Delta connector: insert ``row`` or replace its ``run_id``'s in one
    ``MERGE`` (schema evolution on: an older table gains the newer columns); a missing table is created by an
    append, and a run that loses that race merges. Returns the table's version after the write."""
    from pipeline.io.delta.connector import plain_string_types

    location = resolve_location(path)
    name = f"delta.`{location}`"
    # strings spelled plainly: a Connect session's "string collate UTF8_BINARY" is a type deltalake cannot read
    df = plain_string_types(spark.createDataFrame(pa.Table.from_pylist([dict(row)], schema=RUNS_SCHEMA)))
    view = f"sbi_run_row_{uuid.uuid4().hex[:12]}"
    df.createOrReplaceTempView(view)
    try:
        for attempt in range(_WRITE_ATTEMPTS):
            exists = _spark_table_exists(spark, name)
            try:
                if not exists:
                    df.write.format("delta").mode("append").save(location)
                else:
                    spark.sql(f"MERGE WITH SCHEMA EVOLUTION INTO {name} AS t USING {view} AS s ON t.run_id = s.run_id "
                              "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *").collect()
                break
            except Exception as exc:  # noqa: BLE001 - a concurrent commit, or another run's create, won: again
                lost_create = not exists and _spark_table_exists(spark, name)
                if attempt == _WRITE_ATTEMPTS - 1 or not (lost_create or _is_conflict(exc)):
                    raise
                time.sleep(0.2 * (attempt + 1))
    finally:
        spark.catalog.dropTempView(view)
    [latest] = spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").select("version").collect()
    return int(latest[0])


def _spark_table_exists(spark: Any, name: str) -> bool:
    try:
        spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()
        return True
    except Exception:  # noqa: BLE001 - no table there
        return False


def read_runs(path: str, *, job: str | None = None, run_id: str | None = None,
              spark: Any = None) -> list[dict[str, Any]]:
    """The rows of a runs table, oldest first (by ``started_at``), optionally one job's or one run's.

    Read with deltalake where it reaches the table (local, mounted, S3; a Volume's FUSE reads fine), else
    through ``spark``'s Delta connector when one is given (``abfss://``, ``gs://``, or a Volume path a
    Databricks Connect client does not mount)."""
    if spark is not None and (unreachable_reason(path) or not is_table(path)):
        table = spark.read.format("delta").load(resolve_location(path)).toArrow()
    else:
        table = open_table(path).to_pyarrow_table()
    rows = table.to_pylist()
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
