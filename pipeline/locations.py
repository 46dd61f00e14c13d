"""Locations are URIs: what is a local path, what is remote, and the local path a ``file:`` URI names.

A location with a URI scheme (``s3://``, ``s3a://``, ``abfss://``, ``gs://``,
``dbfs:/`` ...) is handed to Spark (or the Delta connector) exactly as written:
turning ``s3://lake/scores`` into an absolute local path would write a folder
named ``s3:`` and report success. Plain paths and ``file:`` URIs are local.
Pure string functions, on the ground floor: the tables (``pipeline.io``), the
staging of tasks (``pipeline.journal``) and the faces all ask them.

>>> uri_scheme("s3://lake/scores"), uri_scheme("dbfs:/mnt/x"), uri_scheme("/data/x"), uri_scheme("C:\\\\data")
('s3', 'dbfs', None, None)
>>> is_local("file:///data/scores"), is_local("warehouse/scores"), is_local("abfss://c@a.dfs.core.windows.net/t")
(True, True, False)
>>> local_path("file:///data/My%20Scores")
'/data/My Scores'
"""

from __future__ import annotations

import os
import re

__all__ = ["is_local", "local_path", "resolve_location", "uri_scheme"]

# RFC 3986 scheme; two letters at least, so a Windows drive ("C:\\data") is not a scheme.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")


def uri_scheme(location: str) -> str | None:
    """The lower-cased URI scheme of ``location``, or None for a plain path."""
    match = _SCHEME.match(location)
    return match.group(1).lower() if match else None


def is_local(location: str) -> bool:
    """Whether ``location`` is on the local (or a mounted) file system: a plain path or a ``file:`` URI."""
    return uri_scheme(location) in (None, "file")


def local_path(location: str) -> str:
    """The absolute local path of a plain path or a ``file:`` URI (``file:/x``, ``file:///x``).

    Raises ValueError for a remote URI: callers check :func:`is_local` first.
    """
    from urllib.parse import unquote, urlparse

    scheme = uri_scheme(location)
    if scheme is None:
        return os.path.abspath(location)
    if scheme != "file":
        raise ValueError(f"{location!r} is not a local path (scheme {scheme!r})")
    parsed = urlparse(location)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{location!r} names host {parsed.netloc!r}; a file: URI must be file:/path or file:///path")
    return os.path.abspath(unquote(parsed.path))


def resolve_location(location: str) -> str:
    """What to hand Spark: a plain path made absolute (executors may run elsewhere), any URI untouched."""
    return os.path.abspath(location) if uri_scheme(location) is None else location
