"""Batch mode's request files through ``vllm run-batch``, equal to live mode against vLLM's server (``make test-vllm``).

The batch API of the default suite's test server (``tests/support/batch_server.py``) with its lines run by vLLM:
each batch's request file, as the pipeline wrote it, goes to ``python -m vllm.entrypoints.openai.run_batch`` (the
``vllm run-batch`` command) on the tiny random Llama of ``tests/generation/test_vllm.py`` (fp32, eager, the
structured-outputs settings of vLLM's server in ``pipeline/demo/served.py``), and its output file, parsed by the
pipeline's own reader, is what the batch returns. The same extract job live against vLLM's OpenAI server on
the same model gives the same rows at temperature 0.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys

import pyarrow as pa
import pytest

from pipeline.generation.vllm_backend import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="needs vllm: make test-vllm runs these in .venv-vllm"),
]

from tests.support.batch_server import BatchServer  # noqa: E402
from tests.support.data import read_delta, write_delta  # noqa: E402
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA, VLLM_KEY as KEY  # noqa: E402

TEXTS = ["the film is funny", "a dull mess", "smart and moving", "the story drags", "superb acting",
         "der Film ist langweilig", "a big heart", "one of the best movies of the year", "never finds its footing", ""]


def run_batch_with_vllm(model_dir, folder):
    """An async callable: request lines -> ``vllm run-batch``'s result lines (one process per batch)."""
    counter = iter(range(1_000_000))

    async def run(lines):
        n = next(counter)
        source, target = folder / f"in-{n}.jsonl", folder / f"out-{n}.jsonl"
        source.write_text("".join(json.dumps(line) + "\n" for line in lines))
        structured = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})
        command = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch", "-i", str(source), "-o", str(target),
                   "--model", str(model_dir), "--served-model-name", "tiny-vllm", "--dtype", "float32",
                   "--enforce-eager", "--max-model-len", "512", "--structured-outputs-config", structured]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        with open(folder / f"run-batch-{n}.log", "wb") as log:
            process = await asyncio.create_subprocess_exec(*command, env=env, stdout=log, stderr=log)
            assert await process.wait() == 0, (folder / f"run-batch-{n}.log").read_text()[-3000:]
        return [json.loads(line) for line in target.read_text().splitlines() if line.strip()]

    return run


def _job(tmp_path, url, *, mode, out):
    from pipeline.config import build_config

    if not (tmp_path / "reviews").exists():
        ids = [f"v{i:02d}" for i in range(len(TEXTS))]
        write_delta(tmp_path / "reviews", pa.table({"doc_id": ids, "text": pa.array(TEXTS, pa.string())}))
    endpoint = {"base_url": url, "model": "tiny-vllm", "api_key": "${SBI_TEST_VLLM_KEY}", "mode": mode,
                "backoff_s": 0.01, "max_backoff_s": 0.05, "batch": {"poll_s": 0.2, "max_poll_s": 1.0}}
    return build_config({
        "job": f"extract_vllm_{mode}",
        "source": {"format": "delta", "path": str(tmp_path / "reviews"), "id_column": "doc_id"},
        "model": {"name": "tiny-vllm"},
        "task": {"kind": "extract", "backend": "endpoint", "endpoint": endpoint, "template": "Review: {text}",
                 "output_schema": EXTRACT_SHORT_SCHEMA, "schema_in_prompt": False, "max_new_tokens": 48},
        "sink": {"path": str(tmp_path / out), "mode": "overwrite_partition"},
        "run": {"progress": False, "ds": "2026-11-30", "max_error_fraction": 0.5},
    })


@pytest.mark.timeout(1200)  # vLLM's server, then a run-batch process with its own engine
def test_vllm_run_batch_on_the_request_files_gives_live_modes_rows(spark, tmp_path, vllm_server, model_dir,
                                                                   monkeypatch):
    from pipeline.runner import run_job

    monkeypatch.setenv("SBI_TEST_VLLM_KEY", KEY)
    run_job(_job(tmp_path, vllm_server, mode="live", out="live"), spark=spark, out=io.StringIO())
    batches = BatchServer(llm_dir=model_dir, llm_name="tiny-vllm", api_key=KEY)
    batches.run_lines = run_batch_with_vllm(model_dir, tmp_path)
    batches.start()
    try:
        summary = run_job(_job(tmp_path, batches.url, mode="batch", out="batch"), spark=spark, out=io.StringIO())
    finally:
        batches.stop()
    live = {r["doc_id"]: r for r in read_delta(tmp_path / "live").to_pylist()}
    batch = {r["doc_id"]: r for r in read_delta(tmp_path / "batch").to_pylist()}
    fields = ("status", "completion", "fields", "prompt_tokens", "completion_tokens", "finish_reason")
    assert summary.complete and sorted(batch) == sorted(live) == [f"v{i:02d}" for i in range(len(TEXTS))]
    assert {k: [batch[k][f] for f in fields] for k in batch} == {k: [live[k][f] for f in fields] for k in live}
    assert sum(r["status"] == "ok" for r in batch.values()) >= len(TEXTS) - 2
    assert len(batches.creates()) == 1 and len(batches.creates()[0]["keys"]) == len(TEXTS) - 1  # "" is skipped
