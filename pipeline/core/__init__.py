"""The ground floor (docs/architecture.md): what every floor above may use, and nothing that needs Spark or torch.

The row vocabulary (:mod:`~pipeline.core.rows`), what a location is (:mod:`~pipeline.core.locations`),
length-sorted batching (:mod:`~pipeline.core.batching`), the workers' counters and the run's typed counts
(:mod:`~pipeline.core.metrics`, :mod:`~pipeline.core.run_counts`), the run summary
(:mod:`~pipeline.core.run_summary`), a run's log lines (:mod:`~pipeline.core.logs`), the output profile and drift
(:mod:`~pipeline.core.sketches`, :mod:`~pipeline.core.drift`), the session facts
(:mod:`~pipeline.core.sessions`, :mod:`~pipeline.core.compat`, :mod:`~pipeline.core.extras`), the one line an
error gets (:mod:`~pipeline.core.error_text`), fault drills (:mod:`~pipeline.core.faults`) and whether a process of
this host runs (:mod:`~pipeline.core.host`). The error classes, on this floor too, stay public in
:mod:`pipeline.errors`. No module here imports pyspark, torch or transformers (an import-linter contract).
"""
