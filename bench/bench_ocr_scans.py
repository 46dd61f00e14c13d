"""OCR on real pages, side by side with tesseract: character error rate and pages/s, clean and scan-like.

Usage (numbers recorded in docs/benchmarks_images.md)::

    PYTHONPATH=. python bench/bench_ocr_scans.py [--debs .cache/debs] [--pages-per-pdf 1] [--repeats 3]
        [--packages developers-reference debian-policy] [--threads 2] [--out bench/results_ocr_scans.json]

Pages: PDF manuals of three Debian packages (debian-faq, developers-reference,
debian-policy's FHS; ``apt-get download``, no root), rendered by ``pdftoppm``
at ``--dpi`` (150), the reference text from ``pdftotext`` of the same page.
Variants, generated here: *clean* (the PNG render) and *scan* (a new
scan-like JPEG per repeat, :func:`pipeline.images.scans.scan_like`: skew
drawn within +-3 degrees, grayscale, Gaussian blur 0.8 px, Gaussian noise of
12 grey levels, JPEG quality 50).

Engines, on the same files in the same run, one page at a time, interleaved:

* *project*: ``OcrTask.read_pages`` (decode, PP-OCRv4 detection, OpenCV
  post-processing, direction classifier, width-sorted batched recognition) in
  this process, onnxruntime on ``--threads`` intra-op threads.
* *tesseract*: Debian's ``tesseract`` CLI on the same file (``--psm 3``, the
  default), ``OMP_THREAD_LIMIT=--tesseract-threads`` (1 by default: tesseract's
  OpenMP threads spin, and on a shared machine they cost more CPU than they
  save; its documentation recommends one thread for throughput).

Per engine and variant: CER (edit distance / reference characters, all pages
pooled), pages/s of wall time and pages per CPU-second (this process's CPU
time for the project, the children's for tesseract: the per-core figure,
less sensitive than wall time to other jobs on the machine), with the median
and range over ``--repeats``. The CPU model and its vector flags are printed
and stored: onnxruntime's kernels depend on them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")


def cpu_info() -> dict[str, Any]:
    """The CPU model, the vector flags onnxruntime cares about, the core count and the load average."""
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "cpus": os.cpu_count(),
            "loadavg": open("/proc/loadavg").read().split()[:3]}


def prepare_pages(debs: Path, work: Path, *, pages_per_pdf: int, dpi: int, packages: list[str] | None
                  ) -> list[dict[str, str]]:
    from pipeline.demo.images import debian_pdfs, render_pages

    rows = []
    for pdf in debian_pdfs(debs):
        if packages and pdf.stem not in packages:
            continue
        rows += render_pages(pdf, work / "clean", pages=pages_per_pdf, dpi=dpi)
    return rows


def run_tesseract(path: Path, threads: int) -> tuple[str, float, float]:
    """``(text, wall seconds, CPU seconds)`` of the tesseract CLI on one file."""
    env = dict(os.environ, OMP_THREAD_LIMIT=str(threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    text = subprocess.run(["tesseract", str(path), "stdout"], check=True, capture_output=True, text=True,
                          env=env).stdout
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return text, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_project(task: Any, loaded: Any, path: Path) -> tuple[str, float, float, dict[str, float]]:
    """``(text, wall seconds, CPU seconds, seconds per stage)`` of the project's OCR on one file."""
    from pipeline.images.decode import decode_image
    from pipeline.tasks.ocr import StageTimer

    timer = StageTimer()
    cpu, started = time.process_time(), time.perf_counter()
    with timer("decode"):
        image = decode_image(path.read_bytes()).array
    lines = task.read_pages(loaded, [image], timer=timer)[0]
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return "\n".join(line["text"] for line in lines), wall, cpu, timer.seconds


