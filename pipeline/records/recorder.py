"""What the runner calls to put a run on the record: the runs-table rows, then the report and MLflow.

The runner's whole use of this module::

    recorder = RunRecorder.begin(config, run_id=run_id, ds=ds, out=out)   # "started" row
    recorder.note(model_name=..., model_revision=..., spark=spark)         # as they become known
    recorder.flush()                                                        # a started row that waited
    recorder.end(summary=summary)  or  recorder.end(error=exc)              # final row, report, MLflow

A row that cannot be written fails the run under ``run.record: required`` (the default): the drift gate's
history, the report and ``--accept-drift`` all read the runs table, so a run that is not on it is not a run the
next night can be judged against. ``run.record: best_effort`` says so in a line and goes on. The report and
MLflow are by-products: their failures are lines, never errors.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config.redaction import scrub
from pipeline.errors import RecordError
from pipeline.core.logs import RunLog
from pipeline.report import write_report
from pipeline.records.runs import (refused_by_mount, run_row, spark_identity, through_spark, write_run_row,
                                   write_run_row_through_spark)
from pipeline.records.tracking import log_run

if TYPE_CHECKING:
    from pipeline.config import JobConfig
    from pipeline.core.run_summary import RunSummary

__all__ = ["RunRecorder"]


class RunRecorder:
    """Records one run: a ``started`` row at :meth:`begin`, the final row, report and MLflow at :meth:`end`.

    The rows go with deltalake from the driver, or through the run's Spark session and its Delta connector where
    deltalake cannot commit (:func:`pipeline.records.runs.through_spark`: ``abfss://``, a Unity Catalog Volume, or a
    mount that refused deltalake's commit): such a ``started`` row waits for the session and the pre-flight
    (:meth:`flush`), before any Spark work. Under ``run.record: required`` a row that cannot be written raises
    :class:`RecordError` (never while the run already fails: that row's failure is a line), else it logs one
    warning line (to the run's ``log``, else to ``out``: :class:`pipeline.core.logs.RunLog`) and the run goes on.
    """

    def __init__(self, config: "JobConfig", *, run_id: str, ds: dt.date, out: TextIO | None = None,
                 started_at: dt.datetime | None = None, log: RunLog | None = None) -> None:
        self.config, self.run_id, self.ds = config, run_id, ds
        self.log = log or RunLog(job=config.job, run_id=run_id, out=out, fmt=config.run.log_format)
        self.started_at = started_at or dt.datetime.now(dt.timezone.utc)
        self.path = config.resolved_runs_path()
        self.required = config.run.record == "required"
        # why the rows go through the run's Spark session (its Delta connector); None: with deltalake
        self.via_spark = through_spark(self.path) if self.path is not None else None
        self.pending = False  # a row waits for the session (via_spark, no session yet)
        self.failure: str | None = None  # why the last row could not be written
        self.summary: "RunSummary | None" = None
        self.session: Any = None  # the run's Spark session, once it has one (a stop cancels its jobs)
        self.fields: dict[str, Any] = {}
        self.row: dict[str, Any] | None = None
        self.version: int | None = None

    @classmethod
    def begin(cls, config: "JobConfig", *, run_id: str, ds: dt.date, out: TextIO | None = None,
              log: RunLog | None = None) -> "RunRecorder":
        """Start recording: writes the ``started`` row (or keeps it for the session, :meth:`note`)."""
        recorder = cls(config, run_id=run_id, ds=ds, out=out, log=log)
        recorder._write("started")
        return recorder

    def next_run(self, run_id: str) -> None:
        """Record the next run of the same job from now on (a streaming job's next interval of micro-batches):
        its ``started`` row, under ``run_id``; what :meth:`note` learnt (the model, the session) carries over."""
        self.run_id, self.started_at = run_id, dt.datetime.now(dt.timezone.utc)
        self.summary, self.row, self.version = None, None, None
        self.log.run_id = run_id
        self._write("started")

    def note(self, *, spark: Any = None, **fields: Any) -> None:
        """Remember what becomes known during the run (``model_name``, ``model_revision``, the session)."""
        if spark is not None:
            self.session = spark
            app_id, master = spark_identity(spark)
            fields.update(spark_app_id=app_id, spark_master=master)
        self.fields.update(fields)

    def flush(self) -> None:
        """Write the ``started`` row that waited for the session (:attr:`via_spark`), once the run has it and has
        passed its pre-flight: before any Spark work. Nothing to do when it was written at :meth:`begin`."""
        if self.pending:
            self._write("started")

    def end(self, *, summary: "RunSummary | None" = None, error: BaseException | None = None) -> None:
        """Write the final row (``ok``; ``failed`` with ``error``; ``stopped`` when a SIGTERM stopped it; ``refused``
        when the drift gate did; ``submitted`` when a served model's batches are still at the provider), then the
        report and MLflow if configured.

        Raises :class:`RecordError` when the row of a run that ended without an error could not be written and
        ``run.record`` is ``required`` (after the report and MLflow: what the run committed stands)."""
        from pipeline.errors import DriftRefused, RunStopped

        summary = summary or self.summary
        # a run stopped by SIGTERM or by its token budget is resumable, not broken: "stopped"
        stopped = isinstance(error, RunStopped) or (error is not None and type(error).__name__ == "TokenBudgetReached")
        # a served model's batches still at the provider (--submit-only): nothing committed, collected by a rerun
        pending = error is None and summary is not None and bool(summary.batch_api.get("pending_reason"))
        outcome = ("refused" if isinstance(error, DriftRefused) else "stopped" if stopped
                   else "failed" if error is not None else "submitted" if pending else "ok")
        self._write(outcome, raising=False, summary=summary, error=error, ended_at=dt.datetime.now(dt.timezone.utc))
        if self.row is None:
            return
        if self.version is not None and summary is not None:
            self.log.line(f"runs table              : {self.path} (version {self.version})")
        elif self.failure and error is None and not self.required:
            self.log.line(f"runs table              : not recorded at {self.path}: {self.failure}")
        self._by_products()
        if self.failure and error is None and self.required:
            committed = (f"the run's output is committed ({summary.output}, version {summary.delta_version}), but "
                         if summary is not None and summary.delta_version is not None else "")
            raise RecordError(f"{committed}its row in the runs table {self.path} could not be written: "
                              f"{self.failure}. The drift gate's history, the report and --accept-drift read that "
                              "table; " + _what_to_do())

    def _by_products(self) -> None:
        """The report and MLflow, from the row: their failures are lines, never errors."""
        report_path = self.config.run.report_path
        if report_path:
            try:
                write_report([self.row], report_path)
                self.log.line(f"[{self.config.job}] report: {report_path}")
            except Exception as exc:  # noqa: BLE001 - the report is a by-product; the run stands
                self._warn("could not write the report", report_path, exc)
                report_path = None
        if self.config.run.mlflow is not None:
            try:
                mlflow_run = log_run(self.row, self.config.run.mlflow, report_path=report_path)
                self.log.line(f"[{self.config.job}] " + (f"MLflow run {mlflow_run}" if mlflow_run else
                              "run.mlflow is set but mlflow is not installed here: nothing logged "
                              "(pip install mlflow-skinny)"))
            except Exception as exc:  # noqa: BLE001
                self._warn("could not log to MLflow", self.config.run.mlflow.tracking_uri, exc)

    def _write(self, outcome: str, *, raising: bool = True, **kwargs: Any) -> None:
        """Build the row and write it; a failure raises :class:`RecordError` when ``raising`` and the row is
        required, else it is a warning line (and :attr:`failure` says why)."""
        try:
            self.row = run_row(config=self.config, run_id=self.run_id, ds=self.ds, started_at=self.started_at,
                               outcome=outcome, **self.fields, **kwargs)
        except Exception as exc:  # noqa: BLE001
            self._warn("could not build the runs-table row", self.path, exc)
            return
        if self.path is None:
            return  # a catalog sink without run.runs_path or run.state_path: the row exists only for the report
        self.version, self.failure = None, None
        if self.via_spark and self.session is None and outcome == "started":
            self.pending = True  # written through the session, once the run has one (before any Spark work)
            return
        try:
            self.version = self._commit()
            self.pending = False
        except Exception as exc:  # noqa: BLE001 - what to do with it is run.record's
            if self.via_spark is None and refused_by_mount(exc):
                # this mount refuses deltalake's commit (a hard link, a rename): the connector writes the rows
                self.via_spark = f"the mount refused deltalake's commit ({_first_line(exc)})"
                self._write(outcome, raising=raising, **kwargs)
                return
            self.failure = scrub(_first_line(exc), self.config.secret_values())
            if raising and self.required:
                raise RecordError(f"could not write the {outcome!r} row of run {self.run_id} to the runs table "
                                  f"{self.path}: {self.failure}. Nothing was run; " + _what_to_do()) from exc
            self._warn(f"could not record the run ({outcome})", self.path, exc,
                       "(run.record: best_effort, the run goes on unrecorded)" if not self.required else "")

    def _commit(self) -> int | None:
        """Write :attr:`row`: with deltalake, or through the session's Delta connector (:attr:`via_spark`)."""
        assert self.path is not None and self.row is not None
        if not self.via_spark:
            return write_run_row(self.path, self.row)
        session = self.session or _active_session()
        if session is None:
            raise RecordError(f"it is written through the run's Spark session ({self.via_spark}), and the run "
                              "ended before it had one")
        from pipeline.io.paths import connector_hint
        from pipeline.io.sources import has_delta_connector

        if not has_delta_connector(session):
            raise RecordError(f"it is written through the Delta connector ({self.via_spark}), which this session "
                              f"lacks; add it ({connector_hint()})")
        return write_run_row_through_spark(session, self.path, self.row)

    def _warn(self, what: str, where: Any, exc: BaseException, tail: str = "(the run itself is not affected)") -> None:
        text = scrub(str(exc), self.config.secret_values())
        self.log.warning(f"[{self.config.job}] warning: {what} at {where}: {type(exc).__name__}: {text}"
                         + (f" {tail}" if tail else ""))


def _what_to_do() -> str:
    return ("set run.runs_path (or run.state_path) to a location this run can write: a local disk or s3:// with "
            "deltalake, any path the Delta connector reaches through the run's session (a Unity Catalog Volume, "
            "abfss://), or set run.record: best_effort to run unrecorded")


def _first_line(exc: BaseException) -> str:
    """``Class: first line`` of ``exc`` (our own errors: the line alone, it says what it is)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return line if isinstance(exc, RecordError) else f"{type(exc).__name__}: {line}".rstrip(": ")


def _active_session() -> Any:
    """The process's active Spark session (a notebook's), or None; never starts one."""
    try:
        from pyspark.sql import SparkSession

        return SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - no pyspark, or no session
        return None
