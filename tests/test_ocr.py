"""OCR: the pure pre/post-processing steps, and the real PP-OCRv4 ONNX models from the rapidocr wheel."""

from __future__ import annotations

import doctest

import numpy as np
import pyarrow as pa
import pytest

from pipeline.batching import padding_efficiency
from pipeline.config import BatchingConfig, ModelConfig
from pipeline.images import ocr_steps
from pipeline.images.ocr_steps import (
    LineBox, boxes_from_probability, char_error_rate, collate_lines, ctc_decode, plan_line_batches,
)
from pipeline.metrics import WorkerCounts
from pipeline.tasks.ocr import OcrConfig, OcrTask, find_ocr_models
from tests import image_samples as samples


def test_doctests():
    assert doctest.testmod(ocr_steps).failed == 0


def test_width_sorting_pads_less_and_keeps_every_line():
    rng = np.random.default_rng(0)
    widths = rng.integers(30, 1200, size=500)  # line crops of very different widths, as on real pages
    sorted_batches = plan_line_batches(widths, batch_size=16)
    arrival = plan_line_batches(widths, batch_size=16, sort_by_width=False)
    for batches in (sorted_batches, arrival):
        assert sorted(np.concatenate([b.indices for b in batches]).tolist()) == list(range(500))
        assert all(b.size <= 16 and b.length % 8 == 0 and b.length >= widths[b.indices].max() for b in batches)
    assert padding_efficiency(widths, sorted_batches) > 0.95
    assert padding_efficiency(widths, arrival) < 0.7


def test_collate_pads_right_with_mid_grey():
    crops = [np.full((48, 10, 3), 255, np.uint8), np.zeros((48, 20, 3), np.uint8)]
    batch = plan_line_batches([10, 20], batch_size=2)[0]
    x = collate_lines(crops, batch)
    assert x.shape == (2, 3, 48, 24)
    assert np.all(x[0, :, :, :10] == 1.0) and np.all(x[0, :, :, 10:] == 0.0) and np.all(x[1, :, :, :20] == -1.0)


def test_boxes_follow_text_regions_in_reading_order():
    prob = np.zeros((200, 300), np.float32)
    prob[20:30, 150:280] = 0.9   # right half of line 1
    prob[21:31, 10:120] = 0.9    # left half of line 1
    prob[100:112, 10:200] = 0.8  # line 2
    prob[150:160, 10:200] = 0.35  # weak: below box_threshold, dropped
    boxes = boxes_from_probability(prob, page_size=(400, 600))
    assert [(b.x0 < 100, b.y0 < 100) for b in boxes] == [(True, True), (False, True), (True, False)]
    for box in boxes:
        assert 0 <= box.x0 < box.x1 <= 600 and 0 <= box.y0 < box.y1 <= 400 and box.score >= 0.5


def test_ctc_and_cer():
    chars = ["<blank>", "a", "b", " "]
    probs = np.eye(4)[[[2, 2, 0, 2, 3, 1], [0, 0, 0, 0, 0, 0]]].astype(np.float32)
    assert ctc_decode(probs, chars) == [("bb a", 1.0), ("", 0.0)]
    assert char_error_rate("the same", "the  same\n") == 0.0
    assert char_error_rate("kitten", "sitting") == pytest.approx(3 / 7)
    long_ref = "lorem ipsum dolor sit amet " * 80
    assert char_error_rate(long_ref.replace("o", "0"), long_ref) == pytest.approx(long_ref.count("o") / len(long_ref.strip()), rel=1e-3)


def test_missing_models_are_a_clear_error(tmp_path):
    from pipeline.models.loading import ModelError

    with pytest.raises(ModelError, match="one \\*det\\*.onnx and one \\*rec\\*.onnx"):
        find_ocr_models(tmp_path)


@pytest.fixture(scope="module")
def real_ocr():
    task = OcrTask(OcrConfig(det_min_side=480), model=ModelConfig(path="package:rapidocr_onnxruntime"),
                   batching=BatchingConfig(batch_size=8))
    return task, task.load(task.resolve_model_dir("package:rapidocr_onnxruntime"), "cpu")


def test_real_ocr_models_read_a_rendered_page(real_ocr):
    """The PP-OCRv4 models of the rapidocr wheel, run by our steps on onnxruntime, read every line exactly."""
    task, loaded = real_ocr
    pages = [samples.text_page(), samples.text_page(samples.DOC_LINES[::-1]), b"", samples.truncated_jpeg()]
    counts = WorkerCounts()
    chunk = pa.RecordBatch.from_arrays([pa.array(pages, pa.binary())], names=["content"])
    out = task.process(loaded, chunk, counts).to_pydict()
    assert out["status"] == ["ok", "ok", "skipped_empty", "invalid_image"]
    assert out["text"][0] == "\n".join(samples.DOC_LINES)
    assert out["text"][1] == "\n".join(samples.DOC_LINES[::-1])
    assert out["n_lines"][:2] == [4, 4] and out["text"][2] is None
    first = out["lines"][0][0]
    assert first["confidence"] > 0.9 and 30 <= first["box"][0] <= 50 and first["box"][2] > first["box"][0]
    # 8 lines recognised in one width-sorted batch
    assert counts.counts["batch_sizes"] == {"8": 1} and counts.counts["ocr_lines"] == 8
    assert 0.5 < counts.counts["tokens"] / counts.counts["padded_tokens"] <= 1.0

    # batched == unbatched: recognising lines one at a time gives the same text and confidences
    from pipeline.images.decode import decode_image
    from pipeline.images.ocr_steps import crop_line

    image = decode_image(samples.text_page()).array
    crops = [crop_line(image, b, max_width=3200) for b in task.detect(loaded, image)]
    one_by_one = OcrTask(task.config, model=task.model, batching=BatchingConfig(batch_size=1))
    batched, single = task.recognize(loaded, crops), one_by_one.recognize(loaded, crops)
    assert [t for t, _ in batched] == [t for t, _ in single] == samples.DOC_LINES
    # the recogniser mixes columns globally (SVTR), so padding a line wider moves its confidence a little
    np.testing.assert_allclose([c for _, c in batched], [c for _, c in single], atol=0.05)
    # with fixed bucket shapes a line gets the same padded width in any batch: results agree to fp32
    shapes = [256, 512, 1024, 2048, 4096]
    bucketed = OcrTask(task.config, model=task.model, batching=BatchingConfig(batch_size=8, bucket_shapes=shapes))
    bucketed_one = OcrTask(task.config, model=task.model, batching=BatchingConfig(batch_size=1, bucket_shapes=shapes))
    b8, b1 = bucketed.recognize(loaded, crops), bucketed_one.recognize(loaded, crops)
    assert [t for t, _ in b8] == [t for t, _ in b1] == samples.DOC_LINES
    np.testing.assert_allclose([c for _, c in b8], [c for _, c in b1], rtol=1e-4)
