"""A local S3-compatible server (moto's server mode) on loopback, for tests and ``make demo-s3``.

Object-store paths are exercised for real: the Delta connector writes ``s3a://`` through Hadoop's S3A
file system and the AWS SDK, and the deltalake writer through delta-rs's own object store and pyarrow,
against this server, exactly as they would against S3. Nothing leaves the
machine: the server binds 127.0.0.1 and every client is pointed at it.

    with local_s3(buckets=["demo"]) as s3:
        confs = s3.spark_confs()        # spark.hadoop.fs.s3a.* for a session or spark-submit
        env = s3.credentials_env()      # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (made-up, local only)
        env = s3.env()                  # the same and AWS_ENDPOINT_URL / AWS_ALLOW_HTTP, for delta-rs and pyarrow

Credentials come from the environment (S3A's environment-variable provider), never from a config
file, and are never printed.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

__all__ = ["LocalS3", "local_s3"]

_REGION = "us-east-1"


@dataclass(frozen=True)
class LocalS3:
    endpoint: str  # http://127.0.0.1:PORT
    access_key: str
    secret_key: str

    def spark_confs(self) -> dict[str, str]:
        """``spark.hadoop.fs.s3a.*`` pointing S3A at this server (path-style, plain HTTP, keys from the env)."""
        return {f"spark.hadoop.{k}": v for k, v in self.hadoop_confs().items()}

    def hadoop_confs(self, *, with_keys: bool = False) -> dict[str, str]:
        """The S3A settings; the keys come from the JVM's environment (:meth:`credentials_env` at its
        launch), or, ``with_keys``, from two Hadoop settings (a JVM already running: set them at runtime)."""
        confs = {
            "fs.s3a.endpoint": self.endpoint,
            "fs.s3a.endpoint.region": _REGION,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": "false",
            "fs.s3a.aws.credentials.provider":
                "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider",
        }
        if with_keys:
            confs.update({"fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                          "fs.s3a.access.key": self.access_key, "fs.s3a.secret.key": self.secret_key})
        return confs

    def credentials_env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": _REGION}

    def env(self) -> dict[str, str]:
        """:meth:`credentials_env` and the endpoint (plain HTTP), the variables delta-rs and pyarrow read:
        what the deltalake writer needs to reach this server (``pipeline.io.stores``)."""
        return {**self.credentials_env(), "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def client(self):
        """A boto3 S3 client on this server (to create buckets and list what a job wrote)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=_REGION,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)


@contextmanager
def local_s3(*, buckets: Sequence[str] = (), port: int | None = None) -> Iterator[LocalS3]:
    """Start moto's S3 server on 127.0.0.1 (a free port unless given), create ``buckets``, stop it after.

    The server runs in a process of its own, as a real store does: a client that blocks in native code
    while holding the GIL (delta-rs listing a log) would otherwise wait on a server thread that cannot run.
    """
    import importlib.util
    import sys

    from pipeline.io.local_server import free_port, local_server

    if importlib.util.find_spec("moto.server") is None:  # pragma: no cover - moto[server] is in the lock
        raise RuntimeError("the local S3 server needs moto[server] (pip install 'moto[server]'; make venv has it)")
    port = port or free_port()
    with local_server([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port=port,
                      name="moto's S3 server"):
        s3 = LocalS3(endpoint=f"http://127.0.0.1:{port}",
                     access_key=os.environ.get("SBI_LOCAL_S3_KEY", "local-test-key"),
                     secret_key=os.environ.get("SBI_LOCAL_S3_SECRET", "local-test-secret"))
        client = s3.client()
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield s3
