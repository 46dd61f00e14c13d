"""The ocr task's tesseract engine: settings, the errors that name the fix, pages read into PP-OCR's columns,
the CLI's text, and a job and ``score(df)`` on Spark giving the same rows.

The engine tests need tesserocr (the ``tesseract`` extra) and English language data (Debian's
``tesseract-ocr-eng``, which ``.ci/run`` installs with ``tesseract-ocr``); without them they skip.
"""

from __future__ import annotations

import doctest
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from pipeline.config import BatchingConfig, ModelConfig, build_config
from pipeline.errors import MissingExtraError, ModelError
from pipeline.images import ocr_tesseract
from pipeline.images.decode import decode_image
from pipeline.images.ocr_tesseract import find_tessdata
from pipeline.images.ocr_text import char_error_rate, normalize_text
from pipeline.core.metrics import WorkerCounts
from pipeline.tasks.ocr import OcrConfig, OcrTask
from tests.support import image_samples as samples


def _engine_available() -> str | None:
    try:
        import tesserocr  # noqa: F401
    except ImportError:
        return "tesserocr is not installed (the tesseract extra)"
    try:
        find_tessdata("", "eng")
    except ModelError:
        return "no eng.traineddata (apt-get install tesseract-ocr-eng)"
    return None


needs_engine = pytest.mark.skipif(_engine_available() is not None, reason=str(_engine_available()))


def tesseract_task(**settings) -> OcrTask:
    return OcrTask(OcrConfig(engine="tesseract", **settings), model=ModelConfig(path=""),
                   batching=BatchingConfig(batch_size=4))


def test_doctests():
    assert doctest.testmod(ocr_tesseract).failed == 0


def test_each_engine_refuses_the_other_engines_keys():
    with pytest.raises(ValidationError, match="task.det_min_side is a setting of the other engine; task.engine is "
                                              "'tesseract'"):
        OcrConfig(engine="tesseract", det_min_side=480)
    with pytest.raises(ValidationError, match="task.psm is a setting of the other engine; task.engine is 'ppocr'"):
        OcrConfig(psm=6)
    with pytest.raises(ValidationError, match="task.psm 2 finds the layout and reads no text"):
        OcrConfig(engine="tesseract", psm=2)
    with pytest.raises(ValidationError, match="languages"):
        OcrConfig(engine="tesseract", languages="eng; rm -rf /")
    assert OcrConfig(engine="tesseract", languages="eng+deu", psm=6).psm == 6
    # the job asks for the binding's extra only with the tesseract engine
    assert OcrTask.extras(OcrConfig(engine="tesseract"), None) == ("images", "tesseract")
    assert OcrTask.extras(OcrConfig(), None) == ("images",)


def test_missing_language_data_names_the_install_line(tmp_path, monkeypatch):
    with pytest.raises(ModelError, match=r"deu.traineddata is not in .*apt-get install tesseract-ocr-deu"):
        find_tessdata(str(tmp_path), "deu")
    (tmp_path / "eng.traineddata").write_bytes(b"x")
    assert find_tessdata(str(tmp_path), "eng") == tmp_path
    # the second language missing is the one named
    with pytest.raises(ModelError, match="tesseract-ocr-fra"):
        find_tessdata(str(tmp_path), "eng+fra")
    # no model.path: $TESSDATA_PREFIX first
    monkeypatch.setenv("TESSDATA_PREFIX", str(tmp_path))
    assert find_tessdata("", "eng") == tmp_path


def test_a_missing_binding_names_the_pip_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "tesserocr", None)  # an import of it now fails as on a machine without it
    with pytest.raises(MissingExtraError, match=r"pip install 'spark-batch-inference\[images,tesseract\]'"):
        ocr_tesseract.open_tesseract(Path("/usr/share"), languages="eng", psm=3)


def test_decode_keeps_the_resolution_a_file_states():
    from PIL import Image

    buf = io.BytesIO()
    Image.open(io.BytesIO(samples.text_page())).save(buf, "PNG", dpi=(300, 300))
    assert decode_image(buf.getvalue()).dpi == 300
    assert decode_image(samples.jpeg(0)).dpi is None


def _tiff(*pages: list[str]) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    first, *more = (Image.open(io.BytesIO(samples.text_page(lines))) for lines in pages)
    first.save(out, "TIFF", save_all=True, append_images=more)
    return out.getvalue()


@needs_engine
def test_tesseract_reads_pages_into_the_columns_of_the_default_engine():
    task = tesseract_task()
    loaded = task.load(task.resolve_model_dir(""), "cpu")
    pages = [samples.text_page(), samples.text_page(samples.DOC_LINES[::-1]), b"", samples.truncated_jpeg(),
             b"not an image", _tiff(samples.DOC_LINES[:2], ["second page"])]
    counts = WorkerCounts()
    out = task.process(loaded, pa.RecordBatch.from_arrays([pa.array(pages, pa.binary())], names=["content"]), counts)
    default = OcrTask(OcrConfig(), model=ModelConfig(path="package:rapidocr_onnxruntime"), batching=BatchingConfig())
    assert out.schema == default.output_schema()
    rows = out.to_pylist()
    assert [r["status"] for r in rows] == ["ok", "ok", "skipped_empty", "invalid_image", "invalid_image", "ok"]
    assert rows[0]["text"] == "\n".join(samples.DOC_LINES)
    assert rows[1]["text"] == "\n".join(samples.DOC_LINES[::-1])
    assert rows[5]["text"] == "\n".join(samples.DOC_LINES[:2]) + "\fsecond page"
    assert rows[5]["n_lines"] == 3 and rows[5]["image_notes"] == "pages:2"
    assert all(r["text"] is None and r["error"] for r in rows[2:5])
    lines = rows[0]["lines"]
    assert [line["text"] for line in lines] == samples.DOC_LINES and rows[0]["n_lines"] == 4
    assert all(0.5 < line["confidence"] <= 1.0 for line in lines)
    tops = [line["box"][1] for line in lines]
    assert tops == sorted(tops) and all(b["box"][0] < b["box"][2] and len(b["quad"]) == 8 for b in lines)
    assert 30 <= lines[0]["box"][0] <= 50  # the page draws its lines at x = 40
    assert counts.counts["images_inferred"] == 4 and counts.counts["ocr_lines"] == 4 + 4 + 3
    assert counts.counts["ocr_recognize_seconds"] > 0 and counts.counts["ocr_input_seconds"] > 0
    assert "padded_tokens" not in counts.counts  # no recognition batches: nothing padded


