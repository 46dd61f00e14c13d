"""INT8 encoders on ONNX Runtime: export once per revision, the cache reused, the gate on the run's own rows."""

from __future__ import annotations

import io
import shutil

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.models import onnx_int8
from pipeline.models.onnx_int8 import CACHE_FOLDER, OnnxEncoder, matmul_module_names
from pipeline.tasks import build_task
from pipeline.tasks.classify import ClassifyTaskConfig
from pipeline.tasks.embed import EmbedTaskConfig

from tests.support.data import SENTENCES, make_documents, write_delta

LABELS = {"pos": "good great loved", "neg": "bad awful hated"}
# permissive: a tiny random model is no measure of int8's accuracy; the real one is (bench/bench_precision.py)
LOOSE = {"min_mean_cosine": 0.5, "min_top_label_agreement": 0.0}


# the tiny classifier trained on SENTENCES to these labels (negative, neutral, positive), so its top labels differ
# from row to row by wide margins: a random one scores every label about 1/3 and names the same label for all
TRAINED_LABELS = ["positive", "negative", "positive", "negative", "positive", "neutral"]


@pytest.fixture(scope="module")
def trained_classify_model(tiny_classify_model, tmp_path_factory):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = shutil.copytree(tiny_classify_model, tmp_path_factory.mktemp("trained") / "tiny-classify")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder))
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    target = torch.tensor([model.config.label2id[name] for name in TRAINED_LABELS])
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        loss = torch.nn.functional.cross_entropy(model(**batch).logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(str(folder))
    return folder


def _task(model_dir, precision="int8", *, config=None, rows=(), **model):
    task = build_task(config or EmbedTaskConfig(labels=LABELS),
                      model=ModelConfig(path=str(model_dir), precision=precision, **model),
                      batching=BatchingConfig(batch_size=4, max_length=32))
    task.calibration_rows = tuple(rows)
    return task


def _copy(model_dir, tmp_path):
    return shutil.copytree(model_dir, tmp_path / model_dir.name)


def _score(task, loaded):
    chunk = pa.record_batch([pa.array(SENTENCES * 2, pa.string())], names=["text"])
    return task.process(loaded, chunk, WorkerCounts())


def test_int8_exports_once_and_later_loads_reuse_the_file(tiny_embed_model, tmp_path, monkeypatch):
    model_dir = _copy(tiny_embed_model, tmp_path)
    loaded = _task(model_dir, accuracy_gate={"enabled": False}).load(model_dir, "cpu")
    assert isinstance(loaded.model, OnnxEncoder) and loaded.precision == "int8"
    (made,) = (model_dir / CACHE_FOLDER).glob("*/model.int8.onnx")
    assert loaded.model.path == made
    stamp = made.stat().st_mtime_ns

    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the cached graph is there")

    monkeypatch.setattr(onnx_int8, "export_onnx", no_export)
    again = _task(model_dir, accuracy_gate={"enabled": False}).load(model_dir, "cpu")
    assert again.model.path == made and made.stat().st_mtime_ns == stamp
    out = _score(_task(model_dir), again)
    assert set(out.column("status").to_pylist()) == {"ok"}
    assert len(out.column("embedding")[0].as_py()) == 32


def test_other_int8_settings_or_new_weights_export_a_new_graph(tiny_embed_model, tmp_path):
    from safetensors.torch import load_file, save_file

    model_dir = _copy(tiny_embed_model, tmp_path)

    def graph(**settings):
        return _task(model_dir, accuracy_gate={"enabled": False}, **settings).load(model_dir, "cpu").model.path

    first = graph()
    assert graph(int8={"per_channel": False}) != first
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # same bytes, new mtime: the revision is of the bytes
    assert graph() == first
    # new weights of the same shapes (a fine-tune saved over the folder): the old graph is not theirs
    tensors = load_file(str(weights))
    (query,) = [name for name in tensors if name.endswith("layer.0.attention.self.query.weight")]
    tensors[query] = tensors[query] * 2.0
    save_file(tensors, str(weights), metadata={"format": "pt"})
    retrained = graph()
    assert retrained != first and retrained.is_file() and first.is_file()
    assert retrained.parent.parent == first.parent.parent == model_dir / CACHE_FOLDER


def test_the_cache_folder_is_the_user_cache_when_the_model_folder_is_not_writable(tmp_path, monkeypatch):
    monkeypatch.setenv("SBI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(onnx_int8.os, "access", lambda path, mode: False)
    assert onnx_int8._cache_folder(tmp_path / "model", "k") == tmp_path / "cache" / "onnx" / "k"
    monkeypatch.undo()
    assert onnx_int8._cache_folder(tmp_path, "k") == tmp_path / CACHE_FOLDER / "k"


def test_the_ffn_down_projection_stays_fp32_and_the_rest_is_int8(tiny_embed_model, tmp_path):
    import onnx

    model_dir = _copy(tiny_embed_model, tmp_path)
    path = _task(model_dir, accuracy_gate={"enabled": False}).load(model_dir, "cpu").model.path
    graph = onnx.load(str(path)).graph
    float_matmuls = {n.name for n in graph.node if n.op_type == "MatMul"}
    int8_matmuls = [n.name for n in graph.node if n.op_type == "MatMulInteger"]
    downs = {n for n in float_matmuls if "/output/dense/" in n and "/attention/" not in n}
    layers = sum(1 for n in int8_matmuls if "/intermediate/dense/" in n)
    assert len(downs) == layers == 2  # the tiny BERT has 2 layers
    assert not any("/output/dense/" in n and "/attention/" not in n for n in int8_matmuls)
    assert any("/attention/self/query/" in n for n in int8_matmuls)


def test_matmul_module_names_name_the_weight_matmuls(tiny_embed_model, tmp_path):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(tiny_embed_model)).eval()
    onnx_int8.export_onnx(model, tmp_path / "m.onnx", kind="embed")
    modules = set(matmul_module_names(tmp_path / "m.onnx").values())
    assert "encoder.layer.0.output.dense" in modules and "encoder.layer.1.attention.self.query" in modules
    assert all(not m.endswith("self") for m in modules)  # attention's own products have no weight


def test_skipping_every_layer_is_refused(tiny_embed_model, tmp_path):
    model_dir = _copy(tiny_embed_model, tmp_path)
    with pytest.raises(ValueError, match="leaves no layer to quantise"):
        _task(model_dir, accuracy_gate={"enabled": False}, int8={"skip_modules": ["."]}).load(model_dir, "cpu")


def test_gate_calibrates_on_the_run_rows_and_reports_the_figures(tiny_embed_model, tmp_path):
    model_dir = _copy(tiny_embed_model, tmp_path)
    rows = [f"{s} number {i}" for i, s in enumerate(SENTENCES * 10)]
    loaded = _task(model_dir, rows=rows, accuracy_gate=LOOSE).load(model_dir, "cpu")
    (check,) = loaded.gate.checks
    assert check.rows == len(rows) and check.sample == "run rows" and check.passed
    assert loaded.precision == "int8"
    (line,) = loaded.load_counts["precision_checks"]
    assert line.startswith("int8: mean cosine") and f"on {len(rows)} run rows (pass)" in line


def test_gate_without_rows_uses_the_builtin_texts(tiny_embed_model, tmp_path):
    model_dir = _copy(tiny_embed_model, tmp_path)
    (check,) = _task(model_dir, accuracy_gate=LOOSE).load(model_dir, "cpu").gate.checks
    assert check.rows == 16 and check.sample == "built-in calibration texts"


def _labels(model_dir, precision):
    task = _task(model_dir, precision, config=ClassifyTaskConfig(), accuracy_gate={"enabled": False})
    return _score(task, task.load(model_dir, "cpu")).column("label").to_pylist()


def test_int8_that_fails_the_gate_falls_back_to_fp32(trained_classify_model, tmp_path):
    model_dir = _copy(trained_classify_model, tmp_path)
    task = _task(model_dir, config=ClassifyTaskConfig(), rows=SENTENCES,
                 accuracy_gate={"min_mean_cosine": 1.0})
    loaded = task.load(model_dir, "cpu")
    assert loaded.precision == "fp32" and loaded.gate.fell_back
    # the gate's figure is the share of its rows whose top label int8 and fp32 agree on, counted here apart
    ours, theirs = _labels(model_dir, "int8"), _labels(model_dir, "fp32")
    agreed = sum(a == b for a, b in zip(ours, theirs)) / len(theirs)
    assert len(set(theirs)) == 3 and loaded.gate.checks[0].top_label_agreement == agreed
    (reason,) = loaded.load_counts["precision_fallbacks"]
    assert reason.startswith("int8->fp32 (int8: mean cosine") and "run rows (FAIL)" in reason


def test_the_fp32_model_a_fallback_keeps_scores_as_a_plain_fp32_load(tiny_embed_model, tmp_path):
    # the first load of a revision exports from the fp32 model in memory; a failed gate then scores with
    # that model, which must still be in eval mode (dropout off), as if int8 had never been tried
    model_dir = _copy(tiny_embed_model, tmp_path)
    fell_back = _task(model_dir, rows=SENTENCES, accuracy_gate={"min_mean_cosine": 1.0}).load(model_dir, "cpu")
    assert fell_back.precision == "fp32" and fell_back.gate.fell_back
    assert not fell_back.model.training
    plain = _task(model_dir, "fp32").load(model_dir, "cpu")
    ours = _score(_task(model_dir), fell_back).column("embedding").to_pylist()
    theirs = _score(_task(model_dir, "fp32"), plain).column("embedding").to_pylist()
    np.testing.assert_allclose(np.array(ours), np.array(theirs), rtol=0, atol=1e-6)


def _timed_as(monkeypatch, seconds):
    """The gate's timed sample runs take ``seconds[precision]`` (their outputs are real)."""
    from pipeline.models import precision

    real, calls = precision.timed_run, []

    def timed_run(run, model, name, texts, *, warm):
        calls.append((name, warm))
        return real(run, model, name, texts, warm=warm)[0], seconds[name]

    monkeypatch.setattr(precision, "timed_run", timed_run)
    return calls


def test_auto_picks_int8_on_a_cpu_when_it_passes_and_fp32_when_not(tiny_embed_model, tmp_path, monkeypatch):
    from pipeline.models import precision

    monkeypatch.setattr(precision, "has_fast_bf16", lambda device_type: False)
    calls = _timed_as(monkeypatch, {"fp32": 2.0, "int8": 1.0})
    model_dir = _copy(tiny_embed_model, tmp_path)
    chosen = _task(model_dir, "auto", rows=SENTENCES, accuracy_gate=LOOSE).load(model_dir, "cpu")
    assert chosen.precision == "int8" and not chosen.gate.fell_back
    assert chosen.load_counts["precision_auto"] == {"auto -> int8": 1}
    (check,) = chosen.load_counts["precision_checks"]
    assert "2.00x fp32's speed" in check and check.endswith("(pass)")
    assert calls == [("fp32", True), ("int8", True)]  # auto times both after a warm-up
    strict = _task(model_dir, "auto", rows=SENTENCES, accuracy_gate={"min_mean_cosine": 1.0, "on_fail": "fail"})
    safe = strict.load(model_dir, "cpu")  # auto never fails: it ends at fp32
    assert safe.precision == "fp32" and "precision_fallbacks" not in safe.load_counts


def test_auto_keeps_fp32_where_int8_passes_but_is_not_faster_here(tiny_embed_model, tmp_path, monkeypatch):
    # a CPU where ONNX Runtime's int8 is slower than torch's fp32 (measured on some: docs/benchmarks_precision.md)
    from pipeline.models import precision

    monkeypatch.setattr(precision, "has_fast_bf16", lambda device_type: False)
    _timed_as(monkeypatch, {"fp32": 1.0, "int8": 1.25})
    model_dir = _copy(tiny_embed_model, tmp_path)
    chosen = _task(model_dir, "auto", rows=SENTENCES, accuracy_gate=LOOSE).load(model_dir, "cpu")
    assert chosen.precision == "fp32" and not chosen.gate.fell_back
    assert chosen.load_counts["precision_auto"] == {"auto -> fp32": 1}
    assert "precision_fallbacks" not in chosen.load_counts
    (check,) = chosen.load_counts["precision_checks"]
    assert "0.80x fp32's speed" in check and check.endswith("(pass, but not faster than fp32)")


def test_an_int8_request_is_not_timed_and_keeps_int8_when_it_passes(tiny_embed_model, tmp_path, monkeypatch):
    calls = _timed_as(monkeypatch, {"fp32": 1.0, "int8": 5.0})
    model_dir = _copy(tiny_embed_model, tmp_path)
    chosen = _task(model_dir, "int8", rows=SENTENCES, accuracy_gate=LOOSE).load(model_dir, "cpu")
    assert chosen.precision == "int8"
    (check,) = chosen.load_counts["precision_checks"]
    assert "fp32's speed" not in check and calls == [("fp32", False), ("int8", False)]


def test_int8_classify_matches_fp32_labels_closely(trained_classify_model, tmp_path):
    model_dir = _copy(trained_classify_model, tmp_path)
    fp32 = _task(model_dir, "fp32", config=ClassifyTaskConfig())
    int8 = _task(model_dir, config=ClassifyTaskConfig(), accuracy_gate={"enabled": False})
    ref, out = (_score(t, t.load(model_dir, "cpu")) for t in (fp32, int8))
    assert ref.column("label").to_pylist() == TRAINED_LABELS * 2  # what it was trained to say, three labels
    assert out.column("label").to_pylist() == ref.column("label").to_pylist()
    a = np.array([list(m.values()) for m in (dict(x) for x in ref.column("scores").to_pylist())])
    b = np.array([list(m.values()) for m in (dict(x) for x in out.column("scores").to_pylist())])
    assert a.shape == b.shape and np.abs(a - b).max() < 0.1


def test_run_job_calibrates_on_its_own_rows_and_prints_the_agreement(spark, tmp_path, tiny_embed_model):
    from pipeline.runner import run_job
    from pipeline.stages.scoring import calibration_rows

    from tests.support.jobs import job_config

    model_dir = _copy(tiny_embed_model, tmp_path)
    write_delta(tmp_path / "docs", make_documents(60))
    config = job_config(tmp_path, model_dir)
    config = config.model_copy(update={"model": ModelConfig(
        path=str(model_dir), name="tiny-bert", precision="int8", accuracy_gate={**LOOSE, "sample_rows": 24})})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    loads = sum(summary.model_loads.values())
    assert summary.precision_used == {"int8": loads}
    # one worker measured; a second one, if any, replayed its verdict
    (check,) = [c for c in summary.precision_checks if "remembered verdict" not in c]
    assert check.endswith("on 24 run rows (pass)") and summary.precision_checks[check] == 1
    assert sum(summary.precision_checks.values()) == loads
    assert "precision gate          : int8: mean cosine" in out.getvalue()
    # the same rows every time they are drawn, whatever the order the source gives them in
    from pipeline.io.sources import read_delta

    inputs = read_delta(spark, str(tmp_path / "docs")).withColumnRenamed("doc_id", "id")
    task = build_task(config.task, model=config.model, batching=config.batching)
    first = calibration_rows(inputs, config, task)
    assert len(first) == 24 and first == calibration_rows(inputs.orderBy("text"), config, task)
