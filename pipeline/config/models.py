"""The typed job configuration: ``JobConfig`` over its sections, with the Spark, task and run sections.

Unknown keys and bad values fail validation naming the key path; ``task`` is
validated against the config class its ``kind`` names
(:mod:`pipeline.config.kinds`). The source, sink and storage sections are in
:mod:`pipeline.config.data`, the model and batching sections in
:mod:`pipeline.config.inference`.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, SerializeAsAny, field_validator, model_validator

from pipeline.config.base import WRITES, ConfigSection
from pipeline.config.data import SinkConfig, SourceConfig, StorageConfig
from pipeline.config.inference import BatchingConfig, ModelConfig
from pipeline.config.kinds import known_kinds, task_config_class
from pipeline.config.redaction import redact_config
from pipeline.core.locations import Location

__all__ = ["DELTA_CONNECTOR_CONF", "JobConfig", "MlflowConfig", "QualityConfig", "RunConfig", "SparkConfig", "TaskConfig"]


# A session this library builds says in this setting whether it has the Delta connector ("true"/"false"), so
# asking (pipeline.io.sources.has_delta_connector) costs no probe query; unset on every other session.
DELTA_CONNECTOR_CONF = "spark.sbi.deltaConnector"

# run ids reach SQL filters, file names and commit metadata: no quotes, spaces or slashes
RUN_ID_PATTERN = r"[A-Za-z0-9._:-]{1,128}"


class SparkConfig(ConfigSection):
    """How to get a SparkSession when none is active (spark-submit and Databricks bring their own)."""

    master: str = Field("local[*]", description="used only when no session is active and not under spark-submit")
    local_task_attempts: int = Field(
        4, ge=1, description="attempts per task on a local master built here (`local[N]` runs as `local[N,4]`, "
        "a given `local[N,F]` is kept): local masters ignore `spark.task.maxFailures`; 1: no retries")
    app_name: str = Field("spark-batch-inference", description="Spark application name of a session built here")
    # Length sorting happens within a chunk, so bigger chunks mean less padding (see docs/benchmarks_precision.md).
    arrow_max_records_per_batch: int = Field(
        10_000, gt=0, description="rows per Arrow chunk handed to a Python worker (the length-sorting scope)")
    shuffle_partitions: int = Field(8, gt=0, description="`spark.sql.shuffle.partitions` of the session")
    conf: dict[str, str] = Field(
        default_factory=dict, description="extra Spark settings, e.g. `--set spark.conf.spark.x.y=v`")
    rows_per_task: int = Field(
        10_000, gt=0, description="target rows per inference task (`generate`: 512 unless set): the runner plans "
        "ceil(rows / rows_per_task) tasks, at least one per core and a multiple of the cores")
    small_job_rows: int = Field(
        10_000, ge=0, description="a job of at most this many source rows (`source.limit`, else the Delta log's "
        "counts) with local paths only, `sink.writer` auto or deltalake and no session of its own runs light on a "
        "local master: no Delta jars, a quick-start JVM, the commit written from the driver "
        "(pipeline.stages.small_jobs); 0: never")
    class_archive: bool = Field(
        True, description="a session started here maps its JVM's classes from an archive (Java's class-data "
        "sharing), written by the first such session at its exit (~150 MB under $SBI_CACHE_DIR/jvm): starts "
        "sooner; false: off (pipeline.spark.class_archive)")
    remote: str | None = Field(
        None, description="Spark Connect address (`sc://host:port/;token=...`); none: `$SPARK_REMOTE`, "
        "else a classic session")
    connect_timeout_s: float = Field(
        30.0, gt=0, description="seconds to wait for the Spark Connect server, a Hive metastore or an S3 endpoint "
        "named in the config to answer before the job fails with the address to check")


class TaskConfig(ConfigSection):
    """Base of every task kind's config. A kind's module subclasses it with ``kind: Literal["<kind>"]``
    and registers it with :func:`pipeline.registry.register_task`; ``JobConfig.task`` is validated
    against the registered class named by ``kind``.
    """

    kind: str = Field(description="the task kind; see the registered kinds below")

    # The task fingerprint (pipeline.config.fingerprint) that incremental runs compare: this config's fields
    # (dotted paths) that provably never change a row's output, and the ``batching`` keys that do
    # (None: every batching key, the safe default for a kind that does not say).
    fingerprint_ignore: ClassVar[frozenset[str]] = frozenset()
    fingerprint_batching: ClassVar[tuple[str, ...] | None] = None
    # False for a kind whose check_job refuses run.incremental (the docs leave it out of the fingerprint table)
    supports_incremental: ClassVar[bool] = True
    # this config's fields (dotted paths) that two tries of one logical run may set differently without
    # changing what it writes (a served model's address and client limits): left out of the run key, so a
    # rerun with other values still resumes the staged work (pipeline.runner, pipeline.journal)
    per_try_settings: ClassVar[frozenset[str]] = frozenset()

    def check_job(self, job: "JobConfig") -> None:
        """Cross-checks against the rest of the job config (raise ``ValueError`` with what to change)."""


class MlflowConfig(ConfigSection):
    """Where a run logs its params, metrics and report (see ``pipeline.records.tracking``)."""

    tracking_uri: str = Field(..., description="MLflow tracking URI, e.g. sqlite:///mlflow.db, file:/path, databricks")
    experiment: str | None = Field(None, description="experiment name; none: the job name")
    registry_uri: str | None = Field(None, description="model registry URI; none: the tracking URI")


class QualityConfig(ConfigSection):
    """Each run's output profiled on the executors and compared with the job's recent runs before its commit."""

    enabled: bool = Field(True, description="profile the output while it is scored and compare it with the job's "
                          "recent runs before the commit (`pipeline.core.sketches`, `pipeline.core.drift`)")
    on_drift: Literal["warn", "refuse"] = Field(
        "warn", description="a measure that moved: `warn` publishes and flags it (summary, runs table, report, "
        "MLflow); `refuse` commits nothing and keeps the scored rows staged: `--accept-drift` publishes them "
        "without scoring again")
    history: int = Field(7, ge=1, le=100, description="compare with the job's last N ok runs that have a profile "
                         "(from the last run published with `--accept-drift` on)")
    psi: float = Field(0.25, gt=0, description="population stability index above which a measure moved")
    ks: float = Field(0.2, gt=0, le=1, description="Kolmogorov-Smirnov distance above which a histogram moved")
    centroid: float = Field(0.5, gt=0, description="embeddings: the centroid's shift, in units of the history's "
                            "spread, above which they moved")
    overlap_drop: float = Field(0.5, gt=0, le=1, description="recommend: the drop of the mean top-K overlap with the "
                                "night before, as a share of the history's, above which the lists moved")
    p_value: float = Field(0.001, gt=0, le=1, description="a measure moved only when its test's p-value is also "
                           "below this (a small night's noise stays quiet)")
    min_rows: int = Field(30, ge=1, description="a measure with fewer values in the run or in its history is not "
                          "compared")
    ignore: list[str] = Field(default_factory=list, description="measures shown but never flagged, e.g. "
                              "`[input_chars]` for a job whose inputs vary by design")


class RunConfig(ConfigSection):
    """Per-run values: the logical date, the run id, reporting."""

    ds: dt.date | None = Field(None, description="the logical run date, also `--ds`; none: today (UTC)")
    run_id: str | None = Field(
        None, description="also `--run-id`: 1-128 of `A-Z a-z 0-9 . _ : -`; none: random")
    progress: bool = Field(True, description="progress lines while the job runs")
    progress_interval_s: float = Field(10.0, gt=0, description="seconds between progress lines")
    sample_rows: int = Field(3, ge=0, description="output rows shown in the summary")
    log_format: Literal["plain", "json"] = Field(
        "plain", description="also `--log-json`: the run's lines as plain text, or JSON lines with one event per "
                             "driver stage (see docs/logging.md)")
    summary_path: str | None = Field(
        None, description="also write the summary as JSON: a local path or an `s3://`/`s3a://` object",
        json_schema_extra=WRITES)
    incremental: bool = Field(
        False, description="score only rows whose (id, content hash) the output lacks for this task fingerprint "
        "(model revision and the settings that change results: see \"Incremental runs\")")
    retry_quarantined: bool = Field(
        False, description="also `--retry-quarantined`: an incremental run scores again the rows quarantined "
        "earlier with the same content and task fingerprint (by default they are skipped and counted)")
    min_rows_fraction: float = Field(
        0.5, ge=0, le=1,
        description="a run that replaces a day (or a whole table) with fewer rows than this fraction of what it "
                    "holds now is refused before any work (an empty or shrunk source is almost always an upstream "
                    "failure); 0: no check")
    allow_empty: bool = Field(
        False, description="also `--allow-empty`: replace a day (or a table) even with far fewer rows than it "
                           "holds, or none (see `run.min_rows_fraction`)")
    max_error_fraction: float | None = Field(
        0.05, ge=0, le=1,
        description="error budget: more than this fraction of the scored rows failing fails the run before "
                    "anything is committed (at the limit passes); none: no fraction limit")
    max_errors: int | None = Field(
        None, ge=0, description="error budget: more than this many failed rows fails the run before anything is "
                                "committed; none: no count limit")
    faults: dict[str, Any] = Field(
        default_factory=dict, description="fault injection for drills and tests (see `pipeline/core/faults.py`)")
    runs_path: str | None = Field(
        None, description="Delta table with one row per run (see `pipeline/records/runs.py`); none: "
        "`<run.state_path>/<job>/runs`, else `<sink.path>_runs`", json_schema_extra=WRITES)
    report_path: str | None = Field(
        None, description="write this run's HTML report there at the end: a local path or an `s3://`/`s3a://` "
                          "object (see `pipeline/report/`)", json_schema_extra=WRITES)
    mlflow: MlflowConfig | None = Field(
        None, description="log params, metrics and the report to MLflow (needs `mlflow-skinny`); none: no logging")
    staging: bool = Field(
        True, description="stage each finished inference task's output, so a rerun of a killed run reuses it "
                          "(see \"Resuming a killed run\"); off: an all-or-nothing run")
    staging_path: str | None = Field(
        None, description="folder of the staged task output (local or mounted; every executor must reach it); "
                          "none: `<run.state_path>/<job>/staging`, else `<sink.path>_staging`",
        json_schema_extra=WRITES)
    max_tokens: int | None = Field(
        None, gt=0, description="endpoint backend: the most tokens (prompt + completion) this try may spend on the "
        "server; once the next request could pass it the run stops, commits nothing and keeps what it was answered "
        "(staged tasks, the request journal), so a rerun pays only for the rest; in batch mode a request file whose "
        "estimate would take this try's submissions past it is not submitted; none: no budget")
    submit_only: bool = Field(
        False, description="also `--submit-only`: `task.endpoint.mode: batch` only: submit the run's batches and end "
        "(nothing committed, runs-table outcome `submitted`); the same command later, without it, collects the "
        "answers and commits")
    quality: QualityConfig = Field(default_factory=QualityConfig,
                                   description="the output's profile and the drift gate before the commit")
    accept_drift: bool = Field(
        False, description="also `--accept-drift`: publish a run the drift gate flagged (`run.quality.on_drift: "
        "refuse`); a rerun of a refused run publishes its staged rows without scoring them again, and starts the "
        "history later runs are compared with")
    staging_max_age_hours: float = Field(
        72.0, gt=0, description="staged output of other runs older than this is removed at the start of a run "
                                "and by `pipeline vacuum`")
    state_path: str | None = Field(
        None, description="the folder for what the job keeps beside its output (a Unity Catalog Volume such as "
        "`/Volumes/main/sbi/state`, mounted on every executor): the runs table `<state_path>/<job>/runs` and the "
        "staging folder `.../staging`, and for a catalog-table sink (`sink.table`) the quarantine "
        "`.../quarantine`, where `run.runs_path`, `run.staging_path` and `sink.quarantine_path` are not set",
        json_schema_extra=WRITES)
    record: Literal["required", "best_effort"] = Field(
        "required", description="`required`: a runs-table row that cannot be written fails the run (the "
        "`started` row before any work; the final row after the commit, which stands: the error says so), since "
        "the drift gate's history, the report and `--accept-drift` read that table; `best_effort`: a line says "
        "so and the run goes on unrecorded")

    @field_validator("run_id", mode="before")
    @classmethod
    def _run_id_as_text(cls, value: Any) -> Any:
        """A run id given as a number or a date (a scheduler's ``20261129`` or ``2026-11-29`` from Python) is its
        text; anything else is validated as given."""
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, dt.date):
            return value.isoformat()
        return value

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(RUN_ID_PATTERN, value):
            raise ValueError(
                f"{value!r} is not a valid run id: use 1 to 128 letters, digits or . _ : - (it goes into "
                "SQL filters, file names and commit metadata), e.g. nightly-2026-11-29")
        return value

    def resolved_ds(self) -> dt.date:
        return self.ds or dt.datetime.now(dt.timezone.utc).date()

    def resolved_run_id(self) -> str:
        return self.run_id or uuid.uuid4().hex[:16]


class JobConfig(ConfigSection):
    job: str = Field(description="job name (summary, commit metadata)")
    spark: SparkConfig = Field(default_factory=SparkConfig)
    source: SourceConfig
    model: ModelConfig
    # any registered kind's config (pipeline.registry); validated by its ``kind``
    task: SerializeAsAny[TaskConfig]
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    sink: SinkConfig
    run: RunConfig = Field(default_factory=RunConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    # key paths (e.g. "sink.path") whose values came from ${VAR}: the runs table redacts them
    _env_paths: frozenset[str] = PrivateAttr(default_factory=frozenset)
    # the same key paths -> their text before expansion (e.g. "${LAKE}/scores"), for `pipeline check`
    _env_templates: dict[str, str] = PrivateAttr(default_factory=dict)

    def printable(self) -> dict[str, Any]:
        """The resolved config as ``pipeline check`` prints it, with no secret in it.

        A value that came from ``${VAR}`` shows its ``${VAR}`` text, never the
        expanded value; a key named like a secret (password, token, ...) shows
        ``***`` (as in the runs table, :func:`pipeline.config.redaction.redact_config`).
        """

        def show(value: Any, where: str) -> Any:
            if where in self._env_templates:
                return self._env_templates[where]
            if isinstance(value, dict):
                return {k: show(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
            if isinstance(value, list):
                return [show(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return value

        return redact_config(show(self.model_dump(mode="json"), ""))

    def secret_values(self) -> list[str]:
        """The secrets this config holds (``storage`` keys), to scrub from error text (:func:`scrub`)."""
        storage = self.storage
        return [v.get_secret_value() for v in (storage.access_key_id, storage.secret_access_key,
                                                storage.session_token) if v is not None]

    @property
    def runs_location(self) -> Location | None:
        """:meth:`resolved_runs_path` parsed; None for a catalog sink without a runs table."""
        path = self.resolved_runs_path()
        return Location.of(path) if path else None

    def resolved_runs_path(self) -> str | None:
        """The runs table: ``run.runs_path``, else the output path + ``_runs`` (none for a catalog sink)."""
        if self.run.runs_path:
            return self.run.runs_path
        return self.sink.path.rstrip("/") + "_runs" if self.sink.path else None

    @model_validator(mode="before")
    @classmethod
    def _state_in_the_state_path(cls, data: Any) -> Any:
        """``run.state_path`` gives a job its runs table and staging folder, and a ``sink.table`` job its quarantine
        too (a path sink's quarantine stays beside its output, written by the same writer)."""
        if not isinstance(data, dict):
            return data
        run, sink = data.get("run"), data.get("sink")
        if not (isinstance(run, dict) and isinstance(sink, dict) and run.get("state_path")):
            return data
        root = f"{str(run['state_path']).rstrip('/')}/{data.get('job', 'job')}"
        run = {"runs_path": f"{root}/runs", "staging_path": f"{root}/staging", **{k: v for k, v in run.items() if v is not None}}
        if sink.get("table"):
            sink = {"quarantine_path": f"{root}/quarantine", **{k: v for k, v in sink.items() if v is not None}}
        return {**data, "run": run, "sink": sink}

    @model_validator(mode="before")
    @classmethod
    def _a_stream_appends(cls, data: Any) -> Any:
        """A streaming source's micro-batches append: ``sink.mode`` defaults to ``append`` for a stream."""
        if not isinstance(data, dict):
            return data
        source, sink = data.get("source"), data.get("sink")
        if isinstance(source, dict) and source.get("stream") is not None and isinstance(sink, dict) \
                and sink.get("mode") is None:
            return {**data, "sink": {**sink, "mode": "append"}}
        return data

    @model_validator(mode="after")
    def _stream_fits_job(self) -> "JobConfig":
        if self.source.stream is None:
            return self
        if self.sink.mode != "append":
            raise ValueError(f"source.stream: each micro-batch appends its rows, but sink.mode is "
                             f"{self.sink.mode!r}; set sink.mode: append (the default for a stream)")
        if self.run.incremental:
            raise ValueError("source.stream reads only what arrived since the last micro-batch, and run.incremental "
                             "compares every source row with the output: choose one (docs/streaming.md says when "
                             "to use which)")
        return self

    @field_validator("task", mode="before")
    @classmethod
    def _task_of_its_kind(cls, value: Any) -> Any:
        if isinstance(value, TaskConfig) or not isinstance(value, dict):
            return value
        if "kind" not in value:
            raise ValueError("needs 'kind', one of: " + ", ".join(known_kinds()))
        config = task_config_class(str(value["kind"]))
        if config is None:
            raise ValueError(f"unknown task kind {value['kind']!r}; known: {', '.join(known_kinds())}")
        return config.model_validate(value)

    @model_validator(mode="after")
    def _task_fits_job(self) -> "JobConfig":
        self.task.check_job(self)
        return self