@needs_engine
def test_page_segmentation_mode_reaches_tesseract():
    page = samples.text_page(samples.DOC_LINES[:3])
    chunk = pa.RecordBatch.from_arrays([pa.array([page], pa.binary())], names=["content"])
    auto, one_line = tesseract_task(), tesseract_task(psm=7)  # 7: the image is one text line
    read = [t.process(t.load(t.resolve_model_dir(""), "cpu"), chunk, WorkerCounts()).to_pylist()[0]
            for t in (auto, one_line)]
    # as one line, three lines of text are no line tesseract can read (or one garbled line): not the page's text
    assert read[0]["n_lines"] == 3 and read[1]["status"] == "ok" and read[1]["n_lines"] <= 1
    assert read[1]["text"] != read[0]["text"]


@needs_engine
@pytest.mark.skipif(shutil.which("tesseract") is None, reason="no tesseract CLI (apt-get install tesseract-ocr)")
def test_the_engine_reads_what_the_cli_reads(tmp_path):
    """In process and through the CLI, the same page file gives the same text (to the character on the same
    library version; on another, within a small distance: the bench measures real pages)."""
    task = tesseract_task()
    loaded = task.load(task.resolve_model_dir(""), "cpu")
    lines = [f"Invoice {n:05d}: {n * 3} items, total {n * 7.25:.2f} EUR" for n in (17, 4711, 90210)]
    path = tmp_path / "page.png"
    path.write_bytes(samples.text_page(lines + samples.DOC_LINES[:2], size=(1100, 520)))
    cli = subprocess.run(["tesseract", str(path), "stdout"], check=True, capture_output=True, text=True).stdout
    decoded = decode_image(path.read_bytes())
    ours = "\n".join(line["text"] for line in task.read_pages(loaded, [decoded.array], dpis=[decoded.dpi])[0])
    cli_version = subprocess.run(["tesseract", "--version"], capture_output=True, text=True).stdout.split()[1]
    if cli_version == ocr_tesseract.tesseract_version():
        assert normalize_text(ours) == normalize_text(cli)
    else:
        assert char_error_rate(ours, cli) < 0.02
    assert char_error_rate(ours, "\n".join(lines + samples.DOC_LINES[:2])) < 0.02


@needs_engine
def test_a_job_and_score_df_read_the_same_rows(spark, tmp_path):
    from deltalake import DeltaTable

    from pipeline import score
    from pipeline.runner import run_job
    from tests.support.data import write_delta

    pages = [samples.text_page(), samples.text_page(samples.DOC_LINES[::-1]), b"not an image", b""]
    refs = [" ".join(samples.DOC_LINES), " ".join(samples.DOC_LINES[::-1]), None, None]
    ids = ["p1", "p2", "bad", "empty"]
    write_delta(tmp_path / "pages", pa.table({"page_id": ids, "content": pa.array(pages, pa.binary()),
                                              "reference_text": refs}))
    out = io.StringIO()
    settings = {"kind": "ocr", "engine": "tesseract", "reference_column": "reference_text"}
    config = build_config({
        "job": "ocr_tesseract_test",
        "source": {"format": "delta", "path": str(tmp_path / "pages"), "id_column": "page_id"},
        "model": {}, "task": settings, "sink": {"path": str(tmp_path / "text"), "mode": "append"},
        "run": {"progress": False, "ds": "2026-12-06"},
    })
    summary = run_job(config, spark=spark, out=out)
    assert summary.complete and summary.status == {"ok": 2, "invalid_image": 1, "skipped_empty": 1}
    job_rows = {r["page_id"]: r for r in DeltaTable(str(tmp_path / "text")).to_pyarrow_table().to_pylist()}
    assert set(job_rows) == set(ids)  # rows in = rows out: the bad pages are written with their status
    assert job_rows["p1"]["text"].splitlines() == samples.DOC_LINES and job_rows["p1"]["cer"] == 0.0
    assert job_rows["p1"]["model_name"].startswith("tesseract-") and job_rows["p1"]["model_name"].endswith(":eng")
    text = out.getvalue()
    assert re.search(r"character error rate\s*: 0.0000 against reference_text", text)
    assert "seconds per page" in text and "input" in text and "recogniser padding" not in text

    df = spark.createDataFrame([(i, bytearray(p), r) for i, p, r in zip(ids, pages, refs)],
                               "page_id string, content binary, reference_text string")
    scored = {r["page_id"]: r.asDict(recursive=True) for r in score(df, settings, id_column="page_id").collect()}
    assert set(scored) == set(ids)
    for key in ("text", "n_lines", "status", "cer", "width", "height", "model_revision", "task_fingerprint"):
        assert {i: scored[i][key] for i in ids} == {i: job_rows[i][key] for i in ids}, key
    assert scored["p2"]["lines"] == job_rows["p2"]["lines"]
