"""``source.stream``: what a streaming job's config takes, the default it gets, and what it refuses before any work."""

from __future__ import annotations

import pytest

from pipeline.config import ConfigError, build_config

RAW = {"job": "j", "source": {"format": "delta", "path": "/data/in",
                              "stream": {"checkpoint_path": "/chk/j"}},
       "model": {"path": "/m"}, "task": {"kind": "embed"}, "sink": {"path": "/data/out"}}


def _with(**sections):
    return {**RAW, **{k: {**RAW.get(k, {}), **v} for k, v in sections.items()}}


def test_a_stream_appends_and_reads_what_is_there_by_default():
    config = build_config(RAW)
    stream = config.source.stream
    assert (stream.trigger, stream.interval_s, stream.max_files_per_trigger) == ("available_now", 60.0, None)
    assert config.sink.mode == "append", "each micro-batch appends: the default for a stream"
    assert build_config({**RAW, "source": {"format": "delta", "path": "/data/in"}}).sink.mode == "overwrite_partition"
    timed = build_config(_with(source={"stream": {"checkpoint_path": "/c", "trigger": "processing_time",
                                                   "interval_s": 5, "record_every_s": 600}}))
    assert (timed.source.stream.trigger, timed.source.stream.interval_s) == ("processing_time", 5.0)


@pytest.mark.parametrize("change, says", [
    ({"sink": {"mode": "overwrite_partition"}}, "set sink.mode: append"),
    ({"run": {"incremental": True}}, "choose one"),
    ({"source": {"format": "text"}}, "format 'text' cannot be read as a stream"),
    ({"source": {"limit": 10}}, "'limit' 10 has no meaning for a stream"),
    ({"source": {"format": "json", "stream": {"checkpoint_path": "/c", "starting_version": 3}}},
     "starting_version is for a delta source"),
    ({"source": {"stream": {"checkpoint_path": "/c", "schema_ddl": "id string"}}}, "schema_ddl is for file sources"),
    ({"source": {"stream": {"checkpoint_path": "/c", "trigger": "once"}}}, "available_now.*processing_time"),
    ({"source": {"stream": {"checkpoint_path": "/c", "interval_s": 0}}}, "interval_s"),
])
def test_what_a_stream_cannot_do_is_refused_naming_the_key(change, says):
    with pytest.raises(ConfigError, match=says):
        build_config(_with(**change))


def test_a_stream_needs_its_checkpoint():
    with pytest.raises(ConfigError, match="checkpoint_path"):
        build_config({**RAW, "source": {"format": "delta", "path": "/data/in", "stream": {}}})
