"""A run's messages through :mod:`logging`: the ``pipeline`` loggers, plain text by default, JSON lines on request.

Every line a run shows (``[job] run <id>: ...``, warnings, progress, the summary) is a log record of
the ``pipeline`` hierarchy, and every driver stage is an event record:

``pipeline.run``            the run's lines and warnings (``[job] run <id>: scoring ...``)
``pipeline.run.progress``   the progress lines while inference runs
``pipeline.run.stage``      one event per driver stage, with its seconds and counts (not shown as plain text)
``pipeline.run.summary``    the end-of-run summary (the text; the whole summary as an event)
``pipeline.<module>``       library warnings outside a run's lines (a session setting refused, the CLI's date)

Where the records go (:class:`RunLog`): with ``out`` given (``run_job(config, out=...)``) the run writes
its records there itself, in its format, and hands them to logging as well; without it, a process where
nothing handles the ``pipeline`` loggers (no handler on them or on the root logger: a spark-submit job, the
CLI) gets them on stdout, and one where logging is configured (a notebook, Airflow) gets them through its
own handlers only: the library never configures the root logger nor adds a handler to its loggers.
``run.log_format: json`` (``--log-json``) writes one JSON object per line (:class:`JsonFormatter`, which an
application can put on its own handler too); the fields are in ``docs/logging.md``.

>>> import io, json
>>> out = io.StringIO()
>>> log = RunLog(job="j", run_id="r1", out=out, fmt="json", clock=lambda: 0.0)
>>> log.line("[j] run r1: scoring 10 rows")
>>> log.stage("planning", 1.25, rows=10, tasks=2)
>>> [json.loads(line)["event"] for line in out.getvalue().splitlines()]
['message', 'stage']
>>> {k: v for k, v in json.loads(out.getvalue().splitlines()[1]).items() if k != "ts"}
{'level': 'INFO', 'logger': 'pipeline.run.stage', 'event': 'stage', 'job': 'j', 'run_id': 'r1', 'stage': 'planning', 'seconds': 1.25, 'rows': 10, 'tasks': 2}
>>> plain = io.StringIO()
>>> RunLog(job="j", run_id="r1", out=plain).stage("planning", 1.25)  # an event: no plain line
>>> plain.getvalue()
''
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import time
from typing import Any, Callable, Literal, Mapping, TextIO

__all__ = ["LOG_FORMATS", "LOGGER", "JsonFormatter", "LogFormat", "PlainFormatter", "RunLog", "handled"]

LOGGER = "pipeline"
LogFormat = Literal["plain", "json"]
LOG_FORMATS: tuple[str, ...] = ("plain", "json")

# what a run's records carry besides the message (LogRecord attributes, prefixed so no logging key is shadowed)
_EVENT, _JOB, _RUN_ID, _FIELDS, _PLAIN, _TEXT = ("sbi_event", "sbi_job", "sbi_run_id", "sbi_fields", "sbi_plain",
                                                 "sbi_text")


def handled(logger: logging.Logger) -> bool:
    """Whether a handler other than a ``NullHandler`` sits on ``logger`` or on a logger it propagates to:
    an application (a notebook, Airflow) configured logging, and the records go there."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


def _explicit_level(logger: logging.Logger) -> int:
    """The level set on ``logger`` or on one of its ``pipeline`` ancestors (root's not counted); INFO if none."""
    current: logging.Logger | None = logger
    while current is not None and current.name.split(".")[0] == LOGGER:
        if current.level != logging.NOTSET:
            return current.level
        current = current.parent
    return logging.INFO


