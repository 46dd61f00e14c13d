"""One self-contained HTML report of a run, or of the last N runs, from the runs table.

``pipeline report <output table | runs table | run id> [--history N] [--out FILE]``
reads the runs table (:mod:`pipeline.records.runs`) with ``deltalake`` (no Spark) and
writes a single HTML file with its plots embedded as PNG data URIs, so it can
be mailed, attached to an MLflow run or opened from object storage:

- one run: throughput over time per worker, the padded-length histogram and
  padding per length, row status counts, the slowest batches, and for
  generation the finish reasons and tokens/s;
- ``--history N``: rows per ds, throughput and flagged-rate trends over the
  job's last N runs, with every night that deviates from the median of the
  runs before it flagged (:func:`find_deviations`).

Plots use matplotlib's Agg backend (no display needed); matplotlib is imported
only when a report is drawn.

A module per concern: finding the runs and writing the file (:mod:`.command`),
the deviations of a night from the runs before it (:mod:`.deviations`, pure),
the plots (:mod:`.plots`) and the HTML page around them (:mod:`.page`).
"""

from __future__ import annotations

from pipeline.errors import ReportError
from pipeline.report.command import pick_runs, report_main, resolve_runs, write_report
from pipeline.report.deviations import Thresholds, find_deviations
from pipeline.report.page import render_report

__all__ = ["ReportError", "Thresholds", "find_deviations", "pick_runs", "render_report", "report_main", "resolve_runs",
           "write_report"]
