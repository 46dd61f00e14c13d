"""The config sections of what scores the rows: the model (precision, int8, accuracy gate) and batching.

Unknown keys and bad values fail validation naming the key path
(:class:`~pipeline.config.base.ConfigSection`).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from pipeline.config.base import READS, ConfigSection

__all__ = ["AccuracyGateConfig", "BatchingConfig", "Int8Config", "ModelConfig"]


Precision = Literal["fp32", "bf16", "fp16", "int8", "int4", "auto"]

# the FFN down-projection of each BERT-family layer (not the attention output, ``attention.output.dense``)
FFN_DOWN_PROJECTION = r"layer\.\d+\.output\.dense$"


class Int8Config(ConfigSection):
    """How ``precision: int8`` quantises an encoder (CPU only).

    ``onnxruntime`` (the default) exports the model to ONNX once per revision
    and quantises its weight MatMuls dynamically (``pipeline.models.onnx_int8``);
    ``torch`` is torch's dynamic quantisation of the ``nn.Linear`` layers.
    Defaults come from docs/benchmarks_precision.md ("Quantized encoders"): per-tensor
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


class AccuracyGateConfig(ConfigSection):
    """Checks a reduced precision against fp32 at model load, before any row is scored.

    The calibration texts run in fp32 and in the chosen precision; below a
    threshold the worker falls back to the next safer precision (int8 -> bf16
    -> fp32, fp16 -> fp32; int8 -> fp32 on a CPU without native bf16) and the
    run summary says so, or fails with
    ``on_fail: fail``. A verdict is measured once per model, precision,
    settings and machine and then remembered (``pipeline.models.verdicts``).
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
    remember: bool = Field(
        True, description="gate: keep each verdict in the model cache and replay it at later loads with the same "
        "model, precision, settings and machine (see Precision); false: measure at every load")


class ModelConfig(ConfigSection):
    """The model: a folder, or ``package:<module>`` for a model shipped in a wheel (the task says which kind)."""

    path: str = Field("", description="model folder, or `package:<module>` (a model shipped in a wheel); a task on "
                      "the endpoint backend needs none", json_schema_extra=READS)
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


class BatchingConfig(ConfigSection):
    """How each Arrow chunk is cut into padded batches (see ``pipeline.core.batching.plan_batches``)."""

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
