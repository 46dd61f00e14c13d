"""``ocr``: page text and text lines (text, box, confidence), with PP-OCRv4 on onnxruntime or with tesseract.

``task.engine: tesseract`` reads each page with libtesseract in process
(:mod:`pipeline.tasks._ocr_tesseract`), into the same output columns; the rest
of this docstring is the default engine, ``ppocr``.

The models are the ones shipped inside the ``rapidocr-onnxruntime`` wheel
(``model.path: package:rapidocr_onnxruntime``), or any folder holding a
``*det*.onnx`` detector and a ``*rec*.onnx`` recogniser with its character
list in the ONNX metadata (``character``), and optionally a ``*cls*.onnx``
text-direction classifier (0 or 180 degrees). Pre- and post-processing are
the OpenCV/pyclipper steps of :mod:`pipeline.images.ocr_steps` (PP-OCR's DB
post-processing, rotated boxes, perspective crops, a skew- and column-aware
reading order). The sessions are created once per Python worker, on the CUDA
provider when the task has a GPU and onnxruntime offers it, else on the CPU
with the task's cores as intra-op threads and full graph optimisation.

Per group of pages (``task.pages_per_group``): each page is detected alone
(pages differ in shape); all its line crops, resized to 48 px high, join one
pool; the direction classifier turns upside-down lines (and a page whose
lines are mostly upside down is read in its turned order); the pool is
**sorted by width and cut into ``batching.batch_size``-line batches**, each
padded to its widest line (``task.width_bucketing: false`` keeps arrival
order, for comparison). Padding efficiency (real / padded pixel columns) is
counted like tokens, and the seconds of each stage (detect, boxes, crops,
direction, recognise) are counted per worker; both show in the run summary.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from pipeline.images.decode import DecodedImage
from pipeline.core.metrics import WorkerCounts
from pipeline.models.files import PACKAGE_PREFIX, package_folder
from pipeline.registry import register_task
from pipeline.tasks._images import ImageTask
from pipeline.tasks._ocr_config import OcrConfig
from pipeline.tasks._ocr_job import STAGES, OcrJob, find_direction_model, find_ocr_models, stage_counter

__all__ = ["LoadedOcr", "OcrConfig", "OcrJob", "OcrTask", "STAGES", "StageTimer", "find_direction_model", "find_ocr_models"]


@dataclass
class LoadedOcr:
    """The per-worker onnxruntime sessions and the recogniser's characters (index 0 is the CTC blank)."""

    det: Any
    rec: Any
    characters: list[str]
    provider: str
    cls: Any = None
    threads: int = 1

    @property
    def load_counts(self) -> dict[str, Any]:
        return {"ocr_provider": {self.provider: 1}}


