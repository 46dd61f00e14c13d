"""Each shipped notebook's code path from the installed wheel: its source run as Databricks runs it.

The notebook file (``notebooks/<name>.py``, copied beside the smoke set) is executed cell by cell as one script,
with ``dbutils`` answering its widgets (the ``config`` widget names a small job of the notebook's kind written
here; every other widget keeps what the notebook declares), the classic session as ``spark`` and ``display``
capturing what it shows. Whatever the notebook's defaults, its library calls run: the job's summary (or the
displayed DataFrame) is checked, and every input row accounted for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipeline import RunSummary
from tests.support import image_samples as samples
from tests.support.generation_models import EXTRACT_SHORT_SCHEMA
from tests.wheel.jobs import OK_STATUSES, check_embed_rows, embed_job, read, read_if_any

pytestmark = pytest.mark.wheel

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
GENERATION = {"backend": "transformers", "max_input_tokens": 32, "max_new_tokens": 6, "slots": 2}
REVIEWS = ["the film is funny", "a dull mess", None, "great music, bad plot"]


class _Widgets:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def text(self, name: str, default: str, label: str = "") -> None:
        self.values.setdefault(name, default)

    def dropdown(self, name: str, default: str, choices: Any = None, label: str = "") -> None:
        self.values.setdefault(name, default)

    def get(self, name: str) -> str:
        if name not in self.values:
            raise KeyError(name)  # as Databricks: a widget never declared
        return self.values[name]


class _DbUtils:
    def __init__(self, **values: str) -> None:
        self.widgets = _Widgets(values)


def run_notebook_file(name: str, spark: Any, tmp_path: Path, job: dict) -> tuple[dict, list]:
    """Run ``notebooks/<name>.py`` with its config widget set to ``job`` (written as YAML); returns the notebook's
    namespace and what it displayed."""
    import yaml

    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(job))
    path = NOTEBOOKS / f"{name}.py"
    shown: list = []
    namespace: dict[str, Any] = {"__name__": "__main__", "dbutils": _DbUtils(config=str(config)), "spark": spark,
                                 "display": shown.append}
    # the shipped notebook, run as Databricks runs it
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102
    return namespace, shown


def _summary(namespace: dict) -> RunSummary:
    summaries = [v for v in namespace.values() if isinstance(v, RunSummary)]
    assert len(summaries) == 1, "the notebook's last cell runs one job"
    return summaries[0]


def _accounted(tmp_path: Path, summary: RunSummary, ids: list[str], id_column: str) -> list[dict]:
    """Every input id once in the output or the quarantine; returns the output rows."""
    out = read(tmp_path / "out").to_pylist()
    quarantined = read_if_any(tmp_path / "out_quarantine")
    assert sorted(str(r[id_column]) for r in out + quarantined) == sorted(map(str, ids))
    assert summary.rows_in == len(ids) and summary.rows_out == len(out)
    return out


def _job(tmp_path: Path, name: str, *, source: dict, model: dict, task: dict, **sections) -> dict:
    return {"job": name, "source": {"format": "delta", "path": str(tmp_path / "in"), **source}, "model": model,
            "task": task, "sink": {"path": str(tmp_path / "out"), "mode": "append"},
            "run": {"progress": False, "ds": "2026-12-01", **sections.pop("run", {})},
            "spark": {"small_job_rows": 0}, **sections}


@pytest.mark.entry("run_job", "notebook")
@pytest.mark.notebook("score_documents")
def test_score_documents(spark, tmp_path, tiny_embed_model):
    namespace, _ = run_notebook_file("score_documents", spark, tmp_path,
                                     embed_job(tmp_path, tiny_embed_model, writer="auto"))
    check_embed_rows(tmp_path, _summary(namespace))


@pytest.mark.entry("score", "notebook")
@pytest.mark.notebook("preview_scores")
def test_preview_scores(spark, tmp_path, tiny_embed_model):
    _, shown = run_notebook_file("preview_scores", spark, tmp_path,
                                 embed_job(tmp_path, tiny_embed_model, writer="auto"))
    (frame,) = shown
    rows = frame.collect()
    assert len(rows) == 20 and {"doc_id", "text", "embedding", "status", "model_revision"} <= set(frame.columns)
    assert {r["status"] for r in rows} <= {*OK_STATUSES, "skipped_null", "skipped_empty", "invalid_id"}
    assert not (tmp_path / "scores").exists(), "a preview writes nothing"


@pytest.mark.entry("run_job", "notebook")
@pytest.mark.notebook("classify_images")
def test_classify_images(spark, tmp_path, tiny_image_model):
    images = [samples.jpeg(0), samples.png(1), b"not an image"]
    write_deltalake(str(tmp_path / "in"), pa.table({"image_id": ["i0", "i1", "i2"],
                                                    "content": pa.array(images, pa.binary())}))
    job = _job(tmp_path, "wheel_images", source={"id_column": "image_id"}, model={"path": str(tiny_image_model)},
               task={"kind": "classify_image", "top_k": 2}, batching={"batch_size": 4})
    namespace, _ = run_notebook_file("classify_images", spark, tmp_path, job)
    out = _accounted(tmp_path, _summary(namespace), ["i0", "i1", "i2"], "image_id")
    assert {r["image_id"]: r["status"] for r in out} == {"i0": "ok", "i1": "ok", "i2": "invalid_image"}


@pytest.mark.entry("run_job", "notebook")
@pytest.mark.notebook("ocr_pages")
def test_ocr_pages(spark, tmp_path):
    page = samples.text_page(samples.DOC_LINES[:2], size=(640, 160))
    write_deltalake(str(tmp_path / "in"), pa.table({"page_id": ["p0"], "content": pa.array([page], pa.binary()),
                                                    "expected": [" ".join(samples.DOC_LINES[:2])]}))
    job = _job(tmp_path, "wheel_ocr", source={"id_column": "page_id"}, model={"path": "package:rapidocr_onnxruntime"},
               task={"kind": "ocr", "reference_column": "expected", "det_min_side": 320})
    namespace, _ = run_notebook_file("ocr_pages", spark, tmp_path, job)
    (row,) = _accounted(tmp_path, _summary(namespace), ["p0"], "page_id")
    assert row["status"] == "ok" and row["n_lines"] == 2 and row["cer"] < 0.05, row


def _reviews(tmp_path: Path) -> list[str]:
    ids = [f"r{i}" for i in range(len(REVIEWS))]
    write_deltalake(str(tmp_path / "in"), pa.table({"doc_id": ids, "text": pa.array(REVIEWS, pa.string())}))
    return ids


@pytest.mark.entry("run_job", "notebook")
@pytest.mark.notebook("generate_text")
def test_generate_text(spark, tmp_path, tiny_llm):
    ids = _reviews(tmp_path)
    job = _job(tmp_path, "wheel_generate", source={"id_column": "doc_id"}, model={"path": str(tiny_llm)},
               task={"kind": "generate", "template": "Review: {text}", **GENERATION})
    namespace, _ = run_notebook_file("generate_text", spark, tmp_path, job)
    out = _accounted(tmp_path, _summary(namespace), ids, "doc_id")
    assert {r["doc_id"]: r["status"] for r in out}["r2"] == "skipped_null"
    assert all(isinstance(r["completion"], str) for r in out if r["status"] == "ok")


@pytest.mark.entry("run_job", "notebook")
@pytest.mark.notebook("extract_fields")
def test_extract_fields(spark, tmp_path, tiny_llm):
    ids = _reviews(tmp_path)
    job = _job(tmp_path, "wheel_extract", source={"id_column": "doc_id"}, model={"path": str(tiny_llm)},
               task={"kind": "extract", "output_schema": EXTRACT_SHORT_SCHEMA, "schema_in_prompt": False,
                     **GENERATION, "max_new_tokens": 48},
               # a tiny random model: its rows may well fail the schema; every one must still be accounted for
               run={"max_error_fraction": 1.0})
    namespace, _ = run_notebook_file("extract_fields", spark, tmp_path, job)
    _accounted(tmp_path, _summary(namespace), ids, "doc_id")
    assert "fields" in read(tmp_path / "out").column_names


@pytest.mark.entry("run_job", "notebook")
@pytest.mark.notebook("refresh_recommendations")
def test_refresh_recommendations(spark, tmp_path):
    from pipeline.recs.config import TrainConfig
    from pipeline.recs.data import write_recs_tables
    from pipeline.recs.registry import save_two_tower
    from pipeline.recs.synthetic import make_synthetic_recs
    from pipeline.recs.train import train_two_tower

    data = make_synthetic_recs(n_users=24, n_items=40, per_user=8, seed=3)
    write_recs_tables(data, tmp_path / "recs")
    trained = train_two_tower(data, TrainConfig(dim=16, epochs=2, batch_size=128, holdout_per_user=0), log=None)
    save_two_tower(trained.model, tmp_path / "models" / "two_tower")
    job = {"job": "wheel_refresh", "source": {"format": "delta", "path": str(tmp_path / "recs/users"),
                                              "id_column": "user_id"},
           "model": {"path": str(tmp_path / "models/two_tower")},
           "task": {"kind": "recommend", "k": 5, "batch_size": 7, "interactions": str(tmp_path / "recs/interactions"),
                    "items": str(tmp_path / "recs/items"), "latest_path": str(tmp_path / "latest")},
           "sink": {"path": str(tmp_path / "out"), "mode": "overwrite_partition", "partition_by": ["ds"]},
           "run": {"progress": False, "ds": "2026-12-01"}}
    namespace, _ = run_notebook_file("refresh_recommendations", spark, tmp_path, job)
    summary = _summary(namespace)
    users = sorted(set(read(tmp_path / "recs/users").column("user_id").to_pylist()))
    out = read(tmp_path / "out").to_pylist()
    assert summary.rows_in == len(users) == 24 and summary.rows_out == len(out) == 24 * 5
    assert sorted({r["user_id"] for r in out}) == users, "every user has their recommendations"
    assert json.loads(json.dumps(summary.to_dict()))["rows_out"] == 120
