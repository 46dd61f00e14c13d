"""Reduced precision: the int8 path, and the accuracy gate passing, falling back and failing."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

from pipeline.config import BatchingConfig, ConfigError, ModelConfig, build_config
from pipeline.tasks.classify import ClassifyTaskConfig
from pipeline.tasks.embed import EmbedTaskConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.models import precision as precision_mod
from pipeline.models.precision import PrecisionGateError, agreement, fallback_chain
from pipeline.tasks import build_task

from tests.support.data import SENTENCES, make_documents, write_delta

LABELS = {"pos": "good great loved", "neg": "bad awful hated"}


def _task(model_dir, precision, *, config=None, **model):
    return build_task(config or EmbedTaskConfig(labels=LABELS),
                      model=ModelConfig(path=str(model_dir), precision=precision, **model),
                      batching=BatchingConfig(batch_size=4, max_length=32))


def _embeddings(task, loaded):
    import pyarrow as pa

    chunk = pa.record_batch([pa.array(SENTENCES * 2, pa.string())], names=["text"])
    return np.array(task.process(loaded, chunk, WorkerCounts()).column("embedding").to_pylist())


def test_fallback_chain_ends_at_fp32():
    assert fallback_chain("int8") == ["int8", "bf16", "fp32"]
    assert fallback_chain("int8", fast_bf16=False) == ["int8", "fp32"]
    assert fallback_chain("bf16", fast_bf16=False) == ["bf16", "fp32"]
    assert fallback_chain("fp16") == ["fp16", "fp32"]
    assert fallback_chain("fp32") == ["fp32"]


def test_agreement_values():
    ref = {"embedding": np.array([[1.0, 0.0], [0.0, 1.0]])}
    cand = {"embedding": np.array([[1.0, 0.0], [1.0, 1.0]])}
    cosine, top = agreement(ref, cand, lambda out: out["embedding"].argmax(axis=1))
    assert cosine == pytest.approx((1 + 2 ** -0.5) / 2)
    assert top == 0.5
    assert agreement(ref, ref, lambda out: None) == (pytest.approx(1.0), None)


def test_gate_passes_and_keeps_the_requested_precision(tiny_embed_model):
    task = _task(tiny_embed_model, "bf16", accuracy_gate={"min_mean_cosine": 0.99, "min_top_label_agreement": 0.9})
    loaded = task.load(tiny_embed_model, "cpu")
    assert loaded.precision == "bf16" and not loaded.gate.fell_back
    (check,) = loaded.gate.checks
    assert check.passed and 0.99 <= check.mean_cosine < 1.0 and check.top_label_agreement >= 0.9
    assert loaded.load_counts == {"precision_used": {"bf16": 1}, "precision_checks": {check.describe(): 1}}
    assert check.describe().endswith("on 16 built-in calibration texts (pass)")
    # and the rows really run in bf16: close to fp32 but not identical
    fp32 = _task(tiny_embed_model, "fp32")
    a, b = _embeddings(fp32, fp32.load(tiny_embed_model, "cpu")), _embeddings(task, loaded)
    assert not np.array_equal(a, b) and (a * b).sum(1).min() > 0.99


def test_gate_threshold_one_forces_fallback_to_fp32(tiny_embed_model):
    task = _task(tiny_embed_model, "bf16", accuracy_gate={"min_mean_cosine": 1.0})
    loaded = task.load(tiny_embed_model, "cpu")
    assert loaded.precision == "fp32" and loaded.gate.fell_back
    assert [(c.precision, c.passed) for c in loaded.gate.checks] == [("bf16", False)]
    (reason,) = loaded.load_counts["precision_fallbacks"]
    assert reason.startswith("bf16->fp32 (bf16: mean cosine ") and reason.endswith("(FAIL))")
    assert loaded.load_counts["precision_used"] == {"fp32": 1}
    fp32 = _task(tiny_embed_model, "fp32")
    assert np.array_equal(_embeddings(task, loaded), _embeddings(fp32, fp32.load(tiny_embed_model, "cpu")))


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_int8_falls_back_through_bf16_where_bf16_is_fast(tiny_embed_model, monkeypatch, fast_bf16):
    monkeypatch.setattr(precision_mod, "has_fast_bf16", lambda device_type: fast_bf16)
    task = _task(tiny_embed_model, "int8", accuracy_gate={"min_mean_cosine": 1.0})
    loaded = task.load(tiny_embed_model, "cpu")
    assert [c.precision for c in loaded.gate.checks] == (["int8", "bf16"] if fast_bf16 else ["int8"])
    assert loaded.precision == "fp32"


def test_a_broken_precision_is_caught_by_a_normal_threshold(tiny_embed_model, monkeypatch):
    real = precision_mod.prepare_model

    def broken(model, precision, **kwargs):
        if precision == "fp32":
            return model
        noisy = copy.deepcopy(model)
        import torch

        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        return noisy

    monkeypatch.setattr(precision_mod, "prepare_model", broken)
    loaded = _task(tiny_embed_model, "bf16").load(tiny_embed_model, "cpu")  # default thresholds
    assert loaded.precision == "fp32" and loaded.gate.checks[0].mean_cosine < 0.99
    monkeypatch.setattr(precision_mod, "prepare_model", real)


def test_gate_can_fail_the_load_instead(tiny_embed_model):
    task = _task(tiny_embed_model, "int8", accuracy_gate={"min_mean_cosine": 1.0, "on_fail": "fail"})
    with pytest.raises(PrecisionGateError, match=r"model.precision int8 failed the accuracy gate on 16 built-in calibration texts"):
        task.load(tiny_embed_model, "cpu")


def test_torch_int8_quantises_linear_layers_except_skipped(tiny_embed_model):
    import torch
    from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

    task = _task(tiny_embed_model, "int8", accuracy_gate={"enabled": False},
                 int8={"backend": "torch", "skip_modules": ["output.dense"]})
    loaded = task.load(tiny_embed_model, "cpu")
    assert loaded.precision == "int8" and loaded.gate.checks == ()
    kinds = {name: type(m) for name, m in loaded.model.named_modules()}
    assert kinds["encoder.layer.0.attention.self.query"] is QuantizedLinear
    assert kinds["encoder.layer.0.intermediate.dense"] is QuantizedLinear
    assert kinds["encoder.layer.0.output.dense"] is torch.nn.Linear
    assert kinds["encoder.layer.0.attention.output.dense"] is torch.nn.Linear
    fp32 = _task(tiny_embed_model, "fp32")
    reference = fp32.load(tiny_embed_model, "cpu")
    assert type(dict(reference.model.named_modules())["encoder.layer.0.attention.self.query"]) is torch.nn.Linear
    a, b = _embeddings(fp32, reference), _embeddings(task, loaded)
    assert not np.array_equal(a, b) and (a * b).sum(1).mean() > 0.9


def test_torch_int8_refuses_to_skip_every_layer(tiny_embed_model):
    task = _task(tiny_embed_model, "int8", accuracy_gate={"enabled": False},
                 int8={"backend": "torch", "skip_modules": ["."]})
    with pytest.raises(ValueError, match="leaves no Linear layer to quantise"):
        task.load(tiny_embed_model, "cpu")


def test_classify_gate_compares_top_labels(tiny_classify_model):
    task = _task(tiny_classify_model, "int8", config=ClassifyTaskConfig(),
                 accuracy_gate={"min_mean_cosine": 0.5, "min_top_label_agreement": 0.5})
    loaded = task.load(tiny_classify_model, "cpu")
    (check,) = loaded.gate.checks
    assert check.passed and check.top_label_agreement is not None and check.top_label_agreement >= 0.5


def test_int8_is_refused_for_generation(tiny_embed_model):
    with pytest.raises(ConfigError, match="int8 is for encoder tasks"):
        build_config({"job": "j", "source": {"path": "x"}, "model": {"path": "m", "precision": "int8"},
                      "task": {"kind": "generate"}, "sink": {"path": "y"}})


def test_fallback_reaches_the_run_summary(spark, tmp_path, tiny_embed_model):
    from pipeline.runner import run_job

    from tests.support.jobs import job_config

    write_delta(tmp_path / "docs", make_documents(40))
    config = job_config(tmp_path, tiny_embed_model)
    config = config.model_copy(update={"model": ModelConfig(
        path=str(tiny_embed_model), name="tiny-bert", precision="bf16", accuracy_gate={"min_mean_cosine": 1.0},
    )})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    loads = sum(summary.model_loads.values())
    assert loads >= 1 and summary.precision_used == {"fp32": loads}
    # one load measured; a second worker waited for its verdict and replayed it
    assert all(reason.startswith("bf16->fp32") for reason in summary.precision_fallbacks)
    assert sum(summary.precision_fallbacks.values()) == loads
    assert "precision fallback      : bf16->fp32" in out.getvalue()


@pytest.mark.gpu
def test_cuda_bf16_casts_weights_and_passes_the_gate(tiny_embed_model):
    import torch

    task = _task(tiny_embed_model, "bf16", accuracy_gate={"min_mean_cosine": 0.99, "min_top_label_agreement": 0.9})
    loaded = task.load(tiny_embed_model, "cuda:0")
    assert loaded.precision == "bf16" and next(loaded.model.parameters()).dtype == torch.bfloat16
    fp32 = _task(tiny_embed_model, "fp32")
    a = _embeddings(fp32, fp32.load(tiny_embed_model, "cpu"))
    assert (a * _embeddings(task, loaded)).sum(1).min() > 0.99


@pytest.mark.gpu
def test_cuda_refuses_int8(tiny_embed_model):
    task = _task(tiny_embed_model, "int8", accuracy_gate={"enabled": False})
    with pytest.raises(ValueError, match="runs on the CPU only"):
        task.load(tiny_embed_model, "cuda:0")