class OcrTask(ImageTask):
    """Detect lines per page, recognise all lines of a group of pages in width-sorted fixed-size batches."""

    kind = "ocr"

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if config.reference_column:
            self.input_columns = (config.image_column, config.reference_column)

    def result_fields(self) -> list[pa.Field]:
        line = pa.struct([pa.field("text", pa.string()), pa.field("box", pa.list_(pa.int32())),
                          pa.field("quad", pa.list_(pa.int32())), pa.field("confidence", pa.float32())])
        fields = [pa.field("text", pa.string()), pa.field("lines", pa.list_(line)), pa.field("n_lines", pa.int32())]
        if self.config.reference_column:
            fields.append(pa.field("cer", pa.float32()))
        return fields

    def profile_output(self, out: pa.RecordBatch, profile: Any) -> None:
        """Statuses, lines per page and the recogniser's confidence per line."""
        from pipeline.tasks._profile import profile_ocr

        profile.rows(out)
        profile_ocr(out, profile)

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: WorkerCounts) -> pa.RecordBatch:
        """As every image task, plus the character error rate against ``reference_column`` when set."""
        from pipeline.images.ocr_text import char_error_rate, normalize_text

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
        if self.config.engine == "tesseract":
            from pipeline.tasks._ocr_tesseract import tessdata_folder

            return tessdata_folder(self.config, spec)
        return package_folder(spec) if spec.startswith(PACKAGE_PREFIX) else Path(spec).expanduser()

    @classmethod
    def extras(cls, config: Any, model: Any) -> tuple[str, ...]:
        """Decoding and PP-OCR's libraries (``images``), and tesserocr (``tesseract``) for that engine."""
        return ("images", "tesseract") if config.engine == "tesseract" else ("images",)

    def load(self, model_dir: Path, device: str) -> Any:
        """PP-OCR's onnxruntime sessions (:class:`LoadedOcr`), or the tesseract engine, once per worker."""
        if self.config.engine == "tesseract":
            from pipeline.tasks._ocr_tesseract import load_tesseract

            return load_tesseract(self.config, model_dir, threads=_task_threads())
        import onnxruntime as ort

        det_path, rec_path = find_ocr_models(model_dir)
        cls_path = find_direction_model(model_dir) if self.config.use_direction else None
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        providers: list[Any] = ["CPUExecutionProvider"]
        threads = _task_threads()
        if device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
            index = int(device.split(":")[1]) if ":" in device else 0
            providers = [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
        else:
            # one intra-op pool as wide as the task's cores; no inter-op pool (the graphs are sequential), and
            # its threads do not spin between runs (they would steal cycles from the post-processing)
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        det = ort.InferenceSession(str(det_path), sess_options=options, providers=providers)
        rec = ort.InferenceSession(str(rec_path), sess_options=options, providers=providers)
        cls = ort.InferenceSession(str(cls_path), sess_options=options, providers=providers) if cls_path else None
        meta = rec.get_modelmeta().custom_metadata_map
        if "character" not in meta:
            from pipeline.models.loading import ModelError

            raise ModelError(f"recogniser {rec_path} has no 'character' list in its ONNX metadata")
        characters = ["<blank>", *meta["character"].splitlines(), " "]
        return LoadedOcr(det, rec, characters, det.get_providers()[0], cls=cls, threads=threads)

    # -- the steps ------------------------------------------------------------------------------
    def detect(self, loaded: LoadedOcr, image: np.ndarray, timer: "StageTimer | None" = None) -> list[Any]:
        """Rotated line boxes of one page, in reading order."""
        from pipeline.images.ocr_steps import boxes_from_probability, detection_input, detection_size

        timer = timer or StageTimer()
        c = self.config
        with timer("detect"):
            size = detection_size(image.shape[0], image.shape[1], min_side=c.det_min_side, max_side=c.det_max_side)
            prob = loaded.det.run(None, {loaded.det.get_inputs()[0].name: detection_input(image, size)})[0][0, 0]
        with timer("boxes"):
            return boxes_from_probability(prob, page_size=image.shape[:2], threshold=c.det_threshold,
                                          box_threshold=c.box_threshold, unclip_ratio=c.unclip_ratio)

    def directions(self, loaded: LoadedOcr, crops: list[np.ndarray]) -> np.ndarray:
        """For each crop, the direction classifier's probability that it is upside down (mean over its windows);
        all 0 without a classifier."""
        from pipeline.images.ocr_lines import direction_input

        upside_down = np.zeros(len(crops), np.float64)
        if loaded.cls is None or not crops:
            return upside_down
        name = loaded.cls.get_inputs()[0].name
        step = max(self.batching.batch_size, 1) * 2
        for start in range(0, len(crops), step):
            windows, owner = direction_input(crops[start : start + step])
            probs = np.concatenate([loaded.cls.run(None, {name: windows[k : k + 64]})[0]
                                    for k in range(0, len(windows), 64)])
            sums = np.bincount(owner, weights=probs[:, 1], minlength=len(crops[start : start + step]))
            upside_down[start : start + step] = sums / np.bincount(owner, minlength=len(sums))
        return upside_down

    def recognize(self, loaded: LoadedOcr, crops: list[np.ndarray], counts: WorkerCounts | None = None
                  ) -> list[tuple[str, float]]:
        """``(text, confidence)`` per crop (in input order), batched by width."""
        from pipeline.core.batching import pad_multiple
        from pipeline.images.ocr_lines import collate_lines, plan_line_batches
        from pipeline.images.ocr_text import ctc_decode

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

    def read_pages(self, loaded: Any, images: list[np.ndarray], counts: WorkerCounts | None = None,
                   timer: "StageTimer | None" = None, dpis: list[int | None] | None = None
                   ) -> list[list[dict[str, Any]]]:
        """The recognised lines of each page, in reading order: ``{"text", "box", "quad", "confidence"}``
        (``dpis``: each page's resolution from its file, which tesseract uses; PP-OCR ignores it)."""
        from pipeline.images.ocr_layout import reading_order
        from pipeline.images.ocr_lines import crop_line, noise_level, smooth_line

        timer = timer or StageTimer()
        if self.config.engine == "tesseract":
            from pipeline.tasks._ocr_tesseract import read_tesseract_pages

            return read_tesseract_pages(loaded, images, dpis or [None] * len(images), counts, timer.seconds)
        boxes_per_page = [self.detect(loaded, image, timer) for image in images]
        crops, owners, flat_boxes = [], [], []
        with timer("crops"):
            for page, (image, boxes) in enumerate(zip(images, boxes_per_page)):
                noisy = bool(boxes) and self.config.denoise_sigma > 0 and (
                    noise_level(image) > self.config.denoise_threshold)
                for box in boxes:
                    crop = crop_line(image, box, max_width=self.config.max_line_width)
                    crops.append(smooth_line(crop, sigma=self.config.denoise_sigma) if noisy else crop)
                    owners.append(page)
                    flat_boxes.append(box)
        with timer("direction"):
            flipped = self._turned_lines(self.directions(loaded, crops), np.array(owners, np.int64), len(images))
            for i in np.flatnonzero(flipped):
                crops[i] = np.ascontiguousarray(crops[i][::-1, ::-1])
        with timer("recognize"):
            recognised = self.recognize(loaded, crops, counts) if crops else []
        owners_arr = np.array(owners, dtype=np.int64)
        lines: list[list[dict[str, Any]]] = [[] for _ in images]
        for page, (image, boxes) in enumerate(zip(images, boxes_per_page)):
            index = np.flatnonzero(owners_arr == page)
            order = list(range(len(boxes)))
            if index.size and flipped[index].mean() > 0.5:
                # most lines upside down: the page is, so it reads in the order of the page turned over
                turned = [b.rotated_180(image.shape[:2]) for b in boxes]
                position = {id(b): k for k, b in enumerate(turned)}
                order = [position[id(b)] for b in reading_order(turned)]
            for k in order:
                i = int(index[k])
                text, conf = recognised[i]
                if text.strip() and conf >= self.config.min_confidence:
                    box = flat_boxes[i]
                    lines[page].append({"text": text, "box": [box.x0, box.y0, box.x1, box.y1],
                                        "quad": box.as_ints(), "confidence": conf})
        if counts is not None:
            counts.add("ocr_lines", len(crops))
            counts.add("ocr_lines_turned", int(flipped.sum()))
        return lines

    def _turned_lines(self, upside_down: np.ndarray, owners: np.ndarray, pages: int) -> np.ndarray:
        """Which lines to turn: all lines of a page that the classifier finds upside down on the whole (mean
        probability over its lines above 0.5), and any line whose own probability reaches
        ``task.direction_threshold``; on an upright page only the latter."""
        turned = upside_down >= self.config.direction_threshold
        for page in range(pages):
            mine = owners == page
            if mine.any() and upside_down[mine].mean() > 0.5:
                turned[mine] = upside_down[mine] > 1 - self.config.direction_threshold
        return turned

    def decode_bytes(self, data: bytes) -> DecodedImage:
        """Every page of a multi-page TIFF (up to ``task.max_pages``, within ``task.max_pixels``)."""
        from pipeline.images.decode import decode_pages

        return decode_pages(data, max_pixels=self.config.max_pixels, max_pages=self.config.max_pages)

    def run_group(self, loaded: LoadedOcr, images: list[DecodedImage], counts: WorkerCounts) -> list[dict[str, Any]]:
        """One row per image; a multi-page document's pages are read with the group's and its text joins
        theirs with a form feed (as ``pdftotext`` separates pages), its lines in page order."""
        timer = StageTimer()
        pages = [page for im in images for page in (im.array, *im.more_pages)]
        dpis = [im.dpi for im in images for _ in (im.array, *im.more_pages)]
        counts.add("progress_rows", 0)  # progress counts rows (documents) read, not recognition batches of lines
        lines = iter(self.read_pages(loaded, pages, counts, timer, dpis))
        counts.add("images_inferred", len(pages))
        counts.add("progress_rows", len(images))
        if counts.on_batch is not None:
            counts.on_batch(counts)
        for stage, seconds in timer.seconds.items():
            counts.add(stage_counter(stage), seconds)
        out = []
        for im in images:
            page_lines = [next(lines) for _ in range(1 + len(im.more_pages))]
            text = "\f".join("\n".join(line["text"] for line in page) for page in page_lines)
            flat = [line for page in page_lines for line in page]
            out.append({"text": text, "lines": flat, "n_lines": len(flat), "n_tokens": len(text),
                        "truncated": im.pages_left_out > 0})
        return out


class StageTimer:
    """Seconds per named stage, summed: ``with timer("detect"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started


def _task_threads() -> int:
    try:
        import torch  # the Spark glue sets torch's threads to the task's cores before loading

        return max(1, torch.get_num_threads())
    except ImportError:  # pragma: no cover
        return 1


register_task(OcrConfig, OcrTask, job=OcrJob())
