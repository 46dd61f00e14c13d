"""``score(df)``'s arguments become the job config ``run_job`` would build from the YAML (no Spark here).

The task as a kind's name, a dict or a TaskConfig, with keywords over it; the model as a path, a dict or a
ModelConfig; the batching as a dict or a BatchingConfig; values taken as given (no ``${VAR}``). The task
fingerprint, which every scored row carries, is the one ``run_job`` gives the same settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.dataframe.checks import input_columns, prepare_scoring
from pipeline.config import BatchingConfig, ConfigError, ModelConfig, build_config
from pipeline.config.fingerprint import task_fingerprint
from pipeline.tasks.embed import EmbedTaskConfig

LABELS = {"pos": "good great", "neg": "bad awful"}


def _prepare(task, **kwargs):
    model, batching = kwargs.pop("model", "/models/m"), kwargs.pop("batching", None)
    return prepare_scoring(task, model=model, batching=batching, settings=kwargs, id_column="doc_id",
                           caller="score()")


@pytest.mark.parametrize("task, settings", [
    ("embed", {"labels": LABELS, "pooling": "cls"}),
    ({"kind": "embed", "labels": LABELS, "pooling": "mean"}, {"pooling": "cls"}),
    (EmbedTaskConfig(labels=LABELS, normalize=True), {"pooling": "cls"}),
])
def test_the_task_as_a_name_a_dict_or_a_config_with_keywords_over_it(task, settings):
    config, kind, built = _prepare(task, **settings)
    assert kind.kind == "embed" and type(built).__name__ == "EmbedTask"
    assert config.task.labels == LABELS and config.task.pooling == "cls" and config.task.normalize is True


def test_a_task_config_without_keywords_is_used_as_it_is():
    task = EmbedTaskConfig(labels=LABELS)
    config, _, _ = _prepare(task)
    assert config.task is task


@pytest.mark.parametrize("model", ["/models/m", Path("/models/m"), {"path": "/models/m", "name": "m"},
                                   ModelConfig(path="/models/m", name="m")])
@pytest.mark.parametrize("batching", [None, {"batch_size": 8}, BatchingConfig(batch_size=8)])
def test_the_model_and_batching_as_a_path_a_dict_or_a_config(model, batching):
    config, _, _ = _prepare("embed", model=model, batching=batching)
    assert config.model.path == "/models/m" and config.source.id_column == "doc_id"
    assert config.batching.batch_size == (64 if batching is None else 8)


def test_values_are_taken_as_given_not_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("price", raising=False)
    config, _, _ = _prepare("embed", labels={"cheap": "costs ${price} or less"})
    assert config.task.labels == {"cheap": "costs ${price} or less"}


@pytest.mark.parametrize("task, kwargs, message", [
    (3, {}, "task must be a task kind"),
    ("embed", {"model": 3}, "model must be a path, a dict or a ModelConfig; got int 3"),
    ("embed", {"batching": "big"}, "batching must be a dict or a BatchingConfig"),
    ({"labels": LABELS}, {}, "task: needs 'kind', one of: classify"),
])
def test_arguments_of_the_wrong_shape_are_config_errors(task, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        _prepare(task, **kwargs)


def test_the_task_fingerprint_is_run_jobs_for_the_same_settings():
    ours, _, _ = _prepare("embed", model={"path": "/models/m", "name": "tiny"}, batching={"max_length": 128},
                          labels=LABELS)
    job = build_config({"job": "nightly", "source": {"path": "/lake/docs", "text_column": "body"},
                        "model": {"path": "/models/m", "name": "tiny"}, "task": {"kind": "embed", "labels": LABELS},
                        "batching": {"max_length": 128, "batch_size": 16}, "sink": {"path": "/lake/scores"}})
    assert task_fingerprint(ours, revision="r1") == task_fingerprint(job, revision="r1")
    other, _, _ = _prepare("embed", model={"path": "/models/m", "name": "tiny"}, labels=LABELS)
    assert task_fingerprint(other, revision="r1") != task_fingerprint(job, revision="r1")  # max_length 256


def test_text_column_maps_the_tasks_inputs_in_order():
    _, _, built = _prepare("generate", template="{title}: {body}")
    assert input_columns(built, ["headline", "article"]) == {"title": "headline", "body": "article"}
    assert input_columns(built, None) == {"title": "title", "body": "body"}
    with pytest.raises(ConfigError, match=r"the generate task reads 2 column\(s\), \['title', 'body'\]"):
        input_columns(built, "headline")
