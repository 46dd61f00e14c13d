"""spark-submit entry for the score_documents job.

    spark-submit jobs/score_documents.py --conf conf/score_documents.yaml [--set key.path=value ...]
"""

from pipeline.cli import job_main

if __name__ == "__main__":
    raise SystemExit(job_main("conf/score_documents.yaml"))
