"""Settings of the ``vllm`` generation backend (config layer: pydantic only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_MAX_NUM_SEQS", "VllmConfig"]

# vLLM's batch width unless task.vllm.max_num_seqs says otherwise: chosen from the sweep in
# docs/benchmarks_generation.md (make bench-generate-width).
DEFAULT_MAX_NUM_SEQS = 64


# vllm.LLM arguments that decide what code or weights get loaded, not how fast: a config overlay or a
# --set must not be able to turn them on behind model.path's back
_LOADING_POLICY = {
    "trust_remote_code": "runs Python files shipped in the model folder",
    "worker_cls": "imports a class named in the config", "worker_extension_cls": "imports a class named in the config",
    "load_format": "`pt` loads pickle checkpoints", "model_loader_extra_config": "loader plug-in settings",
    "hf_overrides": "rewrites the model's config.json", "hf_config_path": "reads another config.json",
    "revision": "downloads other weights", "code_revision": "downloads other code",
    "tokenizer_revision": "downloads another tokenizer", "download_dir": "downloads weights from the Hub",
    "hf_token": "a Hub credential in the config", "allowed_local_media_path": "reads local files named by rows",
}


class VllmConfig(BaseModel):
    """Settings of the ``vllm`` generation backend (one ``vllm.LLM`` per Python worker).

    The KV cache is sized from this config, never from a fraction of the
    machine's RAM: ``kv_cache_mb`` when set; else, on a CPU, room for
    ``max_num_seqs`` sequences of ``max_input_tokens + max_new_tokens_limit``
    tokens; on a GPU, what ``gpu_memory_utilization`` of the card leaves after
    the weights (lower it when several tasks share a GPU).

    ``max_num_seqs`` is vLLM's own batch width, independent of the transformers
    backend's ``task.slots``: vLLM's paged cache and fused kernels keep gaining
    from wider batches long after our slot batching stops (docs/benchmarks_generation.md:
    on 2 CPU cores, SmolLM2-135M, tokens/s rose from 8 to 64 sequences).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    max_num_seqs: int = Field(
        DEFAULT_MAX_NUM_SEQS, gt=0, description="vllm: sequences in vLLM's running batch (its own width, not "
        "`task.slots`); on a CPU the KV cache holds this many full sequences")
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vllm on GPUs: share of the card (lower it when tasks share a GPU)")
    kv_cache_mb: float | None = Field(
        None, gt=0, description="vllm: KV cache size; none: `max_num_seqs` full sequences on a CPU, "
        "`gpu_memory_utilization` on a GPU")
    tensor_parallel_size: Union[Literal["auto"], Annotated[int, Field(gt=0)]] = Field(
        "auto", description="vllm: `auto` = the GPUs Spark gave the task (1 on a CPU)")
    enforce_eager: bool = Field(
        True, description="vllm: no torch.compile/CUDA graphs (fast start in every worker)")
    # Measured on 2 CPU cores: 1.8x the tokens/s of the separate engine process and 5x faster start-up.
    in_process: bool = Field(True, description="vllm: run the engine inside the Spark Python worker")
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="vllm: any other `vllm.LLM` argument, e.g. `{enable_prefix_caching: true}`")

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
        policy = sorted(set(self.engine_args) & set(_LOADING_POLICY))
        if policy:
            raise ValueError(
                f"engine_args {policy} would change what code and weights vLLM loads ("
                + "; ".join(f"{k}: {_LOADING_POLICY[k]}" for k in policy)
                + "): remove them from task.vllm.engine_args; the engine loads model.path as it is"
            )
        clash = sorted(set(self.engine_args) & set(derived))
        if clash:
            raise ValueError(
                f"engine_args {clash} are derived from the task; set " + ", ".join(f"{derived[k]}" for k in clash)
                + " instead"
            )
        return self
