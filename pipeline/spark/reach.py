"""Fail fast on an address nobody answers: the Spark Connect server, the metastore, an object store endpoint.

Left to their own retries, clients wait far longer than anyone watching: the
Spark Connect client retries an unavailable server with backoff for about 14
minutes and prints nothing; Hive and S3A clients retry for minutes too. So
before the job uses an address its config names, the runner opens a TCP
connection to it, retrying refusals (a server still starting) until
``spark.connect_timeout_s`` (30 s by default) has passed, then fails with one
line that names the address, what was tried and what to check. A TCP answer
does not prove the service works: the Connect session's first request is also
bounded by the same setting (:func:`bounded`).

Addresses checked: ``spark.remote`` / ``$SPARK_REMOTE`` (``sc://host:port``,
port 15002 by default); a Hive metastore named in ``spark.conf``
(``spark.hadoop.hive.metastore.uris`` or ``hive.metastore.uris``, any one of a
list answering is enough); the S3A endpoint in ``spark.conf``
(``spark.hadoop.fs.s3a.endpoint``, else ``storage.endpoint_url``) when the source or the sink is an
``s3a://``/``s3://`` location. AWS's own endpoints (no endpoint setting) are not
probed: proxies and VPC endpoints decide there.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, TypeVar
from urllib.parse import urlparse

from pipeline.errors import JobError

__all__ = ["Unreachable", "bounded", "check_job_addresses", "connect_address", "endpoint_address", "job_addresses",
           "probe"]

T = TypeVar("T")
CONNECT_DEFAULT_PORT = 15002


class Unreachable(JobError):
    """An address the job needs did not answer within ``spark.connect_timeout_s``."""


def connect_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of a Spark Connect URL.

    >>> connect_address("sc://127.0.0.1:1/"), connect_address("sc://spark.example.com/;token=abc")
    (('127.0.0.1', 1), ('spark.example.com', 15002))
    """
    parsed = urlparse(url.split(";", 1)[0])
    return parsed.hostname or "localhost", parsed.port or CONNECT_DEFAULT_PORT


def endpoint_address(endpoint: str, *, default_port: int) -> tuple[str, int]:
    """``(host, port)`` of an endpoint written as a URL or as ``host[:port]``.

    >>> endpoint_address("http://127.0.0.1:9000", default_port=443), endpoint_address("s3.eu.example", default_port=443)
    (('127.0.0.1', 9000), ('s3.eu.example', 443))
    >>> endpoint_address("thrift://metastore:9083", default_port=9083), endpoint_address("https://s3.x", default_port=80)
    (('metastore', 9083), ('s3.x', 443))
    """
    parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
    port = parsed.port or {"https": 443, "http": 80}.get(parsed.scheme, default_port)
    return parsed.hostname or endpoint, port


def probe(host: str, port: int, *, timeout_s: float, what: str, check: str,
          connect: Callable[..., Any] = socket.create_connection, clock: Callable[[], float] = time.monotonic) -> None:
    """Open (and close) a TCP connection to ``host:port``, retrying until ``timeout_s``; raise :class:`Unreachable`.

    ``what`` names the service and ``check`` what to look at, for the error line.
    """
    deadline = clock() + timeout_s
    tries, last = 0, "no answer"
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            break
        tries += 1
        try:
            connect((host, port), timeout=min(remaining, 5.0)).close()
            return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
            if isinstance(exc, socket.gaierror):  # a name that does not resolve will not start resolving
                break
        time.sleep(min(1.0, max(deadline - clock(), 0)))
    raise Unreachable(
        f"cannot reach {what} at {host}:{port} ({last}; {tries} tr{'y' if tries == 1 else 'ies'} in "
        f"{timeout_s:g} s): check {check}; spark.connect_timeout_s sets how long to wait"
    )


def bounded(call: Callable[[], T], *, timeout_s: float, what: str) -> T:
    """``call()``, or :class:`Unreachable` once ``timeout_s`` passes without an answer.

    The call runs in a daemon thread that is left behind on a timeout: a
    client blocked in its own retries cannot be interrupted from outside.
    """
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            error.append(exc)

    worker = threading.Thread(target=run, daemon=True, name="sbi-bounded-call")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise Unreachable(f"{what} did not answer within {timeout_s:g} s; spark.connect_timeout_s sets how long "
                          "to wait")
    if error:
        raise error[0]
    return result[0]


def job_addresses(config: Any) -> list[tuple[str, list[tuple[str, int]], str]]:
    """What a job's config makes it reach besides the Spark session: ``[(what, [(host, port)], check)]``.

    ``config`` is a :class:`~pipeline.config.JobConfig`. A list of addresses is
    one service with several servers: one answering is enough.
    """
    conf = dict(config.spark.conf)
    out = []
    uris = conf.get("spark.hadoop.hive.metastore.uris") or conf.get("hive.metastore.uris")
    if uris:
        addresses = [endpoint_address(u.strip(), default_port=9083) for u in uris.split(",") if u.strip()]
        out.append(("the Hive metastore", addresses, "spark.conf hive.metastore.uris and that the metastore runs"))
    locations = [config.source.path or "", config.sink.path or ""]
    endpoint, key = conf.get("spark.hadoop.fs.s3a.endpoint"), "spark.conf spark.hadoop.fs.s3a.endpoint"
    if not endpoint and getattr(getattr(config, "storage", None), "endpoint_url", None):
        endpoint, key = config.storage.endpoint_url, "storage.endpoint_url"
    if endpoint and any(loc.startswith(("s3a://", "s3://")) for loc in locations):
        out.append(("the S3 endpoint", [endpoint_address(endpoint, default_port=443)],
                    f"{key}, the network and that the store runs"))
    return out


def check_job_addresses(config: Any, *, timeout_s: float) -> None:
    """Probe every address of :func:`job_addresses`; the first service with none answering raises."""
    for what, addresses, check in job_addresses(config):
        share = timeout_s / len(addresses)
        failures = []
        for host, port in addresses:
            try:
                probe(host, port, timeout_s=share, what=what, check=check)
                break
            except Unreachable as exc:
                failures.append(str(exc))
        else:
            raise Unreachable(failures[0] if len(failures) == 1 else
                              f"none of the {len(addresses)} addresses of {what} answered: " + " | ".join(failures))