def summarise(values: list[float], digits: int = 4) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debs", default=".cache/debs", help="where the Debian packages are downloaded")
    parser.add_argument("--pages-per-pdf", type=int, default=1)
    parser.add_argument("--packages", nargs="*", help="only these Debian packages' manuals (default: all three)")
    parser.add_argument("--dpi", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--tesseract-threads", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an OcrConfig field for the project, e.g. det_max_side=1600 (repeatable)")
    parser.add_argument("--out", default="bench/results_ocr_scans.json")
    args = parser.parse_args()

    import onnxruntime
    import torch

    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.images.decode import decode_image
    from pipeline.images.ocr_text import char_error_rate, normalize_text
    from pipeline.images.scans import scan_like
    from pipeline.tasks.ocr import OcrConfig, OcrTask

    cpu = cpu_info()
    tess_version = subprocess.run(["tesseract", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"CPU: {cpu['model']}; {cpu['cpus']} cpus; flags: {' '.join(cpu['flags'])}; load {cpu['loadavg']}")
    print(f"onnxruntime {onnxruntime.__version__} on {args.threads} threads; {tess_version} on "
          f"{args.tesseract_threads}", flush=True)

    torch.set_num_threads(args.threads)  # the task's sessions take their intra-op threads from here, as on Spark
    overrides = dict(item.split("=", 1) for item in args.set)
    config = OcrConfig(**overrides)
    task = OcrTask(config, model=ModelConfig(path="package:rapidocr_onnxruntime"),
                   batching=BatchingConfig(batch_size=args.batch_size))
    loaded = task.load(task.resolve_model_dir("package:rapidocr_onnxruntime"), "cpu")

    results: dict[str, Any] = {"cpu": cpu, "onnxruntime": onnxruntime.__version__, "tesseract": tess_version,
                               "threads": args.threads, "tesseract_threads": args.tesseract_threads, "dpi": args.dpi, "config": overrides,
                               "command": " ".join([Path(sys.executable).name, *sys.argv])}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pages = prepare_pages(Path(args.debs), work, pages_per_pdf=args.pages_per_pdf, dpi=args.dpi,
                              packages=args.packages)
        results["pages"] = [p["page_id"] for p in pages]
        results["reference_chars"] = sum(len(normalize_text(p["reference_text"])) for p in pages)
        print(f"{len(pages)} pages: {results['pages']} ({results['reference_chars']:,} reference chars)", flush=True)
        # a warm-up page per engine: first-run allocations are not what a long job sees
        run_project(task, loaded, Path(pages[0]["path"]))
        run_tesseract(Path(pages[0]["path"]), args.tesseract_threads)
        for repeat in range(args.repeats):
            for variant in ("clean", "scan"):
                tally = {e: {"errors": 0.0, "wall": 0.0, "cpu": 0.0, "pages": []} for e in ("project", "tesseract")}
                stages: dict[str, float] = {}
                for i, page in enumerate(pages):
                    path = Path(page["path"])
                    params = None
                    if variant == "scan":
                        data, scan = scan_like(decode_image(path.read_bytes()).array, seed=1000 * repeat + i)
                        params = scan.as_dict()
                        path = work / f"scan-r{repeat}-{i}.jpg"
                        path.write_bytes(data)
                    ref = page["reference_text"]
                    text, wall, cpu_s, seconds = run_project(task, loaded, path)
                    for stage, s in seconds.items():
                        stages[stage] = stages.get(stage, 0.0) + s
                    t_text, t_wall, t_cpu = run_tesseract(path, args.tesseract_threads)
                    for engine, (txt, w, c) in (("project", (text, wall, cpu_s)), ("tesseract", (t_text, t_wall, t_cpu))):
                        cer = char_error_rate(txt, ref)
                        tally[engine]["errors"] += cer * len(normalize_text(ref))
                        tally[engine]["wall"] += w
                        tally[engine]["cpu"] += c
                        tally[engine]["pages"].append({"page": page["page_id"], "cer": round(cer, 4), "seconds": round(w, 2),
                                                       **({"scan": params} if params else {})})
                for engine, t in tally.items():
                    row = {"cer": t["errors"] / results["reference_chars"], "pages_per_s": len(pages) / t["wall"],
                           "pages_per_cpu_s": len(pages) / max(t["cpu"], 1e-9), "pages": t["pages"]}
                    if engine == "project":
                        row["stage_seconds_per_page"] = {k: round(v / len(pages), 3) for k, v in stages.items()}
                    runs.setdefault(engine, {}).setdefault(variant, []).append(row)
                    print(f"repeat {repeat} {variant:5s} {engine:9s} CER {row['cer']:.4f}  {row['pages_per_s']:.3f} "
                          f"pages/s  {row['pages_per_cpu_s']:.3f} pages/CPU-s", flush=True)
                print(f"  project seconds per page by stage: {runs['project'][variant][-1]['stage_seconds_per_page']}",
                      flush=True)
    results["runs"] = runs
    results["summary"] = {
        engine: {variant: {key: summarise([r[key] for r in rows]) for key in ("cer", "pages_per_s", "pages_per_cpu_s")}
                 for variant, rows in by_variant.items()}
        for engine, by_variant in runs.items()}
    results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print("\n| variant | engine | CER median (range) | pages/s median (range) | pages per CPU-s median (range) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for variant in ("clean", "scan"):
        for engine in ("project", "tesseract"):
            s = results["summary"][engine][variant]
            cell = lambda k, d: f"{s[k]['median']:.{d}f} ({s[k]['min']:.{d}f}-{s[k]['max']:.{d}f})"  # noqa: E731
            print(f"| {variant} | {engine} | {cell('cer', 4)} | {cell('pages_per_s', 3)} | {cell('pages_per_cpu_s', 3)} |")
    print(f"CPU: {cpu['model']}; flags: {' '.join(cpu['flags'])}; load before {cpu['loadavg']}, "
          f"after {results['loadavg_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
