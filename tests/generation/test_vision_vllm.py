"""Images into ``generate`` and ``extract`` on the vllm backend (``make test-vllm``: the vLLM environment).

The tiny Idefics3 (SmolVLM's architecture) of tests/support/vision_models.py, with a language model vLLM's CPU
attention takes (64-dim heads): vLLM's LLaVA imports torchvision, which the vLLM environment leaves out. Each row goes to vLLM as its prompt's token ids with one image placeholder and the image in
``multi_modal_data``, and vLLM's processor expands it. Its peaked random weights make greedy tokens exact
across implementations, so vLLM must equal the transformers model generating each image alone.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from pipeline.generation.vllm_backend import vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="needs vllm: make test-vllm runs these in .venv-vllm"),
]

torch = pytest.importorskip("torch")

from pipeline.config import BatchingConfig, ModelConfig  # noqa: E402
from pipeline.generation.config import VllmConfig  # noqa: E402
from pipeline.core.metrics import WorkerCounts  # noqa: E402
from pipeline.tasks import build_task  # noqa: E402
from pipeline.tasks.extract import ExtractTaskConfig  # noqa: E402
from pipeline.tasks.generate import GenerateTaskConfig  # noqa: E402
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA  # noqa: E402
from tests.support.vision_jobs import PHOTOS, job_and_score  # noqa: E402
from tests.support.vision_models import IDEFICS3_IMAGE_TOKENS as IMAGE_TOKENS  # noqa: E402
from tests.support.vision_models import save_idefics3_folder  # noqa: E402

SHAPE = {"hidden_size": 128, "heads": 2}
SETTINGS = {"backend": "vllm", "template": "Describe {photo} in a word", "image_column": "photo",
            "max_input_tokens": 64, "max_new_tokens": 8, "vllm": VllmConfig(max_num_seqs=3)}


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return save_idefics3_folder(tmp_path_factory.mktemp("vlm") / "tiny-idefics3-64", **SHAPE)


def _chunk(photos) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(photos, pa.binary())], names=["photo"])


def test_greedy_image_rows_equal_the_transformers_model_on_each_image_alone(vlm_dir):
    from transformers import AutoModelForImageTextToText

    task = build_task(GenerateTaskConfig(**SETTINGS), model=ModelConfig(path=str(vlm_dir)), batching=BatchingConfig())
    loaded = task.load(vlm_dir, "cpu")
    assert loaded.backend == "vllm" and not loaded.prompts.expand  # the engine expands the placeholder
    out = task.process(loaded, _chunk([*PHOTOS, b"not an image", None]), WorkerCounts()).to_pylist()
    assert [r["status"] for r in out] == ["ok"] * 4 + ["invalid_image", "skipped_null"]
    model = AutoModelForImageTextToText.from_pretrained(str(vlm_dir)).eval()
    processor = loaded.prompts.processor
    from pipeline.tasks._generate_images import read_row_image

    alone = []
    text = loaded.prompts.build({"photo": ""}, with_text=True).text
    for photo in PHOTOS:
        image = read_row_image(task.config, photo)[0].pil()
        inputs = processor(text=[text], images=[image], return_tensors="pt", add_special_tokens=not loaded.prompts.chat)
        n = inputs["input_ids"].shape[1]
        # the row went to vLLM unexpanded; the processor expands its placeholder into the image's tokens
        assert n > len(loaded.prompts.build_row({}, image).token_ids)
        assert inputs["input_ids"][0].tolist().count(processor.image_token_id) == IMAGE_TOKENS
        with torch.inference_mode():
            tokens = model.generate(**inputs, max_new_tokens=8, do_sample=False,
                                    pad_token_id=processor.tokenizer.pad_token_id)
        alone.append(processor.tokenizer.decode(tokens[0, n:], skip_special_tokens=True))
    assert len(set(alone)) > 1  # images that differ give different answers
    assert [r["completion"] for r in out[:4]] == alone
    # vLLM's count of the prompt holds the image's tokens, as it expanded them
    assert all(r["prompt_tokens"] > IMAGE_TOKENS for r in out[:4])


def test_extract_from_images_on_vllm_follows_the_schema(vlm_dir):
    from jsonschema import Draft202012Validator

    config = ExtractTaskConfig(**{**SETTINGS, "max_new_tokens": 48, "output_schema": EXTRACT_SHORT_SCHEMA,
                                  "schema_in_prompt": False})
    task = build_task(config, model=ModelConfig(path=str(vlm_dir)), batching=BatchingConfig())
    out = task.process(task.load(vlm_dir, "cpu"), _chunk([*PHOTOS, b""]), WorkerCounts()).to_pylist()
    assert [r["status"] for r in out] == ["ok"] * 4 + ["skipped_empty"]
    validator = Draft202012Validator(EXTRACT_SHORT_SCHEMA)
    for r in out[:4]:
        assert not list(validator.iter_errors(json.loads(r["completion"]))) and r["fields"] == json.loads(r["completion"])


@pytest.mark.parametrize("kind", ["generate", "extract"])
def test_a_job_and_score_df_on_vllm_give_the_same_rows(spark, tmp_path, vlm_dir, kind):
    task = {"kind": kind, **{k: v for k, v in SETTINGS.items() if k != "vllm"}, "vllm": {"max_num_seqs": 3}}
    if kind == "extract":
        task.update(output_schema=EXTRACT_SHORT_SCHEMA, schema_in_prompt=False, max_new_tokens=48)
    job_rows, scored = job_and_score(spark, tmp_path, task, {"path": str(vlm_dir)}, job="vision_vllm_test")
    for key in ("completion", "status", "prompt_tokens", "completion_tokens"):
        assert {i: scored[i][key] for i in job_rows} == {i: r[key] for i, r in job_rows.items()}, key
    assert [job_rows[f"p{i}"]["status"] for i in range(6)] == ["ok"] * 4 + ["invalid_image", "skipped_null"]
