"""The image demo's real inputs: sample photos from the scikit-image wheel, and pages of Debian PDF manuals.

Photos: the photographs scikit-image ships in ``skimage/data`` (a cat, a cup
of coffee, a rocket, an astronaut, coins, a motorcycle...), copied to a folder
that the ``classify_images`` job reads with the ``binary_file`` source; a
``bad/`` subfolder gets one of every bad-image class (0 bytes, truncated JPEG,
not an image, CMYK, 16-bit PNG, animated GIF, EXIF-rotated, a 30,000 x 30,000
PNG bomb) so the run shows each status.

Pages: PDF manuals from Debian packages (``apt-get download``, unpacked with
``dpkg-deb``; no root needed), rendered with ``pdftoppm`` (poppler-utils) and
paired with ``pdftotext``'s text of the same page, written to a Delta table of
``page_id``, ``path`` (the PNG) and ``reference_text`` for the ``ocr_pages``
job, which reports the character error rate against it. Each page also gets
a scan-like twin (``page_id`` ending in ``:scan``; skewed, noisy, blurred,
grey, JPEG q50: :func:`pipeline.images.scans.scan_like`), and
:func:`compare_with_tesseract` prints the job's CER beside tesseract's on the
same files.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa

__all__ = ["DEBIAN_MANUALS", "add_scan_variants", "compare_with_tesseract", "copy_photos", "debian_pdfs", "render_pages",
           "write_pages_table"]

# package -> PDF inside it (gzipped or not)
DEBIAN_MANUALS = {
    "debian-faq": "usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz",
    "developers-reference": "usr/share/developers-reference/developers-reference.pdf",
    "debian-policy": "usr/share/doc/debian-policy/fhs/fhs-3.0.pdf.gz",
}


def copy_photos(out: Path) -> list[Path]:
    """Copy scikit-image's sample photos to ``out`` and the bad-image set to ``out/bad``; the files written."""
    from pipeline.images.samples import bad_image_set
    from pipeline.models.files import package_folder

    data = package_folder("skimage", sub="data")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(data.iterdir()):
        if src.suffix.lower() in (".png", ".jpg", ".jpeg") and src.stat().st_size > 10_000:
            written.append(Path(shutil.copyfile(src, out / src.name)))
    bad = out / "bad"
    bad.mkdir(exist_ok=True)
    suffix = {"empty": ".jpg", "not_image": ".jpg", "truncated": ".jpg", "cmyk": ".jpg", "png16": ".png",
              "animated": ".gif", "exif": ".jpg", "bomb": ".png"}
    for name, blob in bad_image_set().items():
        if blob is None:
            continue  # a folder has no null files
        path = bad / f"{name}{suffix[name]}"
        path.write_bytes(blob)
        written.append(path)
    return written


def debian_pdfs(debs: Path) -> list[Path]:
    """The PDF manuals of :data:`DEBIAN_MANUALS`, downloaded once into ``debs`` and unpacked there."""
    debs.mkdir(parents=True, exist_ok=True)
    pdfs = []
    for package, inner in DEBIAN_MANUALS.items():
        if not list(debs.glob(f"{package}_*.deb")):
            subprocess.run(["apt-get", "download", package], cwd=debs, check=True, capture_output=True)
        deb = sorted(debs.glob(f"{package}_*.deb"))[-1]
        root = debs / package
        if not (root / inner).exists():
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        pdf = debs / f"{package}.pdf"
        source = root / inner
        if not pdf.exists():
            if source.suffix == ".gz":
                with gzip.open(source, "rb") as fin, pdf.open("wb") as fout:
                    shutil.copyfileobj(fin, fout)
            else:
                shutil.copyfile(source, pdf)
        pdfs.append(pdf)
    return pdfs


