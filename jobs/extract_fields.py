"""spark-submit entry for the extract_fields job.

    spark-submit jobs/extract_fields.py --conf conf/extract_fields.yaml [--set key.path=value ...]
"""

from pipeline.cli import job_main

if __name__ == "__main__":
    raise SystemExit(job_main("conf/extract_fields.yaml"))
