"""The ``ocr`` kind's settings: one config for both engines, and the keys each engine alone reads.

:mod:`pipeline.tasks.ocr` registers it with the task; a key of one engine set on a job of the
other is refused when the config is read, naming the key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config import TaskConfig
from pipeline.images.decode import DEFAULT_MAX_PIXELS

__all__ = ["OcrConfig", "PPOCR_KEYS", "TESSERACT_KEYS"]

# the keys only one engine reads: setting one for the other engine is refused
PPOCR_KEYS = frozenset({"width_bucketing", "det_min_side", "det_max_side", "det_threshold", "box_threshold",
                        "unclip_ratio", "min_confidence", "max_line_width", "use_direction", "direction_threshold",
                        "denoise_sigma", "denoise_threshold"})
TESSERACT_KEYS = frozenset({"languages", "psm"})


class OcrConfig(TaskConfig):
    """OCR (PP-OCRv4 detection + recognition on onnxruntime, or tesseract): page text and per-line text, box and
    confidence."""

    kind: Literal["ocr"] = "ocr"
    # Nothing is left out of the task fingerprint, every batching key included (the default): padding a line
    # wider moves its confidence (tests/images/test_ocr.py), and min_confidence may then drop it.
    engine: Literal["ppocr", "tesseract"] = Field(
        "ppocr", description="`ppocr` (PP-OCRv4 on onnxruntime: `model.path` its ONNX folder) or `tesseract` "
        "(libtesseract in process through tesserocr, the `tesseract` extra: `model.path` the folder of the "
        "`<lang>.traineddata` files, or empty for the system's); which to pick: docs/tasks/ocr.md")
    languages: str = Field(
        "eng", pattern=r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$",
        description="tesseract: the language packs, `+`-joined (`eng`, `eng+deu`); each needs its "
        "`<lang>.traineddata` (Debian: `apt-get install tesseract-ocr-<lang>`)")
    psm: int = Field(
        3, ge=1, le=13, description="tesseract: page segmentation mode (its `--psm`): 3 fully automatic (the "
        "CLI's default), 4 one column, 6 one block, 11 sparse text; 1 and 12 add orientation detection "
        "(`osd.traineddata`). 2 (layout only) is refused")
    image_column: str = Field("content", description="the source column holding the image bytes, or its path/URI")
    image_input: Literal["bytes", "path"] = Field("bytes", description="`bytes` or `path` (read on the workers)")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, gt=0, description="larger images are refused before decoding")
    max_pages: int = Field(
        100, gt=0, description="pages read of a multi-page TIFF (all of them within task.max_pixels in total); "
        "a document cut short by either limit is written with status `truncated` and the pages read")
    pages_per_group: int = Field(
        8, gt=0, description="pages whose line crops are pooled, width-sorted and batched together")
    width_bucketing: bool = Field(True, description="sort line crops by width before batching (less padding)")
    det_min_side: int = Field(736, gt=0, description="the detector sees the page's shorter side at least this big")
    det_max_side: int = Field(2000, gt=0, description="and its longer side at most this big")
    det_threshold: float = Field(0.3, gt=0, lt=1, description="text probability that marks a pixel as text")
    box_threshold: float = Field(0.5, gt=0, lt=1, description="least mean probability of a kept line box")
    unclip_ratio: float = Field(1.6, gt=0, description="how far a detected text kernel grows into its box")
    min_confidence: float = Field(
        0.5, ge=0, le=1, description="recognised lines below this confidence are dropped (PP-OCR's text_score)")
    max_line_width: int = Field(3200, gt=0, description="widest line crop, in pixels at 48 px height")
    use_direction: bool = Field(
        True, description="PP-OCR's text-direction classifier (the model folder's *cls*.onnx) turns upside-down "
        "lines; a page whose lines are mostly upside down is read in its turned order")
    direction_threshold: float = Field(0.9, gt=0, lt=1, description="least classifier score to turn a line")
    denoise_sigma: float = Field(
        1.0, ge=0, description="Gaussian blur (px, on the 48 px crop) of the line crops of a noisy page: scans "
        "lose fewer spaces between words; 0 turns it off")
    denoise_threshold: float = Field(
        0.25, ge=0, le=1, description="a page is noisy when this share of its background pixels is off by 3+ levels")
    reference_column: str | None = Field(
        None, description="a column with the expected text (e.g. from pdftotext); adds a per-row `cer` "
        "and the overall character error rate to the summary")

    @model_validator(mode="after")
    def _engine_keys(self) -> "OcrConfig":
        other = TESSERACT_KEYS if self.engine == "ppocr" else PPOCR_KEYS
        if self.psm == 2:
            raise ValueError("task.psm 2 finds the layout and reads no text; use 3 (automatic) or 1 (with OSD)")
        wrong = sorted(self.model_fields_set & other)
        if wrong:
            raise ValueError(f"task.{wrong[0]} is a setting of the other engine; task.engine is {self.engine!r} "
                             f"(its keys: docs/tasks/ocr.md): remove {', '.join('task.' + k for k in wrong)}")
        return self
