"""The vLLM modules' shared fixtures (``make test-vllm``): the tiny random Llama they serve and vLLM's server on it.

The Llama has 64-dim heads (``VLLM_SHAPE``), the smallest vLLM's CPU attention kernels take. The server is
:func:`pipeline.demo.served.vllm_server`: bound to 127.0.0.1, served as ``tiny-vllm`` with the key
``VLLM_KEY``, in a process group of its own that ends with the module. A module that needs another model
defines its own ``model_dir``.
"""

from __future__ import annotations

import pytest

from tests.support.generation_models import VLLM_KEY, VLLM_SHAPE, save_model_folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_folder(tmp_path_factory.mktemp("models") / "tiny-llama-64", **VLLM_SHAPE)


@pytest.fixture(scope="module")
def vllm_server(model_dir, tmp_path_factory):
    """vLLM's OpenAI server on ``model_dir``; yields its base URL (``http://127.0.0.1:<port>/v1``)."""
    from pipeline.demo.served import vllm_server as served

    with open(tmp_path_factory.mktemp("vllm-log") / "server.log", "wb") as log, \
            served(model_dir, name="tiny-vllm", api_key=VLLM_KEY, log=log) as url:
        yield url
