"""Print the OCR job's character error rate beside tesseract's on the same pages, clean and scan-like.

    python jobs/demo_compare_ocr.py [--pages warehouse/demo/images/pages] [--text warehouse/demo/page_text]
"""

from __future__ import annotations

import argparse

from pipeline.demo.images import compare_with_tesseract


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="warehouse/demo/images/pages", help="the pages table (with reference text)")
    parser.add_argument("--text", default="warehouse/demo/page_text", help="the ocr_pages job's output table")
    args = parser.parse_args()
    for variant, row in sorted(compare_with_tesseract(args.pages, args.text).items()):
        print(f"{variant:5s} pages: {row['pages']:3d}  CER project {row['project_cer']:.4f}  "
              f"tesseract {row['tesseract_cer']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
