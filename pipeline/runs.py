"""Every run on the record: one row per run in a small Delta table next to the output.

A nightly job is judged over many nights, so each run leaves a row in the
runs table (``run.runs_path``, default ``<sink.path>_runs``): who ran what,
on which ``ds``, with which resolved config (secrets redacted) and model, how
it ended (``ok``, or ``failed`` with the error class and message), its counts,
throughput, padding, per-batch metrics and the Delta version it wrote.

The row is written twice from the driver with ``deltalake`` (no Spark job):
``started`` when the run begins, so a run that crashes half-way still leaves
a trace, then replaced in one MERGE by its final row. Recording is best
effort by design: a runs table that cannot be written prints a warning and
never turns a successful run into a failed one. The report
(:mod:`pipeline.report`) and MLflow logging (:mod:`pipeline.tracking`) read
what is recorded here.

The runner's whole use of this module::

    recorder = RunRecorder.begin(config, run_id=run_id, ds=ds, out=out)   # "started" row
    recorder.note(model_name=..., model_revision=..., spark=spark)         # as they become known
    recorder.end(summary=summary)  or  recorder.end(error=exc)              # final row, report, MLflow
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, TextIO

import pyarrow as pa

from pipeline.io.paths import is_local

if TYPE_CHECKING:
    from pipeline.config import JobConfig
    from pipeline.metrics import RunSummary

__all__ = [
    "RUNS_SCHEMA", "RunRecorder", "config_hash", "read_runs", "redact_config", "run_row", "spark_identity",
    "write_run_row",
]

REDACTED = "***"
# key names whose values are secrets: anywhere for the unambiguous words, as the last word for token/key
# (so max_new_tokens, token_budget and keep_columns stay readable)
_SECRET_KEY = re.compile(
    r"(password|passwd|secret|credential)|(^|[._-])(pwd|token|key|apikey|auth|authorization)$", re.IGNORECASE
)
_MESSAGE_CHARS = 4000
_WRITE_ATTEMPTS = 4

_TS = pa.timestamp("us", tz="UTC")
RUNS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("job", pa.string()), ("ds", pa.date32()),
    ("outcome", pa.string()),  # started | ok | failed
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
])


# ------------------------------------------------------------------ pure: redaction and the row


def redact_config(data: Any, env_paths: Iterable[str] = (), *, _where: str = "") -> Any:
    """``data`` (a config dict) with secrets replaced by ``***``.

    A value is a secret when it came from ``${VAR}`` (its key path is in
    ``env_paths``, as :func:`pipeline.config.build_config` records them) or
    when its key is named like one (password, secret, credential anywhere;
    token, key, pwd, auth as the last word).

    >>> redact_config({"sink": {"path": "s3://b/t"}, "spark": {"conf": {"fs.s3a.secret.key": "abc"}},
    ...                "batching": {"token_budget": 4096}}, {"sink.path"})
    {'sink': {'path': '***'}, 'spark': {'conf': {'fs.s3a.secret.key': '***'}}, 'batching': {'token_budget': 4096}}
    """
    env = env_paths if isinstance(env_paths, (set, frozenset)) else frozenset(env_paths)
    if isinstance(data, Mapping):
        out = {}
        for key, value in data.items():
            where = f"{_where}.{key}" if _where else str(key)
            secret = (where in env or bool(_SECRET_KEY.search(str(key)))) and value is not None
            out[key] = REDACTED if secret else redact_config(value, env, _where=where)
        return out
    if isinstance(data, list):
        return [REDACTED if f"{_where}[{i}]" in env else redact_config(v, env, _where=f"{_where}[{i}]")
                for i, v in enumerate(data)]
    return data


def config_hash(redacted: Mapping[str, Any]) -> str:
    """sha256 (16 hex digits) of the redacted config without ``run.ds``/``run.run_id``: same settings, same hash.

    >>> config_hash({"job": "a", "run": {"ds": "2026-01-01"}}) == config_hash({"job": "a", "run": {"ds": "2026-01-02"}})
    True
    """
    data = json.loads(json.dumps(redacted, default=str))
    run = data.get("run")
    if isinstance(run, dict):
        run.pop("ds", None)
        run.pop("run_id", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


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
    )
    if error is not None:
        row["error_class"] = f"{type(error).__module__}.{type(error).__qualname__}".removeprefix("builtins.")
        message = str(error)
        row["error_message"] = message if len(message) <= _MESSAGE_CHARS else message[:_MESSAGE_CHARS] + "…"
    if summary is not None:
        s = summary
        rest = s.to_dict()
        for key in ("samples", "batch_metrics", "status", "config"):
            rest.pop(key, None)
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
            summary_json=json.dumps(rest, default=str, sort_keys=True),
        )
    return row


# ------------------------------------------------------------------ the table


def write_run_row(path: str, row: Mapping[str, Any]) -> int:
    """Insert ``row``, or replace the row of its ``run_id``, in one Delta commit; returns the table version.

    Creates the table on first use. Concurrent runs writing the same runs table
    conflict only at commit time; the write is retried a few times.
    """
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    data = pa.Table.from_pylist([dict(row)], schema=RUNS_SCHEMA)
    for attempt in range(_WRITE_ATTEMPTS):
        try:
            if not DeltaTable.is_deltatable(path):
                _ensure_parent(path)
                write_deltalake(path, data, mode="append", description="sbi runs table")
                return DeltaTable(path).version()
            table = DeltaTable(path)
            (table.merge(source=data, predicate="t.run_id = s.run_id", source_alias="s", target_alias="t")
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
    """The rows of a runs table, oldest first (by ``started_at``), optionally one job's or one run's."""
    from deltalake import DeltaTable

    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
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


# ------------------------------------------------------------------ what the runner calls


class RunRecorder:
    """Records one run: a ``started`` row at :meth:`begin`, the final row, report and MLflow at :meth:`end`.

    Never raises from :meth:`begin`, :meth:`note` or :meth:`end`: a failure to
    record prints one warning line to ``out`` and the run goes on.
    """

    def __init__(self, config: "JobConfig", *, run_id: str, ds: dt.date, out: TextIO = sys.stdout,
                 started_at: dt.datetime | None = None) -> None:
        self.config, self.run_id, self.ds, self.out = config, run_id, ds, out
        self.started_at = started_at or dt.datetime.now(dt.timezone.utc)
        self.path = config.resolved_runs_path()
        # Written with deltalake from the driver, so, like the deltalake-backed sink, local or mounted paths
        # only: a remote URI is never tried (no credentials lookups, no traffic to cloud metadata endpoints).
        self.remote_skipped = self.path if self.path is not None and not is_local(self.path) else None
        if self.remote_skipped:
            self.path = None
        self.summary: "RunSummary | None" = None
        self.fields: dict[str, Any] = {}
        self.row: dict[str, Any] | None = None
        self.version: int | None = None

    @classmethod
    def begin(cls, config: "JobConfig", *, run_id: str, ds: dt.date, out: TextIO = sys.stdout) -> "RunRecorder":
        """Start recording: writes the ``started`` row."""
        recorder = cls(config, run_id=run_id, ds=ds, out=out)
        recorder._write("started")
        return recorder

    def note(self, *, spark: Any = None, **fields: Any) -> None:
        """Remember what becomes known during the run (``model_name``, ``model_revision``, the session)."""
        if spark is not None:
            app_id, master = spark_identity(spark)
            fields.update(spark_app_id=app_id, spark_master=master)
        self.fields.update(fields)

    def end(self, *, summary: "RunSummary | None" = None, error: BaseException | None = None) -> None:
        """Write the final row (``ok``, or ``failed`` with ``error``), then the report and MLflow if configured."""
        summary = summary or self.summary
        self._write("failed" if error is not None else "ok", summary=summary, error=error,
                    ended_at=dt.datetime.now(dt.timezone.utc))
        if self.row is None:
            return
        if self.version is not None and summary is not None:
            print(f"runs table              : {self.path} (version {self.version})", file=self.out, flush=True)
        elif self.remote_skipped and error is None:
            print(f"runs table              : not recorded: {self.remote_skipped} is remote; the runs table is "
                  "written with deltalake from the driver, so set run.runs_path to a local or mounted path",
                  file=self.out, flush=True)
        report_path = self.config.run.report_path
        if report_path:
            try:
                from pipeline.report import write_report

                write_report([self.row], report_path)
                print(f"[{self.config.job}] report: {report_path}", file=self.out, flush=True)
            except Exception as exc:  # noqa: BLE001 - the report is a by-product; the run stands
                self._warn("could not write the report", report_path, exc)
                report_path = None
        if self.config.run.mlflow is not None:
            try:
                from pipeline.tracking import log_run

                mlflow_run = log_run(self.row, self.config.run.mlflow, report_path=report_path)
                print(f"[{self.config.job}] " + (f"MLflow run {mlflow_run}" if mlflow_run else
                      "run.mlflow is set but mlflow is not installed here: nothing logged "
                      "(pip install mlflow-skinny)"), file=self.out, flush=True)
            except Exception as exc:  # noqa: BLE001
                self._warn("could not log to MLflow", self.config.run.mlflow.tracking_uri, exc)

    def _write(self, outcome: str, **kwargs: Any) -> None:
        try:
            self.row = run_row(config=self.config, run_id=self.run_id, ds=self.ds, started_at=self.started_at,
                               outcome=outcome, **self.fields, **kwargs)
        except Exception as exc:  # noqa: BLE001
            self._warn("could not build the runs-table row", self.path, exc)
            return
        if self.path is None:
            return  # a catalog sink without run.runs_path: the row exists only for the report/MLflow
        try:
            self.version = None
            self.version = write_run_row(self.path, self.row)
        except Exception as exc:  # noqa: BLE001 - recording must never fail the run
            self._warn(f"could not record the run ({outcome})", self.path, exc)

    def _warn(self, what: str, where: Any, exc: BaseException) -> None:
        print(f"[{self.config.job}] warning: {what} at {where}: {type(exc).__name__}: {exc} "
              "(the run itself is not affected; set run.runs_path to a writable location)", file=self.out, flush=True)
