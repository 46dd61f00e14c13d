"""Shared test helpers: documents and Delta tables to read from, tiny random BERT folders, the writer in effect.

Plain functions and constants (no fixtures: those are in ``tests/conftest.py``, which builds on these), so any
test module, and the job scripts the tests start in processes of their own, import them from here.
"""

from __future__ import annotations

import os
import string
from pathlib import Path
from typing import Any

import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"  # set: pyspark.sql.functions build Connect columns
# Two sessions, two pytest runs (make test runs both): by default the session is jar-free, so `sink.writer:
# auto` is the deltalake writer as on a machine without the jars; with SBI_TEST_CONNECTOR=1 the session (and
# the Spark Connect server) carries the Delta connector jars that `make jars` cached, and only the
# `connector`-marked tests run. One JVM per process, so the two cannot share a run.
CONNECTOR_RUN = os.environ.get("SBI_TEST_CONNECTOR") == "1"
# the connector replays a table's log in 50 partitions by default: tiny test tables take 10 s a write, 2.5 s so
DELTA_TEST_CONFS = {"spark.databricks.delta.snapshotPartitions": "2"}
# the writer fixture's stack (tests/conftest.py pushes and pops it): the writer of the running test
writer_stack: list[str] = []


def current_writer() -> str:
    """The ``sink.writer`` of the running test: the :func:`writer` fixture's, else ``auto``."""
    return writer_stack[-1] if writer_stack else "auto"


def sink_config(**settings: Any):
    """A ``SinkConfig`` on the running test's writer (see :func:`writer`)."""
    from pipeline.config import SinkConfig

    return SinkConfig(**{"writer": current_writer(), **settings})


WORDS = (
    "the a an and or but not very good bad great awful terrible wonderful movie film plot actor story "
    "boring fun love hate loved hated review critic loud quiet long short it was is this that i you we "
    "they happy sad dark light funny scary money time day night music song book food taste service"
).split()


def _vocab() -> list[str]:
    letters = list(string.ascii_lowercase + string.digits + string.punctuation)
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters, *[f"##{c}" for c in letters]]


def build_tiny_bert(folder: Path, *, kind: str = "embed", seed: int = 0, num_labels: int = 3) -> Path:
    """A 2-layer BERT (hidden 32) with random weights and a real WordPiece tokenizer, saved to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast, BertForSequenceClassification

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _vocab()
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    # `vocab=`, not `vocab_file=`: transformers 5 drops an unknown `vocab_file` and builds a 5-token
    # vocabulary, so every word became [UNK] (rows now flagged `skipped_no_content`, never scored)
    tokenizer = BertTokenizerFast(vocab=str(folder / "vocab.txt"), do_lower_case=True, model_max_length=512)
    assert tokenizer("good movie").input_ids[1:-1] != [tokenizer.unk_token_id] * 2, "the test vocabulary did not load"
    tokenizer.save_pretrained(str(folder))
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    if kind == "classify":
        config.num_labels = num_labels
        config.id2label = {i: name for i, name in enumerate(["negative", "neutral", "positive", "other"][:num_labels])}
        config.label2id = {v: k for k, v in config.id2label.items()}
        model = BertForSequenceClassification(config)
    else:
        model = BertModel(config)
    model.eval()
    model.save_pretrained(str(folder))
    return folder


def shuffle_weights(folder: Path, *, seed: int = 1) -> Path:
    """Replace a model folder's weights with the same tensors, each element permuted: the same architecture,
    the same tokenizer and config, another model (a wrong checkpoint dropped into the folder)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    shuffled = {name: t.flatten()[torch.randperm(t.numel(), generator=generator)].reshape(t.shape).contiguous()
                for name, t in weights.items()}
    save_file(shuffled, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def make_corpus(n: int, *, seed: int, start: int = 0, empty_share: float = 0.0) -> pa.Table:
    """``doc_id``, ``text``, ``source``: ``n`` documents of 2 to 60 random words of :data:`WORDS` (lengths
    log-uniform), ids from ``start``: one night's rows of a corpus, another seed another night's. With
    ``empty_share`` that share of the texts is empty (an upstream job that stopped sending them)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    texts: list[str] = [" ".join(rng.choice(WORDS, int(np.exp(rng.uniform(np.log(2), np.log(60))))))
                        for _ in range(n)]
    for i in rng.choice(n, int(round(n * empty_share)), replace=False):
        texts[int(i)] = ""
    return pa.table({"doc_id": pa.array([f"d{start + i:05d}" for i in range(n)], pa.string()),
                     "text": pa.array(texts, pa.string()), "source": pa.array(["corpus"] * n, pa.string())})


SENTENCES = [
    "this movie was very good",
    "an awful, boring film",
    "i loved the music and the story",
    "the plot was long and the actor was not funny",
    "great",
    "terrible service but the food was good, very good, great taste",
]


def make_documents(n: int, *, with_bad_rows: bool = True) -> pa.Table:
    """``doc_id``, ``text``, ``source`` rows with varied lengths (and a null and a blank row)."""
    ids, texts = [], []
    for i in range(n):
        base = SENTENCES[i % len(SENTENCES)]
        ids.append(f"d{i:05d}")
        texts.append(" ".join([base] * (1 + i % 7)))
    if with_bad_rows and n >= 3:
        texts[1] = None
        texts[2] = "   "
    return pa.table({
        "doc_id": pa.array(ids, pa.string()),
        "text": pa.array(texts, pa.string()),
        "source": pa.array(["test"] * n, pa.string()),
    })


def write_delta(path: Path | str, table: pa.Table, **kwargs: Any) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), table, **kwargs)


def read_delta(path: Path | str, **filters: Any) -> pa.Table:
    from deltalake import DeltaTable

    return pa.table(DeltaTable(str(path)).to_pyarrow_table())
