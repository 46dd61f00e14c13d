"""What a run leaves behind, on the run-stage floor (docs/architecture.md).

:mod:`~pipeline.records.runs`: the runs table (one row per run, read back with ``pipeline.read_runs``);
:mod:`~pipeline.records.recorder`: what records into it at a run's start and end, then the report and MLflow;
:mod:`~pipeline.records.tracking`: the MLflow logging.
"""
