"""Choosing the generation backend and planning the vLLM engine (no vLLM needed: see test_vllm.py for the engine)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.config import ConfigError, build_config, load_config
from pipeline.tasks.generate import GenerateTaskConfig
from pipeline.generation.config import DEFAULT_MAX_NUM_SEQS, VllmConfig
from pipeline.generation.kv import check_kv_budget, kv_cache_bytes
from pipeline.generation import vllm_backend
from pipeline.generation.vllm_backend import engine_kwargs, resolve_backend, vllm_available
from pipeline.models.device import pick_device, task_gpu_addresses

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64 dims
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


def _plan(config: VllmConfig = VllmConfig(max_num_seqs=16), **kw):
    args = dict(model_dir=Path("/models/m"), model_config=SMOLLM2, precision="fp32", max_seq_len=320)
    return engine_kwargs(config, **{**args, **kw})


def test_kv_cache_is_sized_from_config_not_from_machine_memory():
    kw = _plan()
    # 16 sequences x 384 tokens (320 rounded up to whole 128-token blocks) x 30 layers x K+V x 3 heads x 64 x fp32
    assert kw["kv_cache_memory_bytes"] == 16 * 384 * 30 * 2 * 3 * 64 * 4
    assert kw["max_num_seqs"] == 16 and kw["max_model_len"] == 320 and kw["dtype"] == "float32"
    assert _plan(VllmConfig(max_num_seqs=4))["kv_cache_memory_bytes"] == kw["kv_cache_memory_bytes"] // 4
    assert _plan(precision="bf16")["kv_cache_memory_bytes"] == kw["kv_cache_memory_bytes"] // 2
    assert _plan(VllmConfig(max_num_seqs=16, kv_cache_mb=300))["kv_cache_memory_bytes"] == 300 * 2**20
    # on a GPU vLLM sizes it from gpu_memory_utilization of the card, unless kv_cache_mb says otherwise
    assert "kv_cache_memory_bytes" not in _plan(device="cuda:0")
    assert _plan(VllmConfig(kv_cache_mb=300), device="cuda:0")["kv_cache_memory_bytes"] == 300 * 2**20


def test_vllm_width_is_its_own_setting_not_the_transformers_slots():
    # task.slots sizes the transformers backend only; vLLM keeps its measured default width
    for slots in (1, 8, 16):
        config = GenerateTaskConfig(slots=slots)
        assert config.vllm.max_num_seqs == DEFAULT_MAX_NUM_SEQS == 64
        kw = _plan(config.vllm)
        assert kw["max_num_seqs"] == 64
        assert kw["kv_cache_memory_bytes"] == 64 * 384 * 30 * 2 * 3 * 64 * 4  # 64 full sequences of 384 tokens
    assert _plan(GenerateTaskConfig(slots=4, vllm={"max_num_seqs": 8}).vllm)["max_num_seqs"] == 8


def test_demo_config_kv_budget_admits_the_vllm_width_and_the_slots():
    # conf/generate_text.yaml runs SmolLM2-135M: its max_kv_cache_mb once refused vLLM above ~30 sequences
    job = load_config(REPO / "conf/generate_text.yaml")
    task = job.task
    length = task.max_input_tokens + task.max_new_tokens_limit
    kw = engine_kwargs(task.vllm, model_dir=Path("/m"), model_config=SMOLLM2, precision=job.model.precision,
                       max_seq_len=length)
    assert kw["max_num_seqs"] == DEFAULT_MAX_NUM_SEQS
    check_kv_budget(kw["kv_cache_memory_bytes"], task.max_kv_cache_mb, what="vllm", knob="task.vllm.max_num_seqs")
    slots_kv = kv_cache_bytes(SimpleNamespace(**SMOLLM2), rows=task.slots, max_seq_len=length)
    check_kv_budget(slots_kv, task.max_kv_cache_mb, what="slots", knob="task.slots")
    # and the budget still refuses a width the machine was not sized for
    wider = engine_kwargs(VllmConfig(max_num_seqs=2 * DEFAULT_MAX_NUM_SEQS), model_dir=Path("/m"),
                          model_config=SMOLLM2, precision=job.model.precision, max_seq_len=length)
    with pytest.raises(ValueError, match="lower task.vllm.max_num_seqs"):
        check_kv_budget(wider["kv_cache_memory_bytes"], task.max_kv_cache_mb, what="vllm", knob="task.vllm.max_num_seqs")


def test_engine_arguments_follow_config_and_gpu_resources():
    kw = _plan(VllmConfig(max_num_seqs=16, gpu_memory_utilization=0.5, enforce_eager=False))
    assert kw["gpu_memory_utilization"] == 0.5 and kw["enforce_eager"] is False
    assert kw["tensor_parallel_size"] == 1 and kw["model"] == kw["tokenizer"] == "/models/m"
    assert _plan(gpu_addresses=("2", "3"))["tensor_parallel_size"] == 2
    assert _plan(VllmConfig(tensor_parallel_size=1), gpu_addresses=("2", "3"))["tensor_parallel_size"] == 1
    # engine_args reach vllm.LLM as given; what the task derives (and sizes the cache from) is set once
    kw = _plan(VllmConfig(engine_args={"swap_space": 0, "enable_prefix_caching": True}))
    assert kw["swap_space"] == 0 and kw["enable_prefix_caching"] is True
    with pytest.raises(ValueError, match=r"\['max_num_seqs'\] are derived from the task; set task.vllm.max_num_seqs"):
        VllmConfig(engine_args={"max_num_seqs": 3})
    with pytest.raises(ValueError, match="quantized checkpoint"):
        _plan(precision="int8")


def test_backend_config_validates():
    job = build_config({
        "job": "gen", "source": {"path": "x"}, "model": {"path": "m"}, "sink": {"path": "y"},
        "task": {"kind": "generate", "backend": "vllm", "vllm": {"max_num_seqs": 32, "kv_cache_mb": 256}},
    })
    assert job.task.backend == "vllm" and job.task.vllm.max_num_seqs == 32
    assert GenerateTaskConfig().backend == "auto"
    with pytest.raises(ConfigError, match="task.vllm.max_seqs: unknown key"):
        build_config({"job": "gen", "source": {"path": "x"}, "model": {"path": "m"}, "sink": {"path": "y"},
                      "task": {"kind": "generate", "vllm": {"max_seqs": 4}}})
    with pytest.raises(ConfigError, match="task.backend"):
        build_config({"job": "gen", "source": {"path": "x"}, "model": {"path": "m"}, "sink": {"path": "y"},
                      "task": {"kind": "generate", "backend": "tgi"}})


def test_auto_backend_is_vllm_exactly_when_it_imports(monkeypatch):
    assert resolve_backend("auto") == ("vllm" if vllm_available() else "transformers")
    assert resolve_backend("transformers") == "transformers"
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: False)
    assert resolve_backend("auto") == "transformers"
    with pytest.raises(RuntimeError, match="make venv-vllm"):
        resolve_backend("vllm")


@pytest.mark.skipif(vllm_available(), reason="checks the error where vllm is missing")
def test_vllm_backend_without_vllm_fails_with_what_to_do(tmp_path):
    from tests.support.generation_models import save_model_folder
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.tasks import build_task

    model_dir = save_model_folder(tmp_path / "tiny-llama")
    task = build_task(GenerateTaskConfig(backend="vllm"), model=ModelConfig(path=str(model_dir)),
                      batching=BatchingConfig())
    with pytest.raises(RuntimeError, match="cannot import vllm.*PYSPARK_PYTHON"):
        task.load(model_dir, "cpu")


def test_task_gpu_addresses_come_from_spark_resources():
    from pyspark.resource import ResourceInformation

    resources = {"gpu": ResourceInformation("gpu", ["1", "3"])}
    assert task_gpu_addresses(resources) == ("1", "3")
    assert pick_device(resources) == "cuda:1"
    assert task_gpu_addresses({}) == ()
    assert task_gpu_addresses() == ()  # outside a Spark task


def test_docstring_examples():
    import doctest

    result = doctest.testmod(vllm_backend)
    assert result.attempted >= 2 and result.failed == 0