class PlainFormatter(logging.Formatter):
    """The message as a user reads it (what the run printed before it logged), and an exception's traceback."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``event``, ``job``, ``run_id``, the event's
    fields, and ``message`` for the records that are text (a line, a warning, a progress line)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "event": getattr(record, _EVENT, "message"),
        }
        if hasattr(record, _JOB):
            data.update(job=getattr(record, _JOB), run_id=getattr(record, _RUN_ID))
        data.update(getattr(record, _FIELDS, None) or {})
        if getattr(record, _TEXT, True):
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def _shown_as_plain_text(record: logging.LogRecord) -> bool:
    return getattr(record, _PLAIN, True)


class RunLog:
    """One run's lines and events, as records of the ``pipeline.run`` loggers tagged with the job and run id.

    ``out``: where the run writes its records itself (see the module docstring); None: stdout when nothing
    handles the ``pipeline`` loggers, else only the application's handlers. ``fmt``: ``plain`` or ``json``.
    Safe to use from several threads (the progress line has its own).
    """

    def __init__(self, *, job: str, run_id: str | None = None, out: TextIO | None = None, fmt: str = "plain",
                 clock: Callable[[], float] = time.time) -> None:
        if fmt not in LOG_FORMATS:
            raise ValueError(f"log format {fmt!r} is not one of {LOG_FORMATS}")
        self.job, self.run_id, self.fmt, self.clock = job, run_id, fmt, clock
        self.explicit = out is not None
        self.stage_now: str | None = None  # the stage the run's Spark jobs belong to now (set by the stages)
        self.direct: logging.Handler | None = None
        if self.explicit or not handled(logging.getLogger(LOGGER)):
            self.direct = logging.StreamHandler(out if out is not None else sys.stdout)
            self.direct.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
            if fmt == "plain":
                self.direct.addFilter(_shown_as_plain_text)

    # ------------------------------------------------------------------ what the stages say

    def line(self, text: str, *, level: int = logging.INFO) -> None:
        """One line, as the user reads it (``[job] run <id>: ...``)."""
        self._emit("pipeline.run", level, text, event="message")

    def warning(self, text: str) -> None:
        self.line(text, level=logging.WARNING)

    def progress(self, text: str, fields: Mapping[str, Any] | None = None) -> None:
        """A progress line; ``fields`` (tasks done, rows, seconds) go into its JSON event."""
        self._emit("pipeline.run.progress", logging.INFO, text, event="progress", fields=fields)

    def stage(self, name: str, seconds: float, **counts: Any) -> None:
        """The event of a driver stage that ended: its wall seconds and what it counted (rows, tasks, version)."""
        facts = {k: v for k, v in counts.items() if v is not None}
        detail = "".join(f", {k} {v:,}" if isinstance(v, int) else f", {k} {v}" for k, v in facts.items())
        self._emit("pipeline.run.stage", logging.INFO, f"[{self.job}] run {self.run_id}: stage {name} took "
                   f"{seconds:.2f} s{detail}", event="stage",
                   fields={"stage": name, "seconds": round(seconds, 3), **facts}, plain=False, text=False)

    def summary(self, text: str, summary: Mapping[str, Any]) -> None:
        """The summary: its text as plain output, the whole summary (``RunSummary.to_dict``) as the event."""
        self._emit("pipeline.run.summary", logging.INFO, text, event="summary", fields={"summary": dict(summary)},
                   text=False)

    def failed(self, error: str, *, error_class: str, seconds: float) -> None:
        """The event of a run that failed (plain output leaves the error line to the caller, e.g. the CLI)."""
        self._emit("pipeline.run", logging.ERROR, f"[{self.job}] run {self.run_id} failed in stage "
                   f"{self.stage_now or 'prepare'}: {error}", event="run_failed",
                   fields={"stage": self.stage_now, "error_class": error_class, "error": error,
                           "seconds": round(seconds, 3)}, plain=False, text=False)

    # ------------------------------------------------------------------ where records go

    def _emit(self, name: str, level: int, msg: str, *, event: str, fields: Mapping[str, Any] | None = None,
              plain: bool = True, text: bool = True) -> None:
        logger = logging.getLogger(name)
        routed = handled(logger) and logger.isEnabledFor(level)
        direct = self.direct is not None and level >= _explicit_level(logger)
        if not (routed or direct):
            return
        record = logger.makeRecord(name, level, "(run)", 0, msg, (), None, extra={
            _EVENT: event, _JOB: self.job, _RUN_ID: self.run_id, _FIELDS: dict(fields or {}), _PLAIN: plain,
            _TEXT: text})
        record.created = self.clock()
        if direct:
            self.direct.handle(record)  # type: ignore[union-attr]
        if routed:
            logger.handle(record)
