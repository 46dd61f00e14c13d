"""``score(df)`` on a served model (the endpoint backend): no model folder, rows sent once, ``run_job``'s values.

The server is the suite's OpenAI-compatible one (``tests/support/openai_server.py``) on a tiny BERT. Without
``run_job``'s staging folder there is no request journal: each row is sent once per task attempt (Spark's
semantics), which a run without retries shows as once.
"""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from pipeline import score
from pipeline.config import build_config
from pipeline.endpoint.wire import body_key, embedding_body
from pipeline.errors import ModelError
from pipeline.runner import run_job
from tests.support.data import build_tiny_bert, read_delta, write_delta
from tests.support.openai_server import OpenAIServer
from tests.support.scoring import assert_same_as_run_job, untouchable_frame

KEY = "sk-test-0123456789abcdef"
TEXTS = ["good movie", "bad film", "\u200b\x00", None, "great music and story", "a dull mess"]
LABELS = {"positive": "good great", "negative": "bad awful"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = OpenAIServer(embed_dir=build_tiny_bert(tmp_path_factory.mktemp("served") / "embed"), api_key=KEY).start()
    yield served
    served.stop()


def _endpoint(url: str) -> dict:
    return {"base_url": url, "model": "tiny-embed", "api_key": KEY, "concurrency": 2}


def test_embed_on_an_endpoint_gives_run_jobs_rows_each_sent_once(spark, tmp_path, server):
    ids = [f"r{i:02d}" for i in range(len(TEXTS))]
    write_delta(tmp_path / "reviews", pa.table({"doc_id": ids, "text": pa.array(TEXTS, pa.string())}))
    config = build_config({
        "job": "embed_endpoint_reference", "model": {},
        "source": {"format": "delta", "path": str(tmp_path / "reviews"), "id_column": "doc_id"},
        "task": {"kind": "embed", "backend": "endpoint", "endpoint": _endpoint(server.url), "labels": LABELS},
        "sink": {"path": str(tmp_path / "out"), "mode": "overwrite_partition"},
        "run": {"progress": False, "ds": "2026-11-30"},
    })
    assert run_job(config, spark=spark, out=io.StringIO()).complete
    reference = {r["doc_id"]: r for r in read_delta(tmp_path / "out").to_pylist()}

    before = Counter(server.requests)
    df = spark.createDataFrame(list(zip(ids, TEXTS)), "doc_id string, text string").repartition(2)
    scored = score(df, "embed", id_column="doc_id", backend="endpoint", endpoint=_endpoint(server.url),
                   labels=LABELS)
    rows = scored.collect()
    assert assert_same_as_run_job(rows, reference) == len(TEXTS)
    by_id = {r["doc_id"]: r for r in rows}
    assert [by_id[k]["status"] for k in ids] == ["ok", "ok", "skipped_no_content", "skipped_null", "ok", "ok"]
    assert abs(np.linalg.norm(by_id["r00"]["embedding"]) - 1.0) < 1e-4 and by_id["r00"]["model_name"] == "tiny-embed"
    sent = [t for t in TEXTS if t and t.strip("\u200b\x00")]
    assert _requests_since(server, before, sent) == [1] * len(sent)

    # a filter written after score() stays above the scoring (the column function is nondeterministic): each row
    # is sent once for it, not a second time by a copy of the function pushed below into the filter
    before = Counter(server.requests)
    kept = scored.where("status = 'ok'").select("doc_id", "embedding").collect()
    assert sorted(r["doc_id"] for r in kept) == ["r00", "r01", "r04", "r05"]
    assert _requests_since(server, before, sent) == [1] * len(sent), "rows scored twice: the filter was pushed below"


def _requests_since(server: OpenAIServer, before: Counter, texts: list[str]) -> list[int]:
    """How many times the server was asked to embed each of ``texts`` since ``before``."""
    now = Counter(server.requests)
    keys = [body_key("/embeddings", embedding_body("tiny-embed", t)) for t in texts]
    return [now[k] - before[k] for k in keys]


def test_an_endpoint_nobody_answers_is_refused_before_any_spark_job(spark, tmp_path):
    marker = tmp_path / "computed"
    df = untouchable_frame(spark, marker)
    endpoint = {**_endpoint("http://127.0.0.1:9/v1"), "max_attempts": 1, "connect_timeout_s": 1}
    with pytest.raises(ModelError, match="cannot reach the endpoint at http://127.0.0.1:9/v1"):
        score(df, "embed", id_column="doc_id", backend="endpoint", endpoint=endpoint)
    assert not marker.exists(), "score() ran a Spark job before refusing"
