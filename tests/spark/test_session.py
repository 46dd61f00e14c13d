"""``get_session``: a Connect session from ``spark.remote`` / ``SPARK_REMOTE``; runtime settings on both kinds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.config import SparkConfig
from pipeline.core.sessions import is_connect
from pipeline.spark.session import apply_session_settings, remote_url


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


def test_a_local_master_replays_the_delta_log_in_as_many_partitions_as_cores():
    """Delta's default of 50 partitions cost a 100-row job 25 s on 2 local cores (docs/benchmarks_small_jobs.md)."""
    import os

    from pipeline.spark.session import _local_delta_defaults

    key = "spark.databricks.delta.snapshotPartitions"
    assert _local_delta_defaults("local[2,4]") == {key: "2"}
    assert _local_delta_defaults("local-cluster[2, 1, 2048]") == {key: "2"}
    assert _local_delta_defaults("local[*,4]") == {key: str(min(os.cpu_count() or 1, 50))}
    assert _local_delta_defaults("yarn") == {} and _local_delta_defaults("spark://host:7077") == {}


def test_storage_settings_become_the_s3a_settings_of_a_session_built_here():
    from pipeline.config import StorageConfig
    from pipeline.spark.session import s3a_settings

    storage = StorageConfig(access_key_id="ak", secret_access_key="sk", region="eu-west-1",
                            endpoint_url="http://127.0.0.1:9000", allow_http=True)
    assert s3a_settings(storage.options()) == {
        "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        "spark.hadoop.fs.s3a.access.key": "ak", "spark.hadoop.fs.s3a.secret.key": "sk",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1", "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
    }
    temporary = s3a_settings(StorageConfig(access_key_id="ak", secret_access_key="sk", session_token="t").options())
    assert temporary["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(".TemporaryAWSCredentialsProvider")
    assert temporary["spark.hadoop.fs.s3a.session.token"] == "t"
    assert s3a_settings(StorageConfig().options()) == {}, "nothing given: S3A's own chain and settings"


@pytest.mark.connector
def test_a_local_session_has_the_cached_jars_on_its_drivers_class_path(spark, tmp_path):
    """On a local master the connector's jars are on the driver JVM's class path, where the executor (the same JVM)
    finds them and the class archive holds their classes, not in ``spark.jars``, which copied them (690 MB with
    S3A) into every new session's scratch folder; the session writes and reads Delta through them."""
    from pipeline.io.sources import has_delta_connector

    conf = spark.sparkContext.getConf()
    class_path = conf.get("spark.driver.extraClassPath", "").split(os.pathsep)
    assert any("delta-spark" in Path(p).name for p in class_path), class_path
    assert not conf.get("spark.jars", ""), "nothing in spark.jars: nothing copied at the session's start"
    assert has_delta_connector(spark)
    spark.range(3).selectExpr("id", "'x' as v").write.format("delta").save(str(tmp_path / "t"))
    assert spark.read.format("delta").load(str(tmp_path / "t")).count() == 3
