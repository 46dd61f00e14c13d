from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_config, parse_overrides
from pipeline.tasks.embed import EmbedTaskConfig

REPO = Path(__file__).resolve().parents[2]

MINIMAL = """
job: t
source: {format: delta, path: /data/in, id_column: doc_id, text_column: body}
model: {path: /models/m}
task: {kind: embed}
sink: {path: /data/out}
"""


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_committed_config_validates():
    for path in sorted((REPO / "conf").glob("*.yaml")):
        assert load_config(path).job == path.stem


def test_minimal_config_gets_defaults(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert isinstance(config.task, EmbedTaskConfig)
    assert config.batching.batch_size == 64 and config.batching.pad_to_multiple_of == "auto"
    assert config.sink.mode == "overwrite_partition" and config.sink.partition_by == ["ds"]
    assert config.source.id_column == "doc_id"


def test_overrides_set_nested_values_with_yaml_types(tmp_path):
    config = load_config(
        write(tmp_path, MINIMAL),
        overrides=["batching.batch_size=128", "run.ds=2026-11-29", "source.keep_columns=[a, b]",
                   "task.labels.pos=a happy text", "spark.conf.spark.sql.foo=1"],
    )
    assert config.batching.batch_size == 128
    assert config.run.ds == dt.date(2026, 11, 29)
    assert config.source.keep_columns == ["a", "b"]
    assert config.task.labels == {"pos": "a happy text"}
    # Spark settings are dotted themselves: everything after spark.conf. is one key
    assert config.spark.conf == {"spark.sql.foo": "1"}


def test_unknown_key_names_the_path_and_allowed_keys(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL), overrides=["batching.batchsize=3"])
    message = str(err.value)
    assert "batching.batchsize: unknown key" in message
    assert "batch_size" in message and "max_length" in message


def test_bad_literal_lists_allowed_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, MINIMAL), overrides=["sink.mode=apend"])
    message = str(err.value)
    assert "sink.mode" in message and "'append'" in message and "'overwrite_partition'" in message


def test_bad_number_and_missing_key(tmp_path):
    with pytest.raises(ConfigError, match=r"batching.batch_size: .*greater than 0"):
        load_config(write(tmp_path, MINIMAL), overrides=["batching.batch_size=0"])
    with pytest.raises(ConfigError, match=r"model: required key is missing"):
        load_config(write(tmp_path, MINIMAL.replace("model: {path: /models/m}\n", "")))


def test_unknown_task_kind(tmp_path):
    with pytest.raises(ConfigError, match="task"):
        load_config(write(tmp_path, MINIMAL), overrides=["task.kind=translate"])


def test_source_needs_a_location(tmp_path):
    with pytest.raises(ConfigError, match="format 'table' needs"):
        load_config(write(tmp_path, MINIMAL), overrides=["source.format=table"])


def test_environment_variables_and_defaults(tmp_path, monkeypatch):
    text = MINIMAL.replace("/data/out", '"${OUT_ROOT}/out"').replace("/models/m", '"${MODEL_DIR:-/opt/model}"')
    monkeypatch.setenv("OUT_ROOT", "/lake")
    config = load_config(write(tmp_path, text))
    assert config.sink.path == "/lake/out" and config.model.path == "/opt/model"
    monkeypatch.delenv("OUT_ROOT")
    with pytest.raises(ConfigError, match="OUT_ROOT is not set"):
        load_config(write(tmp_path, text))


def test_overlays_merge_deeply(tmp_path):
    overlay = write(tmp_path, "batching: {batch_size: 8}\nsink: {mode: append}\n", "env.yaml")
    config = load_config(write(tmp_path, MINIMAL), overlays=[overlay], overrides=["batching.max_length=32"])
    assert (config.batching.batch_size, config.batching.max_length, config.sink.mode) == (8, 32, "append")
    assert config.sink.path == "/data/out"


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1"])
def test_malformed_override(bad):
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_overrides([bad])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "job: [unclosed"))


# a run id is text wherever it is given: a scheduler's ds_nodash (20261129) is an int to YAML, 2026-11-29 a date,
# and 0123 an octal 83
@pytest.mark.parametrize("written", ["20261129", "2026-11-29", "0123", "2026-11-29T02:00:00", "12:30", "1_000"])
def test_a_run_id_is_kept_as_written_in_yaml_in_set_and_on_the_command_line(tmp_path, written):
    from pipeline.cli import build_parser, config_from_args

    path = write(tmp_path, MINIMAL + f"run: {{run_id: {written}}}\n")
    assert load_config(path).run.run_id == written
    assert load_config(write(tmp_path, MINIMAL, "bare.yaml"), overrides=[f"run.run_id={written}"]).run.run_id == written
    args = build_parser().parse_args(["run", str(tmp_path / "bare.yaml"), "--run-id", written])
    assert config_from_args(args).run.run_id == written


def test_a_run_id_given_as_a_number_or_a_date_in_python_is_its_text_and_other_values_stay_refused(tmp_path):
    from pipeline.config import build_config

    raw = {"job": "j", "source": {"path": "/d"}, "model": {"path": "/m"}, "task": {"kind": "embed"},
           "sink": {"path": "/out"}}
    assert build_config({**raw, "run": {"run_id": 20261129}}).run.run_id == "20261129"
    assert build_config({**raw, "run": {"run_id": dt.date(2026, 11, 29)}}).run.run_id == "2026-11-29"
    assert load_config(write(tmp_path, MINIMAL), overrides=["run.run_id=null"]).run.run_id is None
    assert load_config(write(tmp_path, MINIMAL), overrides=["run.run_id='007'"]).run.run_id == "007"
    for bad in (True, 1.5, ["a"], "two words"):
        with pytest.raises(ConfigError, match="run.run_id"):
            build_config({**raw, "run": {"run_id": bad}})
    with pytest.raises(ConfigError, match="run.run_id"):
        load_config(write(tmp_path, MINIMAL), overrides=["run.run_id=a/b"])
    # the other keys keep their types: a date-shaped ds is a date, a number where text is wanted is refused
    assert load_config(write(tmp_path, MINIMAL), overrides=["run.ds=2026-11-29"]).run.ds == dt.date(2026, 11, 29)
    with pytest.raises(ConfigError, match="job: Input should be a valid string"):
        load_config(write(tmp_path, MINIMAL.replace("job: t", "job: 20261129")))
