"""The task registry: a throwaway kind registered here (no edit to pipeline/) runs end to end into Delta."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from pydantic import Field

from pipeline import run_job
from pipeline.config import ConfigError, TaskConfig, build_config
from pipeline.errors import PipelineError
from pipeline.registry import ModelInfo, get_task_kind, register_task, task_kinds, unregister_task
from pipeline.core.rows import STATUS_FIELDS
from pipeline.tasks.job import TaskJob
from tests.support.data import make_documents, read_delta, write_delta

REPO = Path(__file__).resolve().parents[2]


class ReverseConfig(TaskConfig):
    """Reverses each text (a test kind: no model)."""

    kind: Literal["reverse_text"] = "reverse_text"
    upper: bool = Field(False, description="also upper-case the result")


class ReverseTask:
    kind = "reverse_text"
    input_columns = ("text",)

    def __init__(self, config: ReverseConfig, *, model: Any, batching: Any) -> None:
        self.config, self.model = config, model

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field("reversed", pa.string()), *STATUS_FIELDS])

    def cache_key(self) -> Any:
        return (self.kind, self.config.upper)

    def resolve_model_dir(self, spec: str) -> Path:
        return Path(spec)

    def load(self, model_dir: Path, device: str) -> dict[str, Any]:
        return {"device": device}

    def process(self, loaded: Any, chunk: pa.RecordBatch, counts: Any) -> pa.RecordBatch:
        texts = chunk.column(0).to_pylist()
        out = [None if t is None else (t[::-1].upper() if self.config.upper else t[::-1]) for t in texts]
        status = ["ok" if t is not None else "skipped_null" for t in texts]
        counts.add("rows", len(texts))
        counts.add_status({s: status.count(s) for s in set(status)})
        n = len(texts)
        return pa.RecordBatch.from_arrays(
            [pa.array(out, pa.string()), pa.array([0] * n, pa.int32()), pa.array([False] * n),
             pa.array(status, pa.string()), pa.array([None] * n, pa.string())],
            schema=self.output_schema())


class ReverseJob(TaskJob):
    def model_info(self, config: Any, task: Any) -> ModelInfo:
        return ModelInfo(config.model.path, "reverser", "rev-1")


register_task(ReverseConfig, ReverseTask, job=ReverseJob())


def _config(tmp_path: Path, **task: Any):
    return build_config({
        "job": "reverse", "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id"},
        "model": {"path": str(tmp_path)}, "task": {"kind": "reverse_text", **task},
        "sink": {"path": str(tmp_path / "out")}, "run": {"progress": False, "ds": "2026-11-30", "run_id": "rev"},
    })


def test_a_kind_registered_outside_pipeline_runs_end_to_end_into_delta(spark, tmp_path):
    docs = make_documents(40)
    write_delta(tmp_path / "docs", docs)
    out = io.StringIO()
    summary = run_job(_config(tmp_path, upper=True), spark=spark, out=out)
    assert summary.complete and summary.rows_in == summary.rows_out == 40
    assert summary.model_name == "reverser" and summary.model_revision == "rev-1"
    table = read_delta(tmp_path / "out").to_pandas().set_index("doc_id")
    expected = {i: (t[::-1].upper() if t is not None else None) for i, t in zip(docs["doc_id"].to_pylist(),
                                                                               docs["text"].to_pylist())}
    assert table["reversed"].to_dict() == expected
    assert set(table["model_name"]) == {"reverser"} and set(table["run_id"]) == {"rev"}
    assert table.loc["d00001", "status"] == "skipped_null"


def test_config_reads_the_registry(tmp_path):
    assert isinstance(_config(tmp_path).task, ReverseConfig)
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, uper=True)
    assert "task.uper: unknown key" in str(err.value) and "upper" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown task kind 'translate'; known: .*embed.*reverse_text"):
        build_config({"job": "x", "source": {"path": "p"}, "model": {"path": "m"}, "task": {"kind": "translate"},
                      "sink": {"path": "o"}})
    with pytest.raises(ConfigError, match="task: needs 'kind'"):
        build_config({"job": "x", "source": {"path": "p"}, "model": {"path": "m"}, "task": {},
                      "sink": {"path": "o"}})


def test_builtin_kinds_and_one_owner_per_kind():
    assert {"embed", "classify", "generate", "recommend", "reverse_text"} <= set(task_kinds())
    assert get_task_kind("recommend").task.__module__ == "pipeline.tasks.recommend"
    register_task(ReverseConfig, ReverseTask, job=ReverseJob())  # the same classes again: a no-op

    class Other(ReverseTask):
        pass

    with pytest.raises(ValueError, match="already registered"):
        register_task(ReverseConfig, Other)
    with pytest.raises(TypeError, match="TaskConfig subclass"):
        register_task(dict, ReverseTask)  # type: ignore[arg-type]

    class Throwaway(TaskConfig):
        kind: Literal["throwaway"] = "throwaway"

    register_task(Throwaway, ReverseTask)
    unregister_task("throwaway")
    with pytest.raises(KeyError, match="unknown task kind 'throwaway'"):
        get_task_kind("throwaway")


def test_every_config_key_has_a_description():
    from pipeline.config import JobConfig
    from pipeline.docs import reference_rows

    rows = list(reference_rows(JobConfig))
    for entry in task_kinds().values():
        rows += reference_rows(entry.config, "task.")
    missing = [key for key, _, meaning in rows if not meaning and key not in ("task", "task.kind")]
    assert not missing, f"config keys without Field(description=...): {missing}"


def test_the_config_reference_page_is_generated_from_the_models(tmp_path):
    """Fails when a key, default or description changes without `python -m pipeline config-reference --write`."""
    from pipeline.docs import BEGIN, END, config_reference

    page = (REPO / "docs" / "reference" / "config.md").read_text()
    block = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    unregister_task("reverse_text")  # the test kind is not part of the product's docs
    try:
        assert block == config_reference(), ("docs/reference/config.md is stale: run "
                                             "`python -m pipeline config-reference --write docs/reference/config.md`")
    finally:
        register_task(ReverseConfig, ReverseTask, job=ReverseJob())


def test_fault_hooks_stay_out_of_the_batch_loop(tiny_embed_model, monkeypatch):
    from pipeline.core import faults
    from pipeline.config import BatchingConfig, ModelConfig
    from pipeline.core.metrics import WorkerCounts
    from pipeline.tasks.embed import EmbedTask, EmbedTaskConfig

    def boom(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fault code ran in a batch without any fault configured")

    faults.activate(None)
    monkeypatch.setattr(faults, "check_batch", boom)
    monkeypatch.setenv(faults.ENV, '{"poison_marker": "good"}')  # the environment is the driver's, read once there
    task = EmbedTask(EmbedTaskConfig(), model=ModelConfig(path=str(tiny_embed_model)), batching=BatchingConfig(batch_size=2))
    chunk = pa.record_batch([pa.array(["good movie", "bad film", "great"])], names=["text"])
    out = task.process(task.load(tiny_embed_model, "cpu"), chunk, WorkerCounts())
    assert out.column("status").to_pylist() == ["ok", "ok", "ok"]


def test_pure_layers_import_no_spark_or_torch():
    code = ("import sys, pipeline.config, pipeline.registry, pipeline.core.batching, pipeline.core.metrics\n"
            "import pipeline.docs\n"
            "from pipeline.registry import task_kinds; task_kinds()\n"
            "bad = sorted(m for m in ('pyspark', 'torch', 'transformers') if m in sys.modules)\n"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_cli_reports_every_pipeline_error_in_one_place(capsys, tmp_path):
    from pipeline.cli import main

    assert issubclass(ConfigError, PipelineError)
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "error: config file" in capsys.readouterr().err
    assert main(["tasks"]) == 0
    listing = capsys.readouterr().out
    assert "recommend" in listing and "interactions" in listing
