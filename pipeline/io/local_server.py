"""A server in a process of its own on loopback: started, waited for until it listens, stopped.

The local S3 server (:func:`pipeline.io.local_s3.local_s3`) and the test suites' Spark Connect servers
start this way::

    port = free_port()
    with local_server([sys.executable, "-m", "moto.server", "-p", str(port)], port=port, name="moto's S3 server"):
        ...  # 127.0.0.1:<port> answers here
"""

from __future__ import annotations

import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping, Sequence

__all__ = ["free_port", "local_server", "port_open"]

_HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the system's pick)."""
    with socket.socket() as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (asked for at most a second)."""
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((_HOST, port)) == 0


@contextmanager
def local_server(cmd: Sequence[str], *, port: int, name: str, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, log: Path | None = None, start_timeout_s: float = 60.0,
                 poll_s: float = 0.2, stop_timeout_s: float = 10.0) -> Iterator[subprocess.Popen]:
    """Start ``cmd``, wait until it listens on 127.0.0.1:``port`` and yield its process; stop it after
    (SIGTERM, then SIGKILL past ``stop_timeout_s``).

    Its output goes to ``log`` (none: nowhere). Fails with a :class:`RuntimeError` naming ``name``, its exit
    status and the end of its log when it exits before it listens, or does not listen within ``start_timeout_s``.
    """
    if log is None:
        server = subprocess.Popen(list(cmd), env=None if env is None else dict(env), cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    else:
        with open(log, "wb") as sink:
            server = subprocess.Popen(list(cmd), env=None if env is None else dict(env), cwd=cwd, stdout=sink,
                                      stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not port_open(port):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = f"; its log ends:\n{log.read_text(errors='replace')[-3000:]}" if log is not None else ""
                raise RuntimeError(f"{name} did not start on {_HOST}:{port} (exit {server.poll()}){tail}")
            time.sleep(poll_s)
        yield server
    finally:
        server.terminate()
        try:
            server.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
