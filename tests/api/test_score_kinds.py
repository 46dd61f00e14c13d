"""Every registered task kind through ``score(df)``: its columns after the DataFrame's, a few rows scored.

The kinds on the suite's tiny models (generate and extract on the tiny random Llama, classify_image on the
tiny EfficientNet-Lite, OCR on the PP-OCR models the rapidocr wheel ships); ``recommend`` is refused with
the reason. A kind registered later without a case here fails :func:`test_every_registered_kind_has_a_case`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from pipeline import score
from pipeline.config import ConfigError
from pipeline.errors import SourceError
from pipeline.registry import task_kinds
from pipeline.core.rows import MODEL_LINEAGE_COLUMNS, STATUS_FIELDS
from tests.support import image_samples as samples
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA, save_model_folder

REVIEWS = ["the film is funny", "a dull mess", None]
STATUS = [f.name for f in STATUS_FIELDS]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kind-models")
    return {"llm": save_model_folder(root / "tiny-llama"), "image": samples.build_tiny_classifier(root / "tiny-lite")}


def _text_rows(spark: Any) -> Any:
    return spark.createDataFrame([(f"r{i}", t) for i, t in enumerate(REVIEWS)], "rid string, review string")


def _image_rows(spark: Any) -> Any:
    images = [samples.jpeg(0), samples.png(1), b"not an image"]
    return spark.createDataFrame([(f"i{i}", bytearray(b)) for i, b in enumerate(images)], "rid string, img binary")


def _page_rows(spark: Any) -> Any:
    page = samples.text_page(samples.DOC_LINES[:2], size=(640, 160))
    return spark.createDataFrame([("p0", bytearray(page), " ".join(samples.DOC_LINES[:2]))],
                                 "rid string, img binary, expected string")


GENERATION = {"backend": "transformers", "max_input_tokens": 32, "max_new_tokens": 6, "slots": 2}

# kind -> (rows, model, settings, the columns the task adds, statuses expected by row id)
CASES: dict[str, tuple[Callable[[Any], Any], Callable[[dict, Path, Path], Any], dict[str, Any], list[str], dict]] = {
    "embed": (_text_rows, lambda m, e, c: str(e), {"text_column": "review"}, ["embedding"],
              {"r0": "ok", "r1": "ok", "r2": "skipped_null"}),
    "classify": (_text_rows, lambda m, e, c: str(c), {"text_column": "review"}, ["label", "score", "scores"],
                 {"r0": "ok", "r1": "ok", "r2": "skipped_null"}),
    "generate": (_text_rows, lambda m, e, c: str(m["llm"]), {"template": "Review: {review}", **GENERATION},
                 ["completion", "prompt_tokens", "completion_tokens", "finish_reason", "latency_ms"],
                 {"r0": "ok", "r1": "ok", "r2": "skipped_null"}),
    "extract": (_text_rows, lambda m, e, c: str(m["llm"]),
                {"text_column": "review", "output_schema": EXTRACT_SHORT_SCHEMA, "schema_in_prompt": False,
                 **GENERATION, "max_new_tokens": 64}, None, None),
    "classify_image": (_image_rows, lambda m, e, c: str(m["image"]), {"text_column": "img", "top_k": 2},
                       ["label", "score", "top_k", "width", "height", "image_format", "image_notes"],
                       {"i0": "ok", "i1": "ok", "i2": "invalid_image"}),
    "ocr": (_page_rows, lambda m, e, c: "package:rapidocr_onnxruntime",
            {"image_column": "img", "reference_column": "expected", "det_min_side": 320},
            ["text", "lines", "n_lines", "cer", "width", "height", "image_format", "image_notes"], {"p0": "ok"}),
}


def test_every_registered_kind_has_a_case():
    built_in = {name for name, kind in task_kinds().items() if kind.task.__module__.startswith("pipeline.tasks.")}
    assert built_in == {*CASES, "recommend"} and set(VALUES) == set(CASES)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_kind_scores_a_dataframe(spark, kind, models, tiny_embed_model, tiny_classify_model):
    make_rows, model, settings, added, statuses = CASES[kind]
    df = make_rows(spark)
    scored = score(df, kind, model=model(models, tiny_embed_model, tiny_classify_model), id_column="rid",
                   **settings)
    if added is not None:
        assert scored.columns == [*df.columns, *added, *STATUS, *MODEL_LINEAGE_COLUMNS]
    else:  # extract: the schema's typed struct, then the generation columns
        assert scored.columns[:len(df.columns) + 1] == [*df.columns, "fields"]
        assert scored.columns[-len(STATUS) - 3:] == [*STATUS, *MODEL_LINEAGE_COLUMNS]
    rows = {r["rid"]: r.asDict(recursive=True) for r in scored.collect()}
    if statuses is None:  # extract: a row the random model runs out of tokens on is invalid_output, with the reason
        assert rows["r2"]["status"] == "skipped_null"
        assert {rows[k]["status"] for k in ("r0", "r1")} <= {"ok", "invalid_output"}
    else:
        assert {k: r["status"] for k, r in rows.items()} == statuses
    assert {r["model_revision"] for r in rows.values()} != {None}
    VALUES[kind](rows)


def _generated(rows: dict) -> None:
    for row in (rows["r0"], rows["r1"]):
        assert isinstance(row["completion"], str) and row["prompt_tokens"] > 0, row
        assert 0 < row["completion_tokens"] <= GENERATION["max_new_tokens"]
        assert row["finish_reason"] in ("length", "stop")


def _extracted(rows: dict) -> None:
    """At least one review's fields parsed, each valid against the schema; the failures say why."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(EXTRACT_SHORT_SCHEMA)
    ok = [rows[k] for k in ("r0", "r1") if rows[k]["status"] == "ok"]
    assert ok, [rows[k]["error"] for k in ("r0", "r1")]
    for row in ok:
        parsed = json.loads(row["completion"], strict=False)
        assert not list(validator.iter_errors(parsed)), row["completion"]
        assert row["fields"] == parsed and row["error"] is None
    for k in ("r0", "r1"):
        if rows[k]["status"] == "invalid_output":
            assert rows[k]["fields"] is None and "cut off" in rows[k]["error"], rows[k]


