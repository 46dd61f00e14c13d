"""OCR on real pages, side by side with tesseract: character error rate and pages/s, clean and scan-like.

Usage (numbers recorded in docs/benchmarks_images.md)::

    PYTHONPATH=. python bench/bench_ocr_scans.py [--debs .cache/debs] [--pages-per-pdf 1] [--repeats 3]
        [--packages developers-reference debian-policy] [--threads 2] [--out bench/results_ocr_scans.json]
        [--engines project tesseract project-tesseract]

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
* *project-tesseract*: the ocr task's ``engine: tesseract`` (``OcrTask.read_pages``
  after the task's decode, libtesseract in this process through tesserocr, one
  API opened once, the same ``OMP_THREAD_LIMIT``). Its seconds by stage give the
  binding's overhead: decode, handing the page over and reading the lines back,
  against tesseract's own ``Recognize``. The versions of the CLI and of the
  library the binding runs are printed and stored: when they differ (tesserocr's
  wheel carries its own libtesseract), the text may differ with them; a binding
  built against the system's library (``pip install --no-binary tesserocr
  tesserocr``) runs the CLI's.

Then, per variant, the checks of the tesseract engine against the CLI: its CER
minus the CLI's (within 0.005) and its pages/s over the CLI's (at least 0.9),
medians of the repeats.

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


def run_tesseract(path: Path, threads: int, psm: int = 3) -> tuple[str, float, float]:
    """``(text, wall seconds, CPU seconds)`` of the tesseract CLI on one file."""
    env = dict(os.environ, OMP_THREAD_LIMIT=str(threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    text = subprocess.run(["tesseract", str(path), "stdout", "--psm", str(psm)], check=True, capture_output=True,
                          text=True, env=env).stdout
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return text, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run_project(task: Any, loaded: Any, path: Path) -> tuple[str, float, float, dict[str, float]]:
    """``(text, wall seconds, CPU seconds, seconds per stage)`` of the project's OCR (either engine) on one file."""
    from pipeline.images.decode import decode_image
    from pipeline.tasks.ocr import StageTimer

    timer = StageTimer()
    cpu, started = time.process_time(), time.perf_counter()
    with timer("decode"):
        decoded = decode_image(path.read_bytes())
    lines = task.read_pages(loaded, [decoded.array], timer=timer, dpis=[decoded.dpi])[0]
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return "\n".join(line["text"] for line in lines), wall, cpu, timer.seconds


def summarise(values: list[float], digits: int = 4) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


ENGINES = ("project", "tesseract", "project-tesseract")


def load_engines(args: argparse.Namespace, overrides: dict[str, str]) -> dict[str, tuple[Any, Any]]:
    """``{engine: (task, loaded)}`` for the in-process engines asked for (the CLI needs nothing loaded)."""
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.tasks.ocr import OcrConfig, OcrTask

    engines: dict[str, tuple[Any, Any]] = {}
    batching = BatchingConfig(batch_size=args.batch_size)
    if "project" in args.engines:
        task = OcrTask(OcrConfig(**overrides), model=ModelConfig(path="package:rapidocr_onnxruntime"),
                       batching=batching)
        engines["project"] = (task, task.load(task.resolve_model_dir("package:rapidocr_onnxruntime"), "cpu"))
    if "project-tesseract" in args.engines:
        task = OcrTask(OcrConfig(engine="tesseract", psm=args.psm), model=ModelConfig(path=args.tessdata),
                       batching=batching)
        engines["project-tesseract"] = (task, task.load(task.resolve_model_dir(args.tessdata), "cpu"))
    return engines


def read_page(engine: str, engines: dict[str, tuple[Any, Any]], path: Path, args: argparse.Namespace
              ) -> tuple[str, float, float, dict[str, float]]:
    if engine == "tesseract":
        return (*run_tesseract(path, args.tesseract_threads, args.psm), {})
    task, loaded = engines[engine]
    return run_project(task, loaded, path)


def tesseract_checks(summary: dict[str, Any]) -> dict[str, Any]:
    """Per variant: the tesseract engine's CER minus the CLI's, and its pages/s (wall and per CPU-second)
    over the CLI's, from the medians; ``ok`` when within 0.005 and at least 0.9."""
    checks = {}
    for variant in summary.get("project-tesseract", {}):
        ours, cli = summary["project-tesseract"][variant], summary["tesseract"][variant]
        cer_delta = ours["cer"]["median"] - cli["cer"]["median"]
        speed = ours["pages_per_s"]["median"] / cli["pages_per_s"]["median"]
        cpu_speed = ours["pages_per_cpu_s"]["median"] / cli["pages_per_cpu_s"]["median"]
        checks[variant] = {"cer_minus_cli": round(cer_delta, 4), "pages_per_s_over_cli": round(speed, 3),
                           "pages_per_cpu_s_over_cli": round(cpu_speed, 3),
                           "ok": abs(cer_delta) <= 0.005 and speed >= 0.9}
    return checks


