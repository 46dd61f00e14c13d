"""What the runner calls to put a run on the record: the runs-table rows, then the report and MLflow.

The runner's whole use of this module::

    recorder = RunRecorder.begin(config, run_id=run_id, ds=ds, out=out)   # "started" row
    recorder.note(model_name=..., model_revision=..., spark=spark)         # as they become known
    recorder.end(summary=summary)  or  recorder.end(error=exc)              # final row, report, MLflow

Recording is best effort: it never turns a successful run into a failed one.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any, TextIO

from pipeline.config.redaction import scrub
from pipeline.io.stores import unreachable_reason
from pipeline.logs import RunLog
from pipeline.report import write_report
from pipeline.runs import run_row, spark_identity, write_run_row
from pipeline.tracking import log_run

if TYPE_CHECKING:
    from pipeline.config import JobConfig
    from pipeline.summary import RunSummary

__all__ = ["RunRecorder"]


class RunRecorder:
    """Records one run: a ``started`` row at :meth:`begin`, the final row, report and MLflow at :meth:`end`.

    Never raises from :meth:`begin`, :meth:`note` or :meth:`end`: a failure to
    record logs one warning line (to the run's ``log``, else to ``out``: :class:`pipeline.logs.RunLog`) and the
    run goes on.
    """

    def __init__(self, config: "JobConfig", *, run_id: str, ds: dt.date, out: TextIO | None = None,
                 started_at: dt.datetime | None = None, log: RunLog | None = None) -> None:
        self.config, self.run_id, self.ds = config, run_id, ds
        self.log = log or RunLog(job=config.job, run_id=run_id, out=out, fmt=config.run.log_format)
        self.started_at = started_at or dt.datetime.now(dt.timezone.utc)
        self.path = config.resolved_runs_path()
        # Written with deltalake from the driver, so where the deltalake writer reaches: local or mounted paths
        # and S3. Another store (gs://, abfss://) is never tried (no credentials lookups, no traffic to it).
        self.remote_skipped = self.path if self.path is not None and unreachable_reason(self.path) else None
        if self.remote_skipped:
            self.path = None
        self.summary: "RunSummary | None" = None
        self.session: Any = None  # the run's Spark session, once it has one (a stop cancels its jobs)
        self.fields: dict[str, Any] = {}
        self.row: dict[str, Any] | None = None
        self.version: int | None = None

    @classmethod
    def begin(cls, config: "JobConfig", *, run_id: str, ds: dt.date, out: TextIO | None = None,
              log: RunLog | None = None) -> "RunRecorder":
        """Start recording: writes the ``started`` row."""
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

    def end(self, *, summary: "RunSummary | None" = None, error: BaseException | None = None) -> None:
        """Write the final row (``ok``; ``failed`` with ``error``; ``stopped`` when a SIGTERM stopped it; ``refused``
        when the drift gate did; ``submitted`` when a served model's batches are still at the provider), then the
        report and MLflow if configured."""
        from pipeline.errors import DriftRefused, RunStopped

        summary = summary or self.summary
        # a run stopped by SIGTERM or by its token budget is resumable, not broken: "stopped"
        stopped = isinstance(error, RunStopped) or (error is not None and type(error).__name__ == "TokenBudgetReached")
        # a served model's batches still at the provider (--submit-only): nothing committed, collected by a rerun
        pending = error is None and summary is not None and bool(summary.batch_api.get("pending_reason"))
        outcome = ("refused" if isinstance(error, DriftRefused) else "stopped" if stopped
                   else "failed" if error is not None else "submitted" if pending else "ok")
        self._write(outcome, summary=summary, error=error, ended_at=dt.datetime.now(dt.timezone.utc))
        if self.row is None:
            return
        if self.version is not None and summary is not None:
            self.log.line(f"runs table              : {self.path} (version {self.version})")
        elif self.remote_skipped and error is None:
            self.log.line(f"runs table              : not recorded at {self.remote_skipped}: the runs table is "
                          f"written with deltalake from the driver, and {unreachable_reason(self.remote_skipped)}; "
                          "set run.runs_path to one of those")
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
        text = scrub(str(exc), self.config.secret_values())
        self.log.warning(f"[{self.config.job}] warning: {what} at {where}: {type(exc).__name__}: {text} "
                         "(the run itself is not affected; set run.runs_path to a writable location)")