def _classified_images(rows: dict) -> None:
    for rid, size in (("i0", (96, 64)), ("i1", (96, 64))):
        row = rows[rid]
        assert (row["width"], row["height"]) == size and row["label"] in ("cat", "dog", "cup", "car")
        assert [t["label"] for t in row["top_k"]][:1] == [row["label"]] and len(row["top_k"]) == 2
        assert 0 < row["score"] <= 1 and row["score"] == pytest.approx(row["top_k"][0]["score"])
    assert rows["i0"]["image_format"] == "JPEG" and rows["i1"]["image_format"] == "PNG"
    assert rows["i2"]["label"] is None and rows["i2"]["error"]


def _read_pages(rows: dict) -> None:  # the page's two lines read, against the expected text
    assert rows["p0"]["n_lines"] == 2 and rows["p0"]["cer"] < 0.05


def _encoded(rows: dict) -> None:
    for row in (rows["r0"], rows["r1"]):
        assert len(row["embedding"]) == 32 and abs(sum(v * v for v in row["embedding"]) - 1) < 1e-4


def _classified(rows: dict) -> None:
    for row in (rows["r0"], rows["r1"]):
        assert row["label"] in row["scores"] and row["score"] == pytest.approx(max(row["scores"].values()))


# kind -> what the scored rows hold besides their statuses
VALUES: dict[str, Callable[[dict], None]] = {
    "embed": _encoded, "classify": _classified, "generate": _generated, "extract": _extracted,
    "classify_image": _classified_images, "ocr": _read_pages,
}


def test_recommend_is_refused_with_the_reason(spark):
    users = spark.createDataFrame([(1, [3, 4], 30, "F", "writer")],
                                  "user_id long, seen_item_ids array<long>, age int, gender string, occupation string")
    with pytest.raises(ConfigError, match="task kind 'recommend' cannot score a DataFrame: it reads a users table"):
        score(users, "recommend", model="/models/two_tower", interactions="/tables/interactions")


def test_an_image_column_of_the_wrong_type_is_refused_before_any_work(spark, models):
    df = spark.createDataFrame([("a", "not bytes")], "rid string, img string")
    with pytest.raises(SourceError, match="column 'img' has type string; the classify_image task reads 'content' as "
                                          "binary"):
        score(df, "classify_image", model=str(models["image"]), text_column="img")
    # image_input: path reads the same column as paths or URIs
    assert "img" in score(df, "classify_image", model=str(models["image"]), image_column="img",
                          image_input="path").columns