def binding_overhead(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The tesseract engine's seconds per page outside tesseract's ``Recognize`` (decode, the page handed
    over, the lines read back) and their share of its time, medians over the repeats."""
    shares, outside = [], []
    for row in rows:
        stages = row["stage_seconds_per_page"]
        extra = sum(v for k, v in stages.items() if k != "recognize")
        outside.append(extra)
        shares.append(extra / max(extra + stages.get("recognize", 0.0), 1e-9))
    return {"seconds_per_page": round(statistics.median(outside), 4), "share": round(statistics.median(shares), 4)}


def measure(args: argparse.Namespace, engines: dict[str, tuple[Any, Any]], pages: list[dict[str, str]],
            work: Path, reference_chars: int) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every engine on every page of both variants, interleaved page by page, ``--repeats`` times."""
    from pipeline.images.decode import decode_image
    from pipeline.images.ocr_text import char_error_rate, normalize_text
    from pipeline.images.scans import scan_like

    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for engine in args.engines:  # a warm-up page per engine: first-run allocations are not what a long job sees
        read_page(engine, engines, Path(pages[0]["path"]), args)
    for repeat in range(args.repeats):
        for variant in ("clean", "scan"):
            tally = {e: {"errors": 0.0, "wall": 0.0, "cpu": 0.0, "pages": [], "stages": {}} for e in args.engines}
            for i, page in enumerate(pages):
                path = Path(page["path"])
                params = None
                if variant == "scan":
                    data, scan = scan_like(decode_image(path.read_bytes()).array, seed=1000 * repeat + i)
                    params = scan.as_dict()
                    path = work / f"scan-r{repeat}-{i}.jpg"
                    path.write_bytes(data)
                ref = page["reference_text"]
                for engine in args.engines:
                    text, wall, cpu_s, seconds = read_page(engine, engines, path, args)
                    t = tally[engine]
                    for stage, v in seconds.items():
                        t["stages"][stage] = t["stages"].get(stage, 0.0) + v
                    cer = char_error_rate(text, ref)
                    t["errors"] += cer * len(normalize_text(ref))
                    t["wall"] += wall
                    t["cpu"] += cpu_s
                    t["pages"].append({"page": page["page_id"], "cer": round(cer, 4), "seconds": round(wall, 2),
                                       **({"scan": params} if params else {})})
            for engine, t in tally.items():
                row = {"cer": t["errors"] / reference_chars, "pages_per_s": len(pages) / t["wall"],
                       "pages_per_cpu_s": len(pages) / max(t["cpu"], 1e-9), "pages": t["pages"]}
                if t["stages"]:
                    row["stage_seconds_per_page"] = {k: round(v / len(pages), 4) for k, v in t["stages"].items()}
                runs.setdefault(engine, {}).setdefault(variant, []).append(row)
                print(f"repeat {repeat} {variant:5s} {engine:17s} CER {row['cer']:.4f}  {row['pages_per_s']:.3f} "
                      f"pages/s  {row['pages_per_cpu_s']:.3f} pages/CPU-s  {row.get('stage_seconds_per_page', '')}",
                      flush=True)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--debs", default=".cache/debs", help="where the Debian packages are downloaded")
    parser.add_argument("--pages-per-pdf", type=int, default=1)
    parser.add_argument("--packages", nargs="*", help="only these Debian packages' manuals (default: all three)")
    parser.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES,
                        help="project (PP-OCR), tesseract (the CLI), project-tesseract (the task's tesseract engine)")
    parser.add_argument("--dpi", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--tesseract-threads", type=int, default=1)
    parser.add_argument("--psm", type=int, default=3, help="tesseract's page segmentation mode, CLI and engine")
    parser.add_argument("--tessdata", default="", help="the engine's language data folder (default: the system's)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an OcrConfig field for the project, e.g. det_max_side=1600 (repeatable)")
    parser.add_argument("--out", default="bench/results_ocr_scans.json")
    args = parser.parse_args()
    if "project-tesseract" in args.engines and "tesseract" not in args.engines:
        args.engines.append("tesseract")  # the engine's figures are read against the CLI's
    # the CLI's thread limit for the engine too, before any OpenMP runtime loads: a libtesseract built with
    # OpenMP (Debian's) shares torch's libgomp.so.1, which reads the limit once, when torch is imported below
    os.environ["OMP_THREAD_LIMIT"] = str(args.tesseract_threads)

    import onnxruntime
    import torch

    from pipeline.images.ocr_text import normalize_text

    cpu = cpu_info()
    tess_version = subprocess.run(["tesseract", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"CPU: {cpu['model']}; {cpu['cpus']} cpus; flags: {' '.join(cpu['flags'])}; load {cpu['loadavg']}")
    torch.set_num_threads(args.threads)  # the task's sessions take their intra-op threads from here, as on Spark
    overrides = dict(item.split("=", 1) for item in args.set)
    engines = load_engines(args, overrides)
    library = None
    if "project-tesseract" in engines:
        from pipeline.images.ocr_tesseract import tesseract_version

        library = f"libtesseract {tesseract_version()} (tesserocr)"
    print(f"onnxruntime {onnxruntime.__version__} on {args.threads} threads; {tess_version} CLI on "
          f"{args.tesseract_threads}; the engine's library: {library}", flush=True)

    results: dict[str, Any] = {"cpu": cpu, "onnxruntime": onnxruntime.__version__, "tesseract": tess_version,
                               "tesseract_library": library, "engines": args.engines, "psm": args.psm,
                               "threads": args.threads, "tesseract_threads": args.tesseract_threads, "dpi": args.dpi,
                               "config": overrides, "command": " ".join([Path(sys.executable).name, *sys.argv])}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        pages = prepare_pages(Path(args.debs), work, pages_per_pdf=args.pages_per_pdf, dpi=args.dpi,
                              packages=args.packages)
        results["pages"] = [p["page_id"] for p in pages]
        results["reference_chars"] = sum(len(normalize_text(p["reference_text"])) for p in pages)
        print(f"{len(pages)} pages: {results['pages']} ({results['reference_chars']:,} reference chars)", flush=True)
        runs = measure(args, engines, pages, work, results["reference_chars"])
    results["runs"] = runs
    results["summary"] = {
        engine: {variant: {key: summarise([r[key] for r in rows]) for key in ("cer", "pages_per_s", "pages_per_cpu_s")}
                 for variant, rows in by_variant.items()}
        for engine, by_variant in runs.items()}
    if "project-tesseract" in runs:
        results["tesseract_engine"] = {"against_cli": tesseract_checks(results["summary"]),
                                       "binding_overhead": {v: binding_overhead(rows)
                                                            for v, rows in runs["project-tesseract"].items()}}
    results["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results, args.engines)
    return 0


def print_table(results: dict[str, Any], engines: list[str]) -> None:
    print("\n| variant | engine | CER median (range) | pages/s median (range) | pages per CPU-s median (range) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for variant in ("clean", "scan"):
        for engine in engines:
            s = results["summary"][engine][variant]
            cell = lambda k, d: f"{s[k]['median']:.{d}f} ({s[k]['min']:.{d}f}-{s[k]['max']:.{d}f})"  # noqa: E731
            print(f"| {variant} | {engine} | {cell('cer', 4)} | {cell('pages_per_s', 3)} | {cell('pages_per_cpu_s', 3)} |")
    for variant, check in results.get("tesseract_engine", {}).get("against_cli", {}).items():
        overhead = results["tesseract_engine"]["binding_overhead"][variant]
        print(f"tesseract engine, {variant}: CER {check['cer_minus_cli']:+.4f} against the CLI's, "
              f"{check['pages_per_s_over_cli']:.3f}x its pages/s ({check['pages_per_cpu_s_over_cli']:.3f}x per "
              f"CPU-second); outside Recognize {overhead['seconds_per_page']:.3f} s/page ({overhead['share']:.1%}): "
              f"{'within' if check['ok'] else 'OUTSIDE'} the goal (CER within 0.005, at least 0.9x pages/s)")
    print(f"CPU: {results['cpu']['model']}; flags: {' '.join(results['cpu']['flags'])}; load before "
          f"{results['cpu']['loadavg']}, after {results['loadavg_after']}; CLI {results['tesseract']}, engine "
          f"{results['tesseract_library']}")


if __name__ == "__main__":
    raise SystemExit(main())
