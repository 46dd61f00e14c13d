"""A local S3-compatible server (moto's server mode) on loopback, for tests and ``make demo-s3``.

Object-store paths are exercised for real: the Delta connector writes ``s3a://`` through Hadoop's S3A
file system and the AWS SDK, against this server, exactly as it would against S3. Nothing leaves the
machine: the server binds 127.0.0.1 and every client is pointed at it.

    with local_s3(buckets=["demo"]) as s3:
        confs = s3.spark_confs()        # spark.hadoop.fs.s3a.* for a session or spark-submit
        env = s3.credentials_env()      # AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (made-up, local only)

Credentials come from the environment (S3A's environment-variable provider), never from a config
file, and are never printed.
"""

from __future__ import annotations

import os
import socket
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

    def client(self):
        """A boto3 S3 client on this server (to create buckets and list what a job wrote)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=_REGION,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def local_s3(*, buckets: Sequence[str] = (), port: int | None = None) -> Iterator[LocalS3]:
    """Start moto's S3 server on 127.0.0.1 (a free port unless given), create ``buckets``, stop it after."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover - moto[server] is in the lock
        raise RuntimeError("the local S3 server needs moto[server] (pip install 'moto[server]'; make venv has it)") \
            from exc
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # not a line per request on the console
    port = port or _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        s3 = LocalS3(endpoint=f"http://127.0.0.1:{port}",
                     access_key=os.environ.get("SBI_LOCAL_S3_KEY", "local-test-key"),
                     secret_key=os.environ.get("SBI_LOCAL_S3_SECRET", "local-test-secret"))
        client = s3.client()
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield s3
    finally:
        server.stop()
