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

A :class:`Location` is all of that, asked once where a path enters (a config section's ``location``, the
arguments of ``score(df)``) and passed on typed, so no stage classifies the string again:

>>> loc = Location.of("s3a://lake/scores/")
>>> loc.scheme, loc.local, loc.object_store, loc.path, loc.uri, str(loc)
('s3a', False, True, None, 's3://lake/scores', 's3a://lake/scores/')
>>> Location.of(loc) is loc, Location.of("file:///data/x").path, Location.of("gs://b/t").reachable
(True, '/data/x', False)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Union

__all__ = ["OBJECT_STORE_SCHEMES", "Location", "has_delta_log", "is_local", "local_path", "resolve_location",
           "uri_scheme"]

# the remote schemes delta-rs (the deltalake writer and readers) reaches itself: S3, and Hadoop's name for it
OBJECT_STORE_SCHEMES = ("s3", "s3a")
DELTA_LOG = "_delta_log"

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


def has_delta_log(folder: "str | os.PathLike[str]") -> bool:
    """Whether the local ``folder`` holds a Delta table: it has a ``_delta_log`` folder. The one such check."""
    return os.path.isdir(os.path.join(folder, DELTA_LOG))


@dataclass(frozen=True)
class Location:
    """A location parsed once: its scheme, whether it is local or an object store, and the forms its readers
    take. Made by :meth:`of`; ``str()`` gives it back as written (messages name what the user wrote).

    ``options`` are the delta-rs storage options of an object store, resolved on the driver by
    :func:`pipeline.io.stores.located` (None: not resolved, or a local location)."""

    raw: str
    scheme: str | None
    # a plain path or a file: URI (the local or a mounted file system)
    local: bool
    # s3:// or s3a://, which delta-rs reaches itself
    object_store: bool
    # the absolute local path (None for a remote URI)
    path: str | None
    # what Spark gets: a plain path made absolute (executors may run elsewhere), any URI untouched
    spark: str
    # what delta-rs opens: s3://bucket/key for an S3 URI, the absolute local path, else the URI as written
    uri: str
    options: Mapping[str, str] | None = None

    @classmethod
    def of(cls, location: "Union[str, os.PathLike[str], Location]") -> "Location":
        """``location`` parsed (a Location is returned as it is). Raises ValueError for a ``file:`` URI naming
        a host, as :func:`local_path` does."""
        if isinstance(location, Location):
            return location
        raw = os.fspath(location)
        scheme = uri_scheme(raw)
        local = scheme in (None, "file")
        store = scheme in OBJECT_STORE_SCHEMES
        path = local_path(raw) if local else None
        uri = "s3://" + raw.split("://", 1)[1].rstrip("/") if store else (path or raw)
        return cls(raw=raw, scheme=scheme, local=local, object_store=store, path=path,
                   spark=os.path.abspath(raw) if scheme is None else raw, uri=uri)

    @property
    def reachable(self) -> bool:
        """Whether the deltalake writer and readers reach it: a local path or an S3 URI."""
        return self.local or self.object_store

    def is_delta_table(self) -> bool:
        """Whether a local location holds a Delta table (:func:`has_delta_log`); a remote one is not looked at
        here (False): the stores answer for S3 (:func:`pipeline.io.stores.is_table`)."""
        return self.path is not None and has_delta_log(self.path)

    def __str__(self) -> str:
        return self.raw
