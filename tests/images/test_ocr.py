"""OCR: the pure pre/post-processing steps, and the real PP-OCRv4 ONNX models from the rapidocr wheel."""

from __future__ import annotations

import doctest

import numpy as np
import pyarrow as pa
import pytest

from pipeline.core.batching import padding_efficiency
from pipeline.config import BatchingConfig, ModelConfig
from pipeline.images import ocr_steps
from pipeline.images.ocr_layout import LineBox
from pipeline.images.ocr_lines import collate_lines, plan_line_batches
from pipeline.images.ocr_steps import boxes_from_probability
from pipeline.images.ocr_text import char_error_rate, ctc_decode
from pipeline.core.metrics import WorkerCounts
from pipeline.tasks.ocr import OcrConfig, OcrTask, find_ocr_models
from tests.support import image_samples as samples


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


@pytest.mark.beside  # no Spark: it balances the connector run
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
    from pipeline.images.ocr_lines import crop_line

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


# -- skewed, rotated, upside-down and noisy pages -------------------------------------------------------------------

def _render(lines_at, size=(1000, 560), font_size=26):
    """A white page with each ``(x, y, text)`` drawn in black (Pillow's built-in font), as an RGB array."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=font_size)
    for x, y, text in lines_at:
        draw.text((x, y), text, fill="black", font=font)
    return np.asarray(page)


def test_rotated_text_gives_a_rotated_box_and_a_level_crop():
    import cv2

    from pipeline.images.ocr_lines import crop_line

    prob = np.zeros((300, 400), np.float32)
    corners = cv2.boxPoints(((200.0, 150.0), (240.0, 16.0), -10.0))  # a 240 x 16 line kernel, climbing 10 degrees
    cv2.fillPoly(prob, [corners.round().astype(np.int32)], 0.9)
    (box,) = boxes_from_probability(prob, page_size=(300, 400))
    assert box.angle == pytest.approx(10.0, abs=1.0)
    assert box.length == pytest.approx(240 + 2 * 16 * 1.6 * 240 / (2 * 256), abs=12)  # grown by DB's unclip
    # an upright box around it would be far taller than the line: the rotated one is not
    assert box.thickness < 50 and box.height > 80
    # the perspective crop of a dark line drawn along the box comes out level: dark rows in the middle only
    page = np.full((300, 400, 3), 255, np.uint8)
    cv2.fillPoly(page, [cv2.boxPoints(((200.0, 150.0), (220.0, 8.0), -10.0)).round().astype(np.int32)], (0, 0, 0))
    crop = crop_line(page, box, max_width=2000)
    dark_rows = (crop.mean(axis=(1, 2)) < 128).nonzero()[0]
    assert crop.shape[0] == 48 and 6 <= len(dark_rows) <= 14 and 18 < dark_rows.mean() < 30  # 8 px of 45, level
    assert crop[dark_rows.min() : dark_rows.max() + 1, 30:-30].mean() < 60  # the whole line, not a diagonal


def test_reading_order_survives_skew_and_two_columns():
    from pipeline.images.ocr_layout import LineBox, reading_order
    from pipeline.images.scans import skew_page  # noqa: F401 - the same turn as the pages below

    title = [(50, 20, 950, 50)]
    left = [(50, 100 + 40 * i, 460, 125 + 40 * i) for i in range(5)]
    right = [(540, 100 + 40 * i, 950, 125 + 40 * i) for i in range(5)]
    footer = [(50, 330, 950, 360)]
    boxes = [LineBox.upright(*b) for b in title + left + right + footer]
    expected = list(range(len(boxes)))

    def turned(box, degrees):  # about the page centre (500, 200), y down, positive = counter-clockwise
        t = np.radians(degrees)
        pts = [(500 + (x - 500) * np.cos(t) + (y - 200) * np.sin(t), 200 - (x - 500) * np.sin(t) + (y - 200) * np.cos(t))
               for x, y in box.points]
        return LineBox(tuple(pts), box.score)

    for degrees in (0.0, 3.0, -3.0):
        skewed = [turned(b, degrees) for b in boxes]
        shuffled = [skewed[i] for i in np.random.default_rng(1).permutation(len(skewed))]
        assert [skewed.index(b) for b in reading_order(shuffled)] == expected, degrees
    # one column of short and long lines (a list, code) is not split into two
    one = [LineBox.upright(50, 20 + 30 * i, 300 if i % 2 else 900, 45 + 30 * i) for i in range(10)]
    assert reading_order(one[::-1]) == one


def _scan(image, *, skew, seed=0):
    from pipeline.images import scans

    page = scans.add_noise(scans.blur(scans.grayscale(scans.skew_page(image, skew)), 0.8), 12.0, seed=seed)
    return scans.jpeg_bytes(page, 50)


@pytest.mark.beside  # no Spark: it balances the connector run
def test_real_models_read_skewed_noisy_and_two_column_pages(real_ocr):
    """Rendered pages, skewed by 3 degrees either way with scan noise, blur and JPEG q50, read back in order."""
    from pipeline.images.decode import decode_image

    task, loaded = real_ocr
    title = "Two columns and a skew"
    left = ["Spark reads the pages", "onnx runs the models", "width sorted batches"]
    right = ["tesseract is the peer", "the bench counts errors", "every page is flagged"]
    page = _render([(40, 30, title)] + [(40, 110 + 60 * i, t) for i, t in enumerate(left)]
                   + [(560, 110 + 60 * i, t) for i, t in enumerate(right)])
    reference = "\n".join([title, *left, *right])
    clean = [decode_image(samples.text_page()).array]
    pages = [decode_image(_scan(page, skew=s, seed=i)).array for i, s in enumerate((3.0, -3.0))]
    texts = ["\n".join(line["text"] for line in lines) for lines in task.read_pages(loaded, clean + pages)]
    assert char_error_rate(texts[0], "\n".join(samples.DOC_LINES)) == 0.0
    for text in texts[1:]:
        assert char_error_rate(text, reference) < 0.05, text
        # every line, in reading order: the title, the left column, then the right one
        got = text.split("\n")
        assert len(got) == 7 and all(char_error_rate(a, b) < 0.2 for a, b in zip(got, [title, *left, *right])), got


@pytest.mark.beside  # no Spark: it balances the connector run
def test_real_models_read_an_upside_down_page_and_a_photo_at_an_angle(real_ocr):
    import cv2

    from pipeline.images.decode import decode_image
    from pipeline.images.scans import rotate_page

    task, loaded = real_ocr
    page = decode_image(samples.text_page()).array
    upside_down = rotate_page(page, 2)
    h, w = page.shape[:2]
    # a photo taken from below and to the left: the page is a trapezoid, turned 8 degrees
    src = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    dst = np.float32([[60, 40], [w + 20, 0], [w + 60, h + 30], [30, h + 60]])
    warp = cv2.getPerspectiveTransform(src, dst) @ np.vstack([cv2.getRotationMatrix2D((w / 2, h / 2), 8, 1.0), [0, 0, 1]])
    photo = cv2.warpPerspective(page, warp, (w + 120, h + 120), borderValue=(200, 200, 200))
    counts = WorkerCounts()
    out = task.read_pages(loaded, [upside_down, photo], counts)
    expected = "\n".join(samples.DOC_LINES)
    assert "\n".join(line["text"] for line in out[0]) == expected
    assert counts.counts["ocr_lines_turned"] == 4  # the upside-down page's lines, and none of the photo's
    assert char_error_rate("\n".join(line["text"] for line in out[1]), expected) < 0.05
    assert all(len(line["quad"]) == 8 for line in out[1])


@pytest.mark.beside  # no Spark: it balances the connector run
def test_real_models_on_a_big_scan_a_blank_page_and_a_multipage_tiff(real_ocr):
    """A page with a 600 dpi scan's line heights (the detector sees it capped at det_max_side, lines over 96 px
    high are shrunk with area averaging), a blank page (ok, no lines), a 2-page TIFF (both pages, their text
    joined by a form feed) and a 3-page TIFF past ``task.max_pages`` (the pages read, status truncated)."""
    import io

    from PIL import Image

    task, loaded = real_ocr
    task = OcrTask(task.config.model_copy(update={"det_max_side": 1280, "max_pages": 2}), model=task.model,
                   batching=task.batching)
    big = samples.text_page(size=(2400, 1100), font_size=90)
    blank = io.BytesIO()
    Image.new("RGB", (900, 420), "white").save(blank, "PNG")

    def tiff(*pages: list[str]) -> bytes:
        out = io.BytesIO()
        first, *more = (Image.open(io.BytesIO(samples.text_page(lines))) for lines in pages)
        first.save(out, "TIFF", save_all=True, append_images=more)
        return out.getvalue()

    chunk = pa.RecordBatch.from_arrays([pa.array(
        [big, blank.getvalue(), tiff(samples.DOC_LINES, ["second page"]), tiff(["one"], ["two"], ["three"])],
        pa.binary())], names=["content"])
    counts = WorkerCounts()
    out = task.process(loaded, chunk, counts).to_pydict()
    # progress counts the documents read (4), not the recognition batches' lines
    assert counts.counts["progress_rows"] == 4 and counts.counts["batch_rows"] > 4
    assert out["status"] == ["ok", "ok", "ok", "truncated"] and out["truncated"] == [False, False, False, True]
    assert out["n_lines"][1] == 0 and out["text"][1] == ""
    assert out["text"][0] == "\n".join(samples.DOC_LINES)
    assert out["text"][2] == "\n".join(samples.DOC_LINES) + "\fsecond page"
    assert out["n_lines"][2] == len(samples.DOC_LINES) + 1 and out["image_notes"][2] == "pages:2"
    assert out["text"][3] == "one\ftwo" and out["image_notes"][3] == "pages:2 of 3"
