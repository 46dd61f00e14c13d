"""spark-submit entry for the ocr_pages job.

    spark-submit jobs/ocr_pages.py --conf conf/ocr_pages.yaml [--set key.path=value ...]
"""

from pipeline.cli import job_main

if __name__ == "__main__":
    raise SystemExit(job_main("conf/ocr_pages.yaml"))
