"""``ocr``: page text and text lines (text, box, confidence) with the PP-OCRv4 ONNX models, on onnxruntime.

The models are the ones shipped inside the ``rapidocr-onnxruntime`` wheel
(``model.path: package:rapidocr_onnxruntime``), or any folder holding a
``*det*.onnx`` detector and a ``*rec*.onnx`` recogniser with its character
list in the ONNX metadata (``character``). rapidocr's own Python code is not
used (it needs OpenCV): pre- and post-processing are the numpy/scipy steps of
:mod:`pipeline.images.ocr_steps`. Both sessions are created once per Python
worker, on the CUDA provider when the task has a GPU and onnxruntime offers
it, else on the CPU with the task's threads.

Per group of pages (``task.pages_per_group``): each page is detected alone
(pages differ in shape); all its line crops, resized to 48 px high, join one
pool; the pool is **sorted by width and cut into ``batching.batch_size``-line
batches**, each padded to its widest line (``task.width_bucketing: false``
keeps arrival order, for comparison). Padding efficiency (real / padded pixel
columns) is counted like tokens and shown in the run summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.config import JobConfig, TaskConfig
from pipeline.images.decode import DEFAULT_MAX_PIXELS, DecodedImage
from pipeline.metrics import WorkerCounts
from pipeline.registry import ModelInfo, TaskJob, register_task
from pipeline.models.files import PACKAGE_PREFIX, files_revision, package_folder
from pipeline.tasks._images import ImageTask

__all__ = ["LoadedOcr", "OcrConfig", "OcrJob", "OcrTask", "find_ocr_models"]


class OcrConfig(TaskConfig):
    """OCR (PP-OCRv4 detection + recognition, onnxruntime): page text and per-line text, box and confidence."""

    kind: Literal["ocr"] = "ocr"
    # Nothing is left out of the task fingerprint, every batching key included (the default): padding a line
    # wider moves its confidence (tests/test_ocr.py), and min_confidence may then drop it.
    image_column: str = Field("content", description="the source column holding the image bytes, or its path/URI")
    image_input: Literal["bytes", "path"] = Field("bytes", description="`bytes` or `path` (read on the workers)")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, gt=0, description="larger images are refused before decoding")
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
    reference_column: str | None = Field(
        None, description="a column with the expected text (e.g. from pdftotext); adds a per-row `cer` "
        "and the overall character error rate to the summary")


@dataclass
class LoadedOcr:
    """The per-worker onnxruntime sessions and the recogniser's characters (index 0 is the CTC blank)."""

    det: Any
    rec: Any
    characters: list[str]
    provider: str

    @property
    def load_counts(self) -> dict[str, Any]:
        return {"ocr_provider": {self.provider: 1}}


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


