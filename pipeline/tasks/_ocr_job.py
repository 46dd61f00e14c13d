"""The ``ocr`` kind's driver side: its model files, the counters its workers emit, its summary lines.

:mod:`pipeline.tasks.ocr` holds the config and the worker side and registers
:class:`OcrJob` with them; the job checks and fingerprints the ONNX files
before any work, and reads the run's :class:`OcrCounts` (pages, lines, the
seconds of each stage, the character error rate's sums) for the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from pipeline.config import JobConfig
from pipeline.models.files import files_revision
from pipeline.core.run_counts import RunCounts, TaskCounts, counter
from pipeline.tasks.job import ModelInfo, TaskJob, executor_model_path

__all__ = ["STAGES", "TESSERACT_STAGES", "OcrCounts", "OcrJob", "find_direction_model", "find_ocr_models",
           "stage_counter"]

# the stages whose seconds each worker counts (a counter each: stage_counter); PP-OCR's, in order
STAGES = ("detect", "boxes", "crops", "direction", "recognize")
# the tesseract engine's: the page handed to it, its own work (``recognize``, the same counter), its lines read back
TESSERACT_STAGES = ("input", "recognize", "results")


def stage_counter(stage: str) -> str:
    """The counter of a stage's worker seconds (the key the workers add them under).

    >>> stage_counter("detect")
    'ocr_detect_seconds'
    """
    return f"ocr_{stage}_seconds"


# one seconds counter per stage of either engine, declared from the stages above (a new stage is a new counter)
_StageSeconds = make_dataclass(
    "_StageSeconds", [(stage_counter(stage), float, counter(default=0.0))
                      for stage in dict.fromkeys(STAGES + TESSERACT_STAGES)],
    bases=(TaskCounts,), frozen=True)


@dataclass(frozen=True)
class OcrCounts(_StageSeconds):  # type: ignore[misc,valid-type]
    """What an ``ocr`` run's workers count besides every kind's counters (:class:`~pipeline.core.run_counts.RunCounts`).

    The seconds of each stage (:data:`STAGES`, :data:`TESSERACT_STAGES`) are the counters ``ocr_<stage>_seconds``
    (:func:`stage_counter`), read per engine with :attr:`stage_seconds` and :attr:`tesseract_seconds`.

    >>> c = RunCounts.from_merged({"images_inferred": 2, "ocr_detect_seconds": 1.5}, task=OcrCounts).task
    >>> c.images_inferred, c.stage_seconds["detect"], sorted(c.stage_seconds) == sorted(STAGES)
    (2, 1.5, True)
    >>> c.tesseract_seconds
    {'input': 0.0, 'recognize': 0.0, 'results': 0.0}
    """

    images_inferred: int = 0
    ocr_lines: int = 0
    ocr_lines_turned: int = 0
    # the character error rate against task.reference_column: errors (rate x reference chars) and chars
    cer_errors: float = 0.0
    cer_reference_chars: int = 0
    # model loads per onnxruntime provider
    ocr_provider: dict[str, int] = field(default_factory=dict)

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Worker seconds per stage, in :data:`STAGES` order."""
        return self._seconds(STAGES)

    @property
    def tesseract_seconds(self) -> dict[str, float]:
        """The tesseract engine's worker seconds per stage: the page handed over, its own work, the lines read."""
        return self._seconds(TESSERACT_STAGES)

    def _seconds(self, stages: tuple[str, ...]) -> dict[str, float]:
        return {stage: getattr(self, stage_counter(stage)) for stage in stages}


def find_ocr_models(folder: Path) -> tuple[Path, Path]:
    """The ``(detector, recogniser)`` ONNX files of an OCR model folder."""
    from pipeline.models.loading import ModelError

    if not folder.is_dir():
        raise ModelError(f"OCR model folder {folder} does not exist; set model.path to a folder with "
                         "*det*.onnx and *rec*.onnx, or to package:rapidocr_onnxruntime")
    onnx = sorted(folder.glob("*.onnx"))
    det = [p for p in onnx if "det" in p.name]
    rec = [p for p in onnx if "rec" in p.name]
    if len(det) != 1 or len(rec) != 1:
        raise ModelError(f"OCR model folder {folder} needs exactly one *det*.onnx and one *rec*.onnx; "
                         f"found {[p.name for p in onnx] or 'no .onnx files'}")
    return det[0], rec[0]


def find_direction_model(folder: Path) -> Path | None:
    """The folder's ``*cls*.onnx`` text-direction classifier, if it has exactly one."""
    found = sorted(folder.glob("*cls*.onnx")) if folder.is_dir() else []
    return found[0] if len(found) == 1 else None


class OcrJob(TaskJob):
    """Driver-side checks: the two ONNX files, fingerprinted for lineage; recogniser padding in the summary."""

    def model_info(self, config: JobConfig, task: Any) -> ModelInfo:
        if config.task.engine == "tesseract":
            return _tesseract_info(config, task)
        folder = task.resolve_model_dir(config.model.path)
        det, rec = find_ocr_models(folder)
        cls = find_direction_model(folder) if config.task.use_direction else None
        name = config.model.name or f"{det.stem.replace('_det_infer', '')}+rec" + ("+cls" if cls else "")
        return ModelInfo(executor_model_path(config.model.path), name, files_revision([det, rec] + ([cls] if cls else [])))

    counters = OcrCounts

    def summary_lines(self, spark: Any, config: JobConfig, counts: RunCounts,
                      model: ModelInfo) -> dict[str, str]:
        ocr: OcrCounts = counts.task  # type: ignore[assignment]
        real, padded = int(counts.tokens), int(counts.padded_tokens)
        eff = real / padded if padded else 1.0
        tesseract = config.task.engine == "tesseract"
        lines = {"pages read": f"{int(ocr.images_inferred):,}, {int(ocr.ocr_lines):,} lines "
                               + ("read" if tesseract else "detected")}
        if not tesseract:
            sort = "width-sorted" if config.task.width_bucketing else "arrival order"
            lines["recogniser padding"] = f"{eff:.3f} ({real:,} real / {padded:,} padded columns, {sort})"
        stage_seconds = ocr.tesseract_seconds if tesseract else ocr.stage_seconds
        if any(stage_seconds.values()):
            pages = max(int(ocr.images_inferred), 1)
            lines["seconds per page"] = ", ".join(f"{s} {v / pages:.2f}" for s, v in stage_seconds.items()) + (
                " (worker seconds)" if tesseract else
                f" (worker seconds; {int(ocr.ocr_lines_turned):,} lines turned upside up)")
        ref_chars = float(ocr.cer_reference_chars)
        if ref_chars:
            lines["character error rate"] = (f"{ocr.cer_errors / ref_chars:.4f} against "
                                             f"{config.task.reference_column} ({int(ref_chars):,} reference chars)")
        return lines


def _tesseract_info(config: JobConfig, task: Any) -> ModelInfo:
    """The tesseract engine's lineage: the library's version (in the name) and the language data's bytes.

    The executors find the same language data from ``model.path``, or their own system's when it is empty.
    """
    from pipeline.images.ocr_tesseract import tesseract_version

    folder = task.resolve_model_dir(config.model.path)  # every language's data, or an error naming the install
    files = [folder / f"{lang}.traineddata" for lang in config.task.languages.split("+")]
    name = config.model.name or f"tesseract-{tesseract_version()}:{config.task.languages}"
    spec = executor_model_path(config.model.path) if config.model.path else ""
    return ModelInfo(spec, name, files_revision(files))
