"""Images into ``generate`` and ``extract``: a tiny LLaVA built offline (tests/support/vision_models.py) on the
transformers backend, and the same model behind the OpenAI-compatible test server for the endpoint backend.

Checked: batched image rows equal each row generated alone (and images that differ give different tokens, so
a mix-up of pixels between rows shows), bad images are flagged rows (never lost), the text is cut to fit
``max_input_tokens`` around an image it never cuts, ``extract``'s rows are valid against the schema, and a
job (``run_job``) and ``score(df)`` give the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

torch = pytest.importorskip("torch")

from pipeline.config import BatchingConfig, ConfigError, ModelConfig, build_config  # noqa: E402
from pipeline.generation import BatchGenerator, GenerationRequest  # noqa: E402
from pipeline.core.metrics import WorkerCounts  # noqa: E402
from pipeline.tasks.extract import ExtractTask, ExtractTaskConfig  # noqa: E402
from pipeline.tasks.generate import GenerateTask, GenerateTaskConfig  # noqa: E402
from tests.support import image_samples as samples  # noqa: E402
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA  # noqa: E402
from tests.support.vision_jobs import PHOTOS, job_and_score  # noqa: E402
from tests.support.vision_models import (  # noqa: E402
    IDEFICS3_IMAGE_TOKENS, IMAGE_TOKENS, save_idefics3_folder, save_vlm_folder,
)

GENERATE = {"backend": "transformers", "template": "Describe {photo} in a word", "image_column": "photo",
            "max_input_tokens": 64, "max_new_tokens": 6, "slots": 3}


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    return save_vlm_folder(tmp_path_factory.mktemp("vlm") / "tiny-llava")


def _task(vlm_dir: Path, kind: str = "generate", **settings):
    if kind == "extract":
        config = ExtractTaskConfig(**{**GENERATE, "max_new_tokens": 48, "output_schema": EXTRACT_SHORT_SCHEMA,
                                      "schema_in_prompt": False, **settings})
        return ExtractTask(config, model=ModelConfig(path=str(vlm_dir)), batching=BatchingConfig())
    config = GenerateTaskConfig(**{**GENERATE, **settings})
    return GenerateTask(config, model=ModelConfig(path=str(vlm_dir)), batching=BatchingConfig())


def _chunk(photos, **columns) -> pa.RecordBatch:
    arrays = {"photo": pa.array(photos, pa.binary()), **{k: pa.array(v) for k, v in columns.items()}}
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


@pytest.fixture(scope="module")
def idefics3_dir(tmp_path_factory) -> Path:
    return save_idefics3_folder(tmp_path_factory.mktemp("vlm") / "tiny-idefics3")


@pytest.mark.parametrize("arch", ["llava", "idefics3"])
def test_batched_image_rows_equal_each_row_generated_alone(request, arch):
    """Rows admitted together in continuous batching (2 and 3 slots, rows joining as others finish) give the
    tokens ``model.generate`` gives each prompt and image alone; and the images change the tokens. On LLaVA
    (pixels ``[images, 3, H, W]``) and Idefics3, SmolVLM's architecture (``[rows, images, 3, H, W]`` and a pixel
    mask, the image between marker tokens)."""
    from pipeline.generation.sampling import SamplingParams
    from pipeline.tasks._generate_images import read_row_image

    folder = request.getfixturevalue("vlm_dir" if arch == "llava" else "idefics3_dir")
    task = _task(folder)
    loaded = task.load(folder, "cpu")
    processor, model = loaded.prompts.processor, loaded.generator.model
    prompts = [loaded.prompts.build_row({}, read_row_image(task.config, p)[0].pil()) for p in PHOTOS]
    expected = IMAGE_TOKENS if arch == "llava" else IDEFICS3_IMAGE_TOKENS
    assert all(p.token_ids.count(processor.tokenizer.convert_tokens_to_ids("<image>")) == expected
               for p in prompts)
    alone = []
    for p in prompts:
        ids = torch.tensor([p.token_ids])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                 do_sample=False, pad_token_id=processor.tokenizer.pad_token_id, **p.inputs)
        alone.append(out[0, ids.shape[1]:].tolist())
    assert len({tuple(a) for a in alone}) > 1  # different images, different tokens: a pixel mix-up would show
    for slots in (2, 3):
        gen = BatchGenerator(model, processor.tokenizer, mode="continuous", slots=slots, max_seq_len=128,
                             sampling=SamplingParams())
        budgets = [8, 3, 8, 5]  # rows finish at different steps: the others join mid-way
        results = gen.generate([GenerationRequest(p.token_ids, b, inputs=p.inputs) for p, b in zip(prompts, budgets)])
        assert [r.token_ids for r in results] == [a[:b] for a, b in zip(alone, budgets)]


def test_bad_images_are_flagged_rows_and_image_tokens_are_counted(vlm_dir, tmp_path):
    photo = tmp_path / "p.jpg"
    photo.write_bytes(samples.jpeg(5))
    task = _task(vlm_dir)
    loaded = task.load(vlm_dir, "cpu")
    images = [*PHOTOS[:2], b"not an image", None, b"", samples.truncated_jpeg()]
    counts = WorkerCounts()
    out = task.process(loaded, _chunk(images), counts).to_pylist()
    assert len(out) == len(images)  # rows in = rows out
    assert [r["status"] for r in out] == ["ok", "ok", "invalid_image", "skipped_null", "skipped_empty",
                                          "invalid_image"]
    assert all(r["completion"] is None and r["error"] for r in out[2:])
    text_tokens = len(loaded.prompts.build({"photo": ""}).token_ids) - 1  # the placeholder, then the image's
    assert [r["prompt_tokens"] for r in out[:2]] == [text_tokens + IMAGE_TOKENS] * 2
    assert counts.counts["prompt_tokens"] == 2 * (text_tokens + IMAGE_TOKENS)
    # paths read on the worker; a missing file is its row's status
    by_path = _task(vlm_dir, image_input="path")
    rows = by_path.process(by_path.load(vlm_dir, "cpu"), pa.RecordBatch.from_arrays(
        [pa.array([str(photo), str(tmp_path / "gone.jpg")])], names=["photo"]), WorkerCounts()).to_pylist()
    assert [r["status"] for r in rows] == ["ok", "missing_file"]
    # past max_pixels: refused from the header, before decoding
    small = _task(vlm_dir, max_pixels=100)
    rows = small.process(small.load(vlm_dir, "cpu"), _chunk(PHOTOS[:1]), WorkerCounts()).to_pylist()
    assert rows[0]["status"] == "too_large" and "task.max_pixels" in rows[0]["error"]


def test_text_is_cut_around_the_image_and_an_image_too_big_for_the_budget_is_the_rows_error(vlm_dir):
    task = _task(vlm_dir, template="{photo} Caption the photo of {title}", max_input_tokens=56)
    loaded = task.load(vlm_dir, "cpu")
    titles = ["a dog", "the film is a charming and funny ride with a big heart " * 6]
    out = task.process(loaded, _chunk(PHOTOS[:2], title=titles), WorkerCounts()).to_pylist()
    assert [r["status"] for r in out] == ["ok", "truncated"] and out[1]["truncated"]
    assert out[1]["prompt_tokens"] <= 56 and out[0]["prompt_tokens"] < out[1]["prompt_tokens"]
    # room for the template's text (its scaffold), not for the image's tokens beside it
    tight = _task(vlm_dir, max_input_tokens=loaded.prompts.scaffold_tokens + 4)
    row = tight.process(tight.load(vlm_dir, "cpu"), _chunk(PHOTOS[:1]), WorkerCounts()).to_pylist()[0]
    assert row["status"] == "error" and f"the image takes {IMAGE_TOKENS} tokens" in row["error"]


def test_extract_from_images_gives_rows_valid_against_the_schema(vlm_dir):
    from jsonschema import Draft202012Validator

    task = _task(vlm_dir, kind="extract")
    out = task.process(task.load(vlm_dir, "cpu"), _chunk([*PHOTOS, b"junk"]), WorkerCounts()).to_pylist()
    assert [r["status"] for r in out] == ["ok"] * 4 + ["invalid_image"]
    validator = Draft202012Validator(EXTRACT_SHORT_SCHEMA)
    for r in out[:4]:
        assert not list(validator.iter_errors(json.loads(r["completion"]))) and r["fields"] == json.loads(r["completion"])


def test_settings_that_cannot_carry_an_image_are_refused():
    with pytest.raises(ValueError, match="llama_cpp runs text models only"):
        GenerateTaskConfig(template="{photo}", image_column="photo", backend="llama_cpp")
    with pytest.raises(ValueError, match="only the chat API takes"):
        GenerateTaskConfig(template="{photo}", image_column="photo", backend="endpoint",
                           endpoint={"base_url": "http://127.0.0.1:9/v1", "model": "m", "api": "completions"})
    with pytest.raises(ConfigError, match="model.precision int4"):
        build_config({"job": "j", "source": {"path": "x"}, "model": {"path": "m", "precision": "int4"},
                      "sink": {"path": "y"}, "task": {"kind": "generate", "template": "{photo}",
                                                      "image_column": "photo"}})
    assert GenerateTask.extras(GenerateTaskConfig(template="{photo}", image_column="photo"), ModelConfig()) == (
        "transformers", "vision")


def test_a_text_model_folder_is_refused_for_image_rows(tmp_path):
    from pipeline.errors import ModelError
    from pipeline.generation.vision import check_vision_lm
    from tests.support.generation_models import save_model_folder

    with pytest.raises(ModelError, match="is not a vision-language model"):
        check_vision_lm(save_model_folder(tmp_path / "llm"))


def test_a_model_with_multimodal_positions_is_refused_with_the_backend_that_runs_it(tmp_path):
    from pipeline.errors import ModelError
    from pipeline.generation.vision import load_vision_lm
    from tests.support.vision_models import save_qwen2_vl_weights

    with pytest.raises(ModelError, match="multimodal rotary positions.*run it on task.backend: vllm"):
        load_vision_lm(save_qwen2_vl_weights(tmp_path / "qwen2-vl"))


# -- on Spark: a job and score(df), on the transformers backend and on the endpoint ----------------------------

@pytest.mark.parametrize("kind", ["generate", "extract"])
def test_a_job_and_score_df_caption_and_extract_the_same_rows(spark, tmp_path, vlm_dir, kind):
    task = {"kind": kind, **GENERATE}
    if kind == "extract":
        task.update(output_schema=EXTRACT_SHORT_SCHEMA, schema_in_prompt=False, max_new_tokens=48)
    job_rows, scored = job_and_score(spark, tmp_path, task, {"path": str(vlm_dir)})
    for key in ("completion", "status", "prompt_tokens", "completion_tokens", "model_revision", "task_fingerprint"):
        assert {i: scored[i][key] for i in job_rows} == {i: r[key] for i, r in job_rows.items()}, key
    assert all(job_rows[f"p{i}"]["status"] == "ok" for i in range(4))
    if kind == "extract":
        assert all(job_rows[f"p{i}"]["fields"] == json.loads(job_rows[f"p{i}"]["completion"]) for i in range(4))


@pytest.fixture(scope="module")
def vlm_server(vlm_dir):
    from tests.support.openai_server import OpenAIServer

    served = OpenAIServer(vlm_dir=vlm_dir).start()
    yield served
    served.stop()


@pytest.mark.parametrize("kind", ["generate", "extract"])
def test_the_endpoint_sends_each_image_as_an_image_url_part_and_counts_its_tokens_from_the_usage(
        spark, tmp_path, vlm_server, kind):
    endpoint = {"base_url": vlm_server.url, "model": "tiny-vlm", "concurrency": 2}
    task = {"kind": kind, "backend": "endpoint", "endpoint": endpoint, "template": "Describe {photo} in a word",
            "image_column": "photo", "max_new_tokens": 6}
    if kind == "extract":
        task.update(output_schema=EXTRACT_SHORT_SCHEMA, schema_in_prompt=False, max_new_tokens=48)
    seen = len(vlm_server.images)
    job_rows, scored = job_and_score(spark, tmp_path, task, {"name": "tiny-vlm"})
    # the four good images arrived, decoded, as data URIs: once for the job and once for score(df)
    arrived = vlm_server.images[seen:]
    assert len(arrived) == 8 and {a["mime"] for a in arrived} == {"image/jpeg", "image/png"}
    local = _task(vlm_server.vlm_dir, kind=kind) if kind == "generate" else None
    for i in range(4):
        row = job_rows[f"p{i}"]
        assert row["status"] == "ok" and scored[f"p{i}"]["completion"] == row["completion"]
        # the usage's prompt tokens hold the image's: the server expanded it
        assert row["prompt_tokens"] > IMAGE_TOKENS
    if local is not None:  # the server's count is the tokens the local backend counts for the same prompt
        loaded = local.load(vlm_server.vlm_dir, "cpu")
        assert job_rows["p0"]["prompt_tokens"] == len(loaded.prompts.build({"photo": ""}).token_ids) - 1 + IMAGE_TOKENS
