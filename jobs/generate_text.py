"""spark-submit entry for the generate_text job.

    spark-submit jobs/generate_text.py --conf conf/generate_text.yaml [--set key.path=value ...]
"""

from pipeline.cli import job_main

if __name__ == "__main__":
    raise SystemExit(job_main("conf/generate_text.yaml"))
