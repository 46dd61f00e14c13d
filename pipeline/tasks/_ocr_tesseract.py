"""The ``ocr`` kind's tesseract engine on the workers: open it once per worker, read a group's pages one by one.

:mod:`pipeline.images.ocr_tesseract` holds the engine (tesserocr's API, the
language data's folder); here it meets the task: the settings it is opened
with (``task.languages``, ``task.psm``, the task's threads) and the seconds of
its stages, counted per worker like PP-OCR's (``ocr_input_seconds``,
``ocr_recognize_seconds``, ``ocr_results_seconds``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pipeline.images.ocr_tesseract import TesseractEngine, find_tessdata, open_tesseract
from pipeline.core.metrics import WorkerCounts

__all__ = ["load_tesseract", "read_tesseract_pages", "tessdata_folder"]


def tessdata_folder(config: Any, spec: str) -> Path:
    """The folder of ``task.languages``' language data: ``model.path``, or the system's when it is empty."""
    return find_tessdata(spec, config.languages)


def load_tesseract(config: Any, datapath: Path, *, threads: int) -> TesseractEngine:
    """The worker's engine, opened once (the Spark glue caches what ``load`` returns per worker)."""
    return open_tesseract(datapath, languages=config.languages, psm=config.psm, threads=threads)


def read_tesseract_pages(engine: TesseractEngine, images: list[np.ndarray], dpis: list[int | None],
                         counts: WorkerCounts | None, seconds: dict[str, float]) -> list[list[dict[str, Any]]]:
    """Each page's lines (tesseract reads one page at a time; its own threads are ``OMP_THREAD_LIMIT``'s)."""
    engine.seconds = seconds
    lines = [engine.read_page(image, dpi=dpi) for image, dpi in zip(images, dpis)]
    if counts is not None:
        counts.add("ocr_lines", sum(len(page) for page in lines))
    return lines
