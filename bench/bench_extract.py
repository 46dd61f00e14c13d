"""Structured extraction with and without the constraint: rows that parse, sentiment accuracy, tokens/s.

Runs the ``extract`` task of ``conf/extract_fields.yaml`` in this process (no Spark: the task is what
differs) over the first ``--rows`` labelled Rotten Tomatoes reviews of the demo table (fresh or rotten;
not the plot synopses), once constrained
(xgrammar) and once free (the same prompt, the schema in it, checked afterwards). The extracted sentiment
is scored against the review's label (fresh = positive, rotten = negative; ``mixed`` counts as wrong).

    python bench/bench_extract.py --rows 48 [--model .cache/models/smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def labelled_reviews(source_path: str, rows: int) -> tuple["Any", list[str]]:
    """The first ``rows`` fresh/rotten reviews of the demo table: a one-column ``text`` chunk and their labels."""
    import pyarrow as pa
    from deltalake import DeltaTable

    docs = (DeltaTable(source_path).to_pyarrow_table(columns=["doc_id", "source", "label", "text"])
            .filter(pa.compute.field("label").isin(["fresh", "rotten"])).slice(0, rows))
    return pa.RecordBatch.from_pydict({"text": docs.column("text").to_pylist()}), docs.column("label").to_pylist()


def score_extract(out: dict, labels: list[str]) -> dict:
    """Valid rows (status ok/truncated) and extracted sentiment against the label (fresh = positive, rotten =
    negative; ``mixed`` counts as wrong), of an extract chunk's output ``out`` (``to_pydict``)."""
    ok = [i for i, s in enumerate(out["status"]) if s in ("ok", "truncated")]
    right = sum(1 for i in ok if (out["fields"][i]["sentiment"], labels[i]) in
                {("positive", "fresh"), ("negative", "rotten")})
    return {"rows": len(labels), "valid_rows": len(ok), "valid_share": round(len(ok) / len(labels), 3),
            "sentiment_accuracy_all_rows": round(right / len(labels), 3),
            "sentiment_accuracy_valid_rows": round(right / max(len(ok), 1), 3)}


def main() -> None:
    import torch

    from pipeline.config import load_config
    from pipeline.core.metrics import WorkerCounts
    from pipeline.tasks import build_task

    parser = argparse.ArgumentParser()
    parser.add_argument("--conf", default="conf/extract_fields.yaml")
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--model", default=None)
    parser.add_argument("--backend", default="transformers")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    job = load_config(args.conf)
    model_dir = Path(args.model or job.model.path)
    chunk, labels = labelled_reviews(job.source.path, args.rows)
    for constrained in (True, False):
        cfg = job.task.model_copy(update={"constrained": constrained, "backend": args.backend})
        task = build_task(cfg, model=job.model.model_copy(update={"path": str(model_dir)}), batching=job.batching)
        started = time.perf_counter()
        loaded = task.load(model_dir, "cpu")
        load_s = time.perf_counter() - started
        counts = WorkerCounts()
        started = time.perf_counter()
        out = task.process(loaded, chunk, counts).to_pydict()
        seconds = time.perf_counter() - started
        constraint = getattr(loaded.generator, "constraint", None)
        print(json.dumps({
            "constrained": constrained, "backend": loaded.backend, **score_extract(out, labels),
            "completion_tokens": counts.counts["completion_tokens"],
            "completion_tokens_per_s": round(counts.counts["completion_tokens"] / seconds, 1),
            "seconds": round(seconds, 1), "load_s": round(load_s, 2),
            "grammar_compile_s": round(constraint.compile_s, 3) if constraint is not None else None,
            "grammar_mask_s": round(loaded.generator.stats.get("grammar_s", 0.0), 2)
            if hasattr(loaded.generator, "stats") else None,
            "statuses": counts.counts["status"],
            "first_invalid": next((out["error"][i][:200] for i, s in enumerate(out["status"])
                                   if s == "invalid_output"), None),
        }), flush=True)


if __name__ == "__main__":
    main()
