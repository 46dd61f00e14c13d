"""Image tasks end to end on Spark: image files or tables of bytes/paths -> run_job -> Delta, read back."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pipeline.config import build_config
from pipeline.runner import run_job
from tests.support import image_samples as samples

from tests.support.data import write_delta


@pytest.fixture(scope="module")
def tiny_image_model(tmp_path_factory):
    return samples.build_tiny_classifier(tmp_path_factory.mktemp("models") / "tiny-lite")


def poison_png() -> bytes:
    """A valid PNG whose text chunk holds the drill's poison marker."""
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "POISONPILL")
    buf = io.BytesIO()
    Image.fromarray(samples.pattern(9)).save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def image_job(tmp_path: Path, model: Path, source: dict, task: dict | None = None, **sections):
    data = {
        "job": "images_test",
        "spark": {"arrow_max_records_per_batch": 8},
        "source": source,
        "model": {"path": str(model)},
        "task": {"kind": "classify_image", "top_k": 2, **(task or {})},
        "batching": {"batch_size": 4},
        "sink": {"path": str(tmp_path / "labels"), "mode": "append"},
        "run": {"progress": False, "ds": "2026-11-30"},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return build_config(data)


def read(path: Path) -> list[dict]:
    return pa.table(DeltaTable(str(path)).to_pyarrow_table()).to_pylist()


@pytest.mark.slow  # a Spark job over 15 files (~30 s on an idle 2-core machine, more when shared)
def test_folder_of_images_with_every_bad_class_and_a_poison_image(spark, tmp_path, tiny_image_model):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    for i in range(6):
        # a space and a "#" in names: the 0-byte file recovery must match paths exactly (no duplicates)
        (folder / ("sub" if i % 2 else ".") / f"good #{i}.jpg").write_bytes(samples.jpeg(i))
    for name, blob in samples.bad_image_set().items():
        if blob is not None:
            (folder / f"bad_{name}.img").write_bytes(blob)
    (folder / "poison.png").write_bytes(poison_png())
    out = io.StringIO()
    config = image_job(tmp_path, tiny_image_model, {"format": "binary_file", "path": str(folder)},
                       run={"faults": {"poison_marker": "POISONPILL"}, "max_error_fraction": 0.1})  # 1 of 15
    assert config.source.id_column == "path"  # binary_file: the file path is the id
    summary = run_job(config, spark=spark, out=out)

    assert summary.rows_in == 6 + 8 + 1 and summary.complete
    assert summary.rows_out == 14 and summary.rows_quarantined == 1
    rows = {Path(r["path"].removeprefix("file:")).name: r for r in read(tmp_path / "labels")}
    assert len(rows) == 14
    expected = {"bad_empty.img": "skipped_empty", "bad_not_image.img": "invalid_image",
                "bad_truncated.img": "invalid_image", "bad_bomb.img": "too_large",
                "bad_cmyk.img": "ok", "bad_png16.img": "ok", "bad_animated.img": "ok", "bad_exif.img": "ok"}
    for name, status in expected.items():
        assert rows[name]["status"] == status, (name, rows[name]["error"])
    assert "decompression bomb" in rows["bad_bomb.img"]["error"]
    assert rows["bad_exif.img"]["image_notes"] == "exif:orientation 6" and rows["bad_exif.img"]["width"] == 96
    for i in range(6):
        row = rows[f"good #{i}.jpg"]
        assert row["status"] == "ok" and row["label"] in ("cat", "dog", "cup", "car") and len(row["top_k"]) == 2
        assert row["model_name"] == "tiny-lite" and row["ds"].isoformat() == "2026-11-30"
    quarantined = read(tmp_path / "labels_quarantine")
    assert len(quarantined) == 1 and quarantined[0]["status"] == "error"
    assert "injected poison row" in quarantined[0]["error"]
    assert quarantined[0]["input_content"] == poison_png()  # the poison image itself is kept
    text = out.getvalue()
    # 11 decodable images, of which the poison one failed: 10 classified
    assert re.search(r"images classified\s*: 10 ", text) and "every input row written once" in text


@pytest.mark.slow  # two Spark jobs
def test_tables_of_image_bytes_and_of_image_paths(spark, tmp_path, tiny_image_model):
    paths = []
    for i in range(3):
        p = tmp_path / f"p{i}.png"
        p.write_bytes(samples.png(i))
        paths.append(str(p))
    write_delta(tmp_path / "by_path", pa.table({"image_id": ["a", "b", "c", "d"],
                                                "uri": [paths[0], Path(paths[1]).as_uri(), paths[2],
                                                        str(tmp_path / "gone.png")]}))
    write_delta(tmp_path / "by_bytes", pa.table({"image_id": ["a", "b", "c", "d"],
                                                 "image": pa.array([samples.png(0), samples.png(1), samples.png(2),
                                                                    None], pa.binary())}))
    run_job(image_job(tmp_path, tiny_image_model, {"format": "delta", "path": str(tmp_path / "by_path"),
                                                   "id_column": "image_id"},
                      {"image_column": "uri", "image_input": "path", "store_embedding": True},
                      sink={"path": str(tmp_path / "from_paths")}), spark=spark, out=io.StringIO())
    run_job(image_job(tmp_path, tiny_image_model, {"format": "delta", "path": str(tmp_path / "by_bytes"),
                                                   "id_column": "image_id"}, {"image_column": "image"},
                      sink={"path": str(tmp_path / "from_bytes")}), spark=spark, out=io.StringIO())
    by_path = {r["image_id"]: r for r in read(tmp_path / "from_paths")}
    by_bytes = {r["image_id"]: r for r in read(tmp_path / "from_bytes")}
    assert [by_path[k]["status"] for k in "abcd"] == ["ok", "ok", "ok", "missing_file"]
    assert [by_bytes[k]["status"] for k in "abcd"] == ["ok", "ok", "ok", "skipped_null"]
    for k in "abc":  # the same pixels, read from a path or stored in the table: the same result
        assert by_path[k]["label"] == by_bytes[k]["label"]
        assert by_path[k]["score"] == pytest.approx(by_bytes[k]["score"], rel=1e-5)
        assert len(by_path[k]["embedding"]) == 1280


@pytest.mark.slow  # a Spark job with the real OCR models
def test_real_ocr_models_on_spark_with_cer(spark, tmp_path):
    pages = tmp_path / "pages"
    pages.mkdir()
    (pages / "p1.png").write_bytes(samples.text_page())
    (pages / "p2.png").write_bytes(samples.text_page(samples.DOC_LINES[::-1]))
    write_delta(tmp_path / "page_table", pa.table({
        "page_id": ["p1", "p2"], "path": [str(pages / "p1.png"), str(pages / "p2.png")],
        "reference_text": [" ".join(samples.DOC_LINES), " ".join(samples.DOC_LINES[::-1])],
    }))
    out = io.StringIO()
    config = build_config({
        "job": "ocr_test", "source": {"format": "delta", "path": str(tmp_path / "page_table"), "id_column": "page_id"},
        "model": {"path": "package:rapidocr_onnxruntime"},
        "task": {"kind": "ocr", "image_column": "path", "image_input": "path", "reference_column": "reference_text",
                 "det_min_side": 480},
        "batching": {"batch_size": 8},
        "sink": {"path": str(tmp_path / "text"), "mode": "append"},
        "run": {"progress": False, "ds": "2026-11-30"},
    })
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and summary.status == {"ok": 2}
    rows = {r["page_id"]: r for r in read(tmp_path / "text")}
    assert rows["p1"]["text"].splitlines() == samples.DOC_LINES
    assert rows["p2"]["text"].splitlines() == samples.DOC_LINES[::-1]
    assert rows["p1"]["cer"] == 0.0 and rows["p1"]["n_lines"] == 4
    assert [line["text"] for line in rows["p1"]["lines"]] == samples.DOC_LINES
    text = out.getvalue()
    assert re.search(r"character error rate\s*: 0.0000", text) and "recogniser padding" in text
    assert re.search(r"seconds per page\s*: detect \d", text) and len(rows["p1"]["lines"][0]["quad"]) == 8