class OcrTask(ImageTask):
    """Detect lines per page, recognise all lines of a group of pages in width-sorted fixed-size batches."""

    kind = "ocr"

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if config.reference_column:
            self.input_columns = (config.image_column, config.reference_column)

    def result_fields(self) -> list[pa.Field]:
        line = pa.struct([pa.field("text", pa.string()), pa.field("box", pa.list_(pa.int32())),
                          pa.field("confidence", pa.float32())])
        fields = [pa.field("text", pa.string()), pa.field("lines", pa.list_(line)), pa.field("n_lines", pa.int32())]
        if self.config.reference_column:
            fields.append(pa.field("cer", pa.float32()))
        return fields

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        """As every image task, plus the character error rate against ``reference_column`` when set."""
        from pipeline.images.ocr_steps import char_error_rate, normalize_text

        out = super().process(loaded, chunk, counts)
        if not self.config.reference_column:
            return out
        texts = out.column(out.schema.get_field_index("text")).to_pylist()
        refs = chunk.column(chunk.schema.get_field_index(self.config.reference_column)).to_pylist()
        cer: list[float | None] = []
        for text, ref in zip(texts, refs):
            if text is None or ref is None:
                cer.append(None)
                continue
            rate = char_error_rate(text, ref)
            ref_chars = len(normalize_text(ref))
            counts.add("cer_errors", rate * ref_chars)
            counts.add("cer_reference_chars", ref_chars)
            cer.append(rate)
        index = out.schema.get_field_index("cer")
        return out.set_column(index, out.schema.field(index), pa.array(cer, pa.float32()))

    def group_size(self) -> int:
        return self.config.pages_per_group

    def resolve_model_dir(self, spec: str) -> Path:
        return package_folder(spec) if spec.startswith(PACKAGE_PREFIX) else Path(spec).expanduser()

    def load(self, model_dir: Path, device: str) -> LoadedOcr:
        import onnxruntime as ort

        det_path, rec_path = find_ocr_models(model_dir)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            index = int(device.split(":")[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        else:
            options.intra_op_num_threads = _task_threads()
            options.inter_op_num_threads = 1
        det = ort.InferenceSession(str(det_path), sess_options=options, providers=providers)
        rec = ort.InferenceSession(str(rec_path), sess_options=options, providers=providers)
        meta = rec.get_modelmeta().custom_metadata_map
        if "character" not in meta:
            from pipeline.models.loading import ModelError

            raise ModelError(f"recogniser {rec_path} has no 'character' list in its ONNX metadata")
        characters = ["<blank>", *meta["character"].splitlines(), " "]
        return LoadedOcr(det, rec, characters, det.get_providers()[0])

    # -- the steps ------------------------------------------------------------------------------
    def detect(self, loaded: LoadedOcr, image: np.ndarray) -> list[Any]:
        """Line boxes of one page, in reading order."""
        from pipeline.images.ocr_steps import boxes_from_probability, detection_input, detection_size

        c = self.config
        size = detection_size(image.shape[0], image.shape[1], min_side=c.det_min_side, max_side=c.det_max_side)
        prob = loaded.det.run(None, {loaded.det.get_inputs()[0].name: detection_input(image, size)})[0][0, 0]
        return boxes_from_probability(prob, page_size=image.shape[:2], threshold=c.det_threshold,
                                      box_threshold=c.box_threshold, unclip_ratio=c.unclip_ratio)

    def recognize(self, loaded: LoadedOcr, crops: list[np.ndarray], counts: WorkerCounts | None = None
                  ) -> list[tuple[str, float]]:
        """``(text, confidence)`` per crop (in input order), batched by width."""
        from pipeline.batching import pad_multiple
        from pipeline.images.ocr_steps import collate_lines, ctc_decode, plan_line_batches

        widths = np.fromiter((c.shape[1] for c in crops), dtype=np.int64, count=len(crops))
        multiple = pad_multiple(self.batching.pad_to_multiple_of, "cuda" if loaded.provider.startswith("CUDA")
                                else "cpu")
        results: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        name = loaded.rec.get_inputs()[0].name
        for batch in plan_line_batches(widths, batch_size=self.batching.batch_size,
                                       sort_by_width=self.config.width_bucketing, multiple=max(multiple, 8),
                                       bucket_shapes=self.batching.bucket_shapes or None):
            probs = loaded.rec.run(None, {name: collate_lines(crops, batch)})[0]
            for i, res in zip(batch.indices, ctc_decode(probs, loaded.characters)):
                results[int(i)] = res
            if counts is not None:
                counts.add_batch(rows=batch.size, tokens=int(widths[batch.indices].sum()),
                                 padded_tokens=batch.padded_tokens)
        return results

    def run_group(self, loaded: LoadedOcr, images: list[DecodedImage], counts: WorkerCounts) -> list[dict[str, Any]]:
        from pipeline.images.ocr_steps import crop_line

        boxes_per_page = [self.detect(loaded, im.array) for im in images]
        crops, owners = [], []
        for page, (im, boxes) in enumerate(zip(images, boxes_per_page)):
            for box in boxes:
                crops.append(crop_line(im.array, box, max_width=self.config.max_line_width))
                owners.append(page)
        recognised = self.recognize(loaded, crops, counts) if crops else []
        counts.add("images_inferred", len(images))
        counts.add("ocr_lines", len(crops))
        lines: list[list[dict[str, Any]]] = [[] for _ in images]
        flat_boxes = [b for boxes in boxes_per_page for b in boxes]
        for page, box, (text, conf) in zip(owners, flat_boxes, recognised):
            if text.strip() and conf >= self.config.min_confidence:
                lines[page].append({"text": text, "box": [box.x0, box.y0, box.x1, box.y1], "confidence": conf})
        out = []
        for page_lines in lines:
            text = "\n".join(line["text"] for line in page_lines)
            out.append({"text": text, "lines": page_lines, "n_lines": len(page_lines), "n_tokens": len(text)})
        return out


def _task_threads() -> int:
    try:
        import torch  # the Spark glue sets torch's threads to the task's cores before loading

        return max(1, torch.get_num_threads())
    except ImportError:  # pragma: no cover
        return 1


class OcrJob(TaskJob):
    """Driver-side checks: the two ONNX files, fingerprinted for lineage; recogniser padding in the summary."""

    def model_info(self, config: JobConfig, task: Any) -> ModelInfo:
        folder = task.resolve_model_dir(config.model.path)
        det, rec = find_ocr_models(folder)
        name = config.model.name or f"{det.stem.replace('_det_infer', '')}+rec"
        return ModelInfo(config.model.path, name, files_revision([det, rec]))

    def summary_lines(self, spark: Any, config: JobConfig, counts: dict[str, Any],
                      model: ModelInfo) -> dict[str, str]:
        real, padded = int(counts.get("tokens", 0)), int(counts.get("padded_tokens", 0))
        eff = real / padded if padded else 1.0
        sort = "width-sorted" if config.task.width_bucketing else "arrival order"
        lines = {
            "pages read": f"{int(counts.get('images_inferred', 0)):,}, "
                          f"{int(counts.get('ocr_lines', 0)):,} lines detected",
            "recogniser padding": f"{eff:.3f} ({real:,} real / {padded:,} padded columns, {sort})",
        }
        ref_chars = float(counts.get("cer_reference_chars", 0))
        if ref_chars:
            lines["character error rate"] = (f"{counts.get('cer_errors', 0) / ref_chars:.4f} against "
                                             f"{config.task.reference_column} ({int(ref_chars):,} reference chars)")
        return lines


register_task(OcrConfig, OcrTask, job=OcrJob())
