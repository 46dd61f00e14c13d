"""spark-submit entry for the classify_images job.

    spark-submit jobs/classify_images.py --conf conf/classify_images.yaml [--set key.path=value ...]
"""

from pipeline.cli import job_main

if __name__ == "__main__":
    raise SystemExit(job_main("conf/classify_images.yaml"))
