"""``get_session``: a Connect session from ``spark.remote`` / ``SPARK_REMOTE``; runtime settings on both kinds."""

from __future__ import annotations

from pipeline.config import SparkConfig
from pipeline.spark.session import apply_session_settings, is_connect, remote_url


def test_remote_from_config_then_environment(monkeypatch):
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert remote_url(SparkConfig()) is None
    monkeypatch.setenv("SPARK_REMOTE", "sc://env:15002")
    assert remote_url(SparkConfig()) == "sc://env:15002"
    assert remote_url(SparkConfig(remote="sc://conf:15002")) == "sc://conf:15002"


def test_runtime_settings_apply_on_both_kinds(any_spark, request):
    assert is_connect(any_spark) == request.node.name.endswith("[connect]")
    before = any_spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    try:
        apply_session_settings(any_spark, SparkConfig(arrow_max_records_per_batch=777, shuffle_partitions=3))
        assert any_spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch") == "777"
        assert any_spark.conf.get("spark.sql.shuffle.partitions") == "3"
    finally:
        apply_session_settings(any_spark, SparkConfig(arrow_max_records_per_batch=int(before), shuffle_partitions=4))
