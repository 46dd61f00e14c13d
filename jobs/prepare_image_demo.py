"""Prepare the image demo's inputs: sample photos (+ bad images) in a folder, Debian manual pages in Delta.

    python jobs/prepare_image_demo.py [--out warehouse/demo/images] [--debs .cache/debs] [--pages 12]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.demo.images import add_scan_variants, copy_photos, debian_pdfs, render_pages, write_pages_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="warehouse/demo/images", help="folder for photos/, pages/ and the table")
    parser.add_argument("--debs", default=".cache/debs", help="where the Debian packages are downloaded")
    parser.add_argument("--pages", type=int, default=12, help="pages in all, spread over the manuals")
    args = parser.parse_args()
    out = Path(args.out)
    photos = copy_photos(out / "photos")
    print(f"wrote {len(photos)} images (photos and bad images) to {out / 'photos'}")
    pdfs = debian_pdfs(Path(args.debs))
    per_pdf = max(1, -(-args.pages // len(pdfs)))
    rows = []
    for pdf in pdfs:
        rows += render_pages(pdf, out / "page_images", pages=min(per_pdf, args.pages - len(rows)))
    rows += add_scan_variants(rows, out / "page_images")
    version = write_pages_table(str(out / "pages"), rows)
    print(f"wrote {len(rows)} rendered and scan-like pages of {[p.stem for p in pdfs]} to Delta table {out / 'pages'} "
          f"(version {version})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