def render_pages(pdf: Path, out: Path, *, pages: int, dpi: int = 100, min_chars: int = 400,
                 first: int = 3) -> list[dict[str, str]]:
    """Up to ``pages`` pages of ``pdf`` from page ``first`` with at least ``min_chars`` of text, rendered
    to PNG at ``dpi``; ``[{page_id, path, reference_text}]``. Title, blank and contents pages are skipped."""
    out.mkdir(parents=True, exist_ok=True)
    info = subprocess.run(["pdfinfo", str(pdf)], check=True, capture_output=True, text=True).stdout
    total = int(next(line.split()[-1] for line in info.splitlines() if line.startswith("Pages:")))
    rows = []
    for page in range(first, total + 1):
        if len(rows) >= pages:
            break
        text = subprocess.run(["pdftotext", "-f", str(page), "-l", str(page), "-enc", "UTF-8", str(pdf), "-"],
                              check=True, capture_output=True, text=True).stdout
        if len("".join(text.split())) < min_chars or len(re.findall(r"(?:\. ?){6,}", text)) > 5:
            continue  # title and blank pages, and tables of contents (dot leaders are not text)
        prefix = out / f"{pdf.stem}-p{page:03d}"
        subprocess.run(["pdftoppm", "-r", str(dpi), "-f", str(page), "-l", str(page), "-png", "-singlefile",
                        str(pdf), str(prefix)], check=True)
        rows.append({"page_id": f"{pdf.stem}:{page}", "path": str(prefix.with_suffix(".png").resolve()),
                     "reference_text": text})
    return rows


def write_pages_table(path: str, rows: list[dict[str, str]]) -> int:
    """(Re)create the Delta table of pages; returns its version."""
    from deltalake import DeltaTable, write_deltalake

    table = pa.Table.from_pylist(rows, schema=pa.schema([("page_id", pa.string()), ("path", pa.string()),
                                                         ("reference_text", pa.string())]))
    write_deltalake(path, table, mode="overwrite")
    return DeltaTable(path).version()


def add_scan_variants(rows: list[dict[str, str]], out: Path, *, seed: int = 0) -> list[dict[str, str]]:
    """A scan-like JPEG twin of each rendered page (same reference text, ``page_id`` + ``:scan``), in ``out``."""
    from pipeline.images.decode import decode_image
    from pipeline.images.scans import scan_like

    out.mkdir(parents=True, exist_ok=True)
    twins = []
    for i, row in enumerate(rows):
        data, _ = scan_like(decode_image(Path(row["path"]).read_bytes()).array, seed=seed + i)
        path = out / (Path(row["path"]).stem + "-scan.jpg")
        path.write_bytes(data)
        twins.append({"page_id": row["page_id"] + ":scan", "path": str(path.resolve()),
                      "reference_text": row["reference_text"]})
    return twins


def compare_with_tesseract(pages_table: str, text_table: str) -> dict[str, dict[str, float]]:
    """The OCR job's character error rate beside tesseract's on the same page files, clean and scan-like.

    Reads the pages table (``page_id``, ``path``, ``reference_text``) and the
    job's output (``page_id``, ``text``), runs Debian's ``tesseract`` CLI on
    each page file, and returns ``{variant: {"pages", "project_cer", "tesseract_cer"}}``
    (errors over reference characters, pages pooled).
    """
    from deltalake import DeltaTable

    from pipeline.images.ocr_text import char_error_rate, normalize_text

    pages = DeltaTable(pages_table).to_pyarrow_table(columns=["page_id", "path", "reference_text"]).to_pylist()
    texts = DeltaTable(text_table).to_pyarrow_table(columns=["page_id", "text"]).to_pylist()
    ours = {row["page_id"]: row["text"] or "" for row in texts}
    tally: dict[str, dict[str, float]] = {}
    for page in pages:
        if page["page_id"] not in ours:
            continue
        variant = "scan" if page["page_id"].endswith(":scan") else "clean"
        tess = subprocess.run(["tesseract", page["path"], "stdout"], check=True, capture_output=True, text=True,
                              env={**os.environ, "OMP_THREAD_LIMIT": "1"}).stdout
        ref, n = page["reference_text"], len(normalize_text(page["reference_text"]))
        t = tally.setdefault(variant, {"pages": 0, "chars": 0, "project": 0.0, "tesseract": 0.0})
        t["pages"] += 1
        t["chars"] += n
        t["project"] += char_error_rate(ours[page["page_id"]], ref) * n
        t["tesseract"] += char_error_rate(tess, ref) * n
    return {v: {"pages": t["pages"], "project_cer": t["project"] / max(t["chars"], 1),
                "tesseract_cer": t["tesseract"] / max(t["chars"], 1)} for v, t in tally.items()}
