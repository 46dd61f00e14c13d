"""The rest of the installed wheel's public face, as the docs use it: the error tree, a task kind of your own, and
an entry file of your own that calls the command line (docs/tasks/custom.md, docs/getting-started/cluster.md).

No Spark here: the kind is registered, validated and run on a chunk in this process, as its executors would.
"""

from __future__ import annotations

import json
from typing import Literal

import pyarrow as pa
import pytest
from pydantic import Field

import pipeline
from pipeline import STATUS_FIELDS, PipelineError, TaskConfig, TaskJob, errors, load_config, register_task
from tests.wheel.jobs import embed_job

pytestmark = pytest.mark.wheel


@pytest.mark.entry("PipelineError", "errors", "load_config")
def test_every_error_of_the_tree_is_caught_as_a_pipeline_error(tmp_path):
    tree = [getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)]
    assert len(tree) >= 20 and all(issubclass(cls, PipelineError) for cls in tree)
    assert errors.PipelineError is PipelineError and errors.ConfigError is pipeline.ConfigError
    with pytest.raises(PipelineError, match="config file"):
        load_config(str(tmp_path / "missing.yaml"))


class ShoutConfig(TaskConfig):
    """Upper-cases each text (the docs' example kind)."""

    kind: Literal["wheel_shout"] = "wheel_shout"
    suffix: str = Field("!", description="appended to each text")


class ShoutTask:
    kind, input_columns = "wheel_shout", ("text",)

    def __init__(self, config: ShoutConfig, *, model, batching) -> None:
        self.config = config

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field("loud", pa.string()), *STATUS_FIELDS])

    def process(self, loaded, chunk: pa.RecordBatch, counts) -> pa.RecordBatch:
        texts = chunk.column(0).to_pylist()
        n = len(texts)
        return pa.RecordBatch.from_arrays(
            [pa.array([None if t is None else t.upper() + self.config.suffix for t in texts], pa.string()),
             pa.array([0] * n, pa.int32()), pa.array([False] * n),
             pa.array(["skipped_null" if t is None else "ok" for t in texts]), pa.array([None] * n, pa.string())],
            schema=self.output_schema())


class ShoutJob(TaskJob):
    pass


@pytest.mark.entry("register_task", "TaskConfig", "TaskJob", "STATUS_FIELDS")
def test_a_task_kind_of_your_own_registers_validates_and_scores_a_chunk(tmp_path, tiny_embed_model):
    from pipeline.registry import kind_and_task, unregister_task

    entry = register_task(ShoutConfig, ShoutTask, job=ShoutJob())
    try:
        job = {**embed_job(tmp_path, tiny_embed_model, writer="auto"), "task": {"kind": "wheel_shout", "suffix": "?"}}
        path = tmp_path / "shout.yaml"
        path.write_text(json.dumps(job))
        config = load_config(str(path))
        assert isinstance(config.task, ShoutConfig) and config.task.suffix == "?"
        kind, task = kind_and_task(config)
        assert kind is entry and isinstance(kind.job, ShoutJob) and isinstance(task, ShoutTask)
        out = task.process(None, pa.record_batch([pa.array(["hey", None])], names=["text"]), None)
        assert out.column("loud").to_pylist() == ["HEY?", None]
        assert out.column("status").to_pylist() == ["ok", "skipped_null"]
        path.write_text(json.dumps({**job, "task": {"kind": "wheel_shout", "sufix": "?"}}))
        with pytest.raises(pipeline.ConfigError, match="task.sufix: unknown key"):
            load_config(str(path))
    finally:
        unregister_task("wheel_shout")


@pytest.mark.entry("cli")
def test_an_entry_file_of_your_own_calls_the_command_line(tmp_path, tiny_embed_model, capsys):
    from pipeline.cli import main

    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps(embed_job(tmp_path, tiny_embed_model, writer="auto")))
    assert main(["check", str(conf)]) == 0
    assert json.loads(capsys.readouterr().out)["task"]["kind"] == "embed"
    assert main(["check", str(tmp_path / "missing.yaml")]) == 2
    assert "error: config file" in capsys.readouterr().err
