"""Tesseract as an OCR engine, in process: one ``TessBaseAPI`` per Python worker, pages handed over as pixels.

The binding is tesserocr (the ``tesseract`` extra): its PyPI wheels carry
libtesseract and leptonica; a build against the system's library
(``pip install --no-binary tesserocr tesserocr``, with ``libtesseract-dev``)
uses the system's instead. Either way the language data (``<lang>.traineddata``)
comes from the machine: ``model.path`` when set, else ``$TESSDATA_PREFIX``,
else the folders the system packages install to (Debian's and Ubuntu's
``tesseract-ocr-<lang>``, Homebrew's, Conda's).

Why in process and not the CLI per page: the CLI loads the language model and
starts a process for every page; the API loads it once, and a decoded page is
handed over as its RGB bytes (no temporary file, no second decode). On the
same library the text is the CLI's, page for page (``bench/bench_ocr_scans.py``).

Tesseract built with OpenMP (Debian's is; the tesserocr wheels' is not) runs up
to 4 spinning threads per page, which oversubscribes a Spark task's cores.
:func:`open_tesseract` sets ``OMP_THREAD_LIMIT`` (to the task's threads) before
the library loads, unless the environment already says; OpenMP reads it once,
when the process's first OpenMP runtime loads, so where torch's came first (the
project's Spark workers import torch) a system-built binding needs
``OMP_THREAD_LIMIT`` in the executors' environment (docs/tasks/ocr.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ModelError

__all__ = ["TESSDATA_FOLDERS", "TesseractEngine", "find_tessdata", "open_tesseract", "tesseract_version"]

# where system packages put the language data (the first that holds every language wins)
TESSDATA_FOLDERS = (
    "/usr/share/tesseract-ocr/5/tessdata",  # Debian, Ubuntu
    "/usr/share/tesseract-ocr/4.00/tessdata",
    "/usr/share/tessdata",  # Fedora, Arch, Alpine
    "/usr/local/share/tessdata",  # built from source
    "/opt/homebrew/share/tessdata",  # Homebrew (Apple silicon)
    "/usr/local/opt/tesseract/share/tessdata",  # Homebrew (Intel)
)

INSTALL_HINT = ("install the language data (Debian/Ubuntu: apt-get install tesseract-ocr-{lang}; macOS: brew install "
                "tesseract tesseract-lang), or set model.path to a folder holding {lang}.traineddata")


def find_tessdata(spec: str, languages: str) -> Path:
    """The folder holding ``<lang>.traineddata`` for every language of ``languages`` (``eng+deu``).

    ``spec`` is ``model.path``: a folder, or empty to look in ``$TESSDATA_PREFIX`` and then
    :data:`TESSDATA_FOLDERS`. Raises :class:`ModelError` naming the missing language and the install line.

    >>> find_tessdata("/nowhere", "eng")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeline.errors.ModelError: tesseract language data eng.traineddata is not in /nowhere; install ...
    """
    langs = [lang for lang in languages.split("+") if lang]
    if spec:
        candidates = [Path(spec).expanduser()]
    else:
        env = os.environ.get("TESSDATA_PREFIX")
        candidates = ([Path(env), Path(env) / "tessdata"] if env else []) + [Path(p) for p in TESSDATA_FOLDERS]
    for folder in candidates:
        if all((folder / f"{lang}.traineddata").is_file() for lang in langs):
            return folder
    where = candidates[0] if spec else "$TESSDATA_PREFIX or " + ", ".join(TESSDATA_FOLDERS)
    first = candidates[0] if spec else None
    lacking = [lang for lang in langs if first is None or not (first / f"{lang}.traineddata").is_file()]
    lang = lacking[0] if lacking else langs[0]
    raise ModelError(f"tesseract language data {lang}.traineddata is not in {where}; "
                     + INSTALL_HINT.format(lang=lang))


def _import_tesserocr(threads: int | None = None) -> Any:
    if threads is not None:  # read once, when the library's OpenMP runtime loads (the import below)
        os.environ.setdefault("OMP_THREAD_LIMIT", str(max(1, threads)))
    try:
        import tesserocr
    except ImportError as exc:
        from pipeline.errors import MissingExtraError

        raise MissingExtraError(
            f"task.engine tesseract needs the tesserocr binding, which is not importable here ({exc}); install it "
            "on the driver and every executor: pip install 'spark-batch-inference[images,tesseract]' (its wheels "
            "carry libtesseract; the language data: apt-get install tesseract-ocr-eng)") from None
    return tesserocr


def tesseract_version() -> str:
    """The version of the libtesseract the binding runs, e.g. ``5.5.4``."""
    return _import_tesserocr().tesseract_version().split()[1]


@dataclass
class TesseractEngine:
    """One initialised ``PyTessBaseAPI`` and what it was opened with; :meth:`read_page` reads a page."""

    api: Any
    ril: Any
    iterate: Any
    version: str
    languages: str
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def load_counts(self) -> dict[str, Any]:
        return {"ocr_provider": {f"tesseract-{self.version}": 1}}

    def _timed(self, stage: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - started
        return now

    def read_page(self, image: np.ndarray, *, dpi: int | None = None) -> list[dict[str, Any]]:
        """The text lines of one RGB page in tesseract's reading order: ``{"text", "box", "quad", "confidence"}``
        (the box ``[x0, y0, x1, y1]``, the quad its corners, the confidence tesseract's mean over the line's
        words, 0-1). Seconds per stage add up in :attr:`seconds` (``input``, ``recognize``, ``results``)."""
        started = time.perf_counter()
        pixels = np.ascontiguousarray(image, dtype=np.uint8)
        height, width = pixels.shape[:2]
        self.api.SetImageBytes(pixels.tobytes(), width, height, 3, 3 * width)
        if dpi:
            self.api.SetSourceResolution(int(dpi))
        started = self._timed("input", started)
        self.api.Recognize()
        started = self._timed("recognize", started)
        lines = []
        level = self.ril.TEXTLINE
        iterator = self.api.GetIterator()
        for line in self.iterate(iterator, level) if iterator is not None else ():
            try:
                text = (line.GetUTF8Text(level) or "").rstrip("\n")
            except RuntimeError:  # tesserocr's "No text returned": a line region without recognised text
                continue
            box = line.BoundingBox(level)
            if not text.strip() or box is None:
                continue
            x0, y0, x1, y1 = (int(v) for v in box)
            lines.append({"text": text, "box": [x0, y0, x1, y1], "quad": [x0, y0, x1, y0, x1, y1, x0, y1],
                          "confidence": float(line.Confidence(level)) / 100.0})
        self.api.Clear()
        self._timed("results", started)
        return lines


def open_tesseract(datapath: Path, *, languages: str, psm: int, threads: int = 1) -> TesseractEngine:
    """Initialise tesseract once for a worker: the language data in ``datapath``, page segmentation mode ``psm``."""
    tesserocr = _import_tesserocr(threads)
    try:
        api = tesserocr.PyTessBaseAPI(path=str(datapath).rstrip("/") + "/", lang=languages,
                                      psm=int(psm), oem=tesserocr.OEM.DEFAULT)
    except RuntimeError as exc:
        raise ModelError(f"tesseract could not load languages {languages!r} from {datapath}: {exc}; "
                         + INSTALL_HINT.format(lang=languages.split("+")[0])) from None
    return TesseractEngine(api, tesserocr.RIL, tesserocr.iterate_level, tesseract_version(), languages)
