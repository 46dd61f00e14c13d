"""A local vLLM OpenAI server for the endpoint demo, benchmark and tests: started, waited for, stopped with its group.

``python -m vllm.entrypoints.openai.api_server`` from the vLLM environment (``make venv-vllm``), bound to
127.0.0.1 only, CPU-friendly defaults (fp32, ``--enforce-eager``: no compile step that would take minutes of
every core), with an API key when given::

    with vllm_server(".cache/models/smollm2-135m-instruct", name="smollm2", python=".venv-vllm/bin/python") as url:
        ...  # url == "http://127.0.0.1:<port>/v1"

The server leads a process group of its own (its engine core is a child process), and leaving the block
ends the whole group: SIGTERM, then SIGKILL after 20 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, Sequence

from pipeline.io.local_server import free_port

__all__ = ["start_vllm_server", "stop_vllm_server", "vllm_server"]


def start_vllm_server(model_dir: str | Path, *, name: str, python: str | Path | None = None,
                      api_key: str | None = None, max_model_len: int = 512, max_num_seqs: int = 16,
                      dtype: str = "float32", kv_cache_gib: float = 1.0, extra: Sequence[str] = (),
                      timeout_s: float = 300.0, log: IO[bytes] | None = None) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server on ``model_dir`` served as ``name``; ``(process, base_url)`` once it answers.

    ``python``: the vLLM environment's interpreter (default: this one). Fails with the server's exit
    code when it dies first, or after ``timeout_s``.
    """
    import httpx

    port = free_port()
    cmd = [str(python or sys.executable), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--enforce-eager", "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
           "--disable-log-stats", "--uvicorn-log-level", "warning",
           # no whitespace between JSON tokens under response_format json_schema (the engine-wide setting in
           # vLLM 0.32): the grammar the in-process backends compile, and a small model's budget kept for values
           "--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}), *extra]
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": f"{kv_cache_gib:g}", "HF_HUB_OFFLINE": "1"}
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    process = subprocess.Popen(cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                               start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with status {process.returncode} before answering "
                               f"(command: {' '.join(c for c in cmd if c != api_key)})")
        try:
            if httpx.get(f"{url}/models", headers=headers, timeout=2.0, trust_env=False).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_vllm_server(process)
    raise RuntimeError(f"vLLM's server did not answer within {timeout_s:.0f} s")


def stop_vllm_server(process: subprocess.Popen) -> None:
    """End the server and its engine process (its whole group)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    except ProcessLookupError:
        pass


@contextmanager
def vllm_server(model_dir: str | Path, **options: object) -> Iterator[str]:
    """:func:`start_vllm_server` for the block; its base URL inside; the server and its group gone after."""
    process, url = start_vllm_server(model_dir, **options)  # type: ignore[arg-type]
    try:
        yield url
    finally:
        stop_vllm_server(process)
