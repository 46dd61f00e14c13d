"""Where the deltalake writer and readers keep a table: a local folder or an S3 bucket, one interface.

delta-rs opens ``s3://`` locations with its own object store (no JVM, no jars); pyarrow's
``S3FileSystem`` writes and reads the Parquet files. Hadoop's ``s3a://`` names the same objects,
so it is mapped to ``s3://`` for both. Settings come from the environment of the process that
resolves them (the driver), in the names the AWS SDKs read, unless a job's config names them
(its ``storage:`` section, applied with :func:`using_settings` while the job runs: they win):

``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``   the keys (or none: the
    SDKs' own chain, an instance profile, is used)
``AWS_REGION`` (or ``AWS_DEFAULT_REGION``)    the bucket's region
``AWS_ENDPOINT_URL``                          an S3-compatible server (MinIO, moto on loopback)
``AWS_ALLOW_HTTP``                            ``true`` for a plain-HTTP endpoint

Concurrent commits are safe because every commit is a conditional put (``If-None-Match: *`` on the
log entry, delta-rs's ``conditional_put: etag``): of two writers creating the same version one
wins, the other gets a conflict and re-checks. A store configured to commit by unsafe rename
(``AWS_S3_ALLOW_UNSAFE_RENAME=true``) is refused: two writers could both win.

The settings are resolved once, on the driver, and travel to the write and read tasks inside their
:class:`TableStore` (or a Spark option whose key says ``secret``, which Spark redacts): executors need
neither the variables nor the config. Other object stores (``gs://``, ``abfss://``, ``wasbs://``,
``dbfs:/``) are not reached here: :data:`OBJECT_STORE_SCHEMES` are the only remote schemes.

>>> delta_uri("s3a://lake/scores"), delta_uri("s3://lake/scores/")
('s3://lake/scores', 's3://lake/scores')
>>> is_object_store("s3a://lake/t"), is_object_store("/data/t"), is_object_store("abfss://c@a/t")
(True, False, False)
>>> opts = storage_options("s3a://lake/t", environ={"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
...                                                 "AWS_ALLOW_HTTP": "true", "AWS_REGION": "eu-west-1"})
>>> opts["aws_conditional_put"], opts["aws_endpoint_url"], opts["aws_region"], opts["aws_allow_http"]
('etag', 'http://127.0.0.1:9000', 'eu-west-1', 'true')
>>> with using_settings({"aws_region": "us-east-2"}):
...     storage_options("s3://lake/t", environ={"AWS_REGION": "eu-west-1"})["aws_region"]
'us-east-2'
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping, Union

from pipeline.errors import PipelineError
from pipeline.core.locations import OBJECT_STORE_SCHEMES, Location

__all__ = ["OBJECT_STORE_SCHEMES", "StoreError", "TableStore", "configured", "delta_uri", "is_object_store",
           "is_table", "located", "open_table", "reachable", "storage_options", "table_store",
           "unreachable_reason", "using_settings"]

# a location as a caller gives it: a string (user-facing code, tests) or parsed once (the run's stages)
Where = Union[str, Location]
# environment variable -> delta-rs storage option (object_store's AmazonS3ConfigKey names)
_ENV_OPTIONS = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
    "AWS_DEFAULT_REGION": "aws_region",
    "AWS_REGION": "aws_region",
    "AWS_ENDPOINT_URL": "aws_endpoint_url",
    "AWS_ALLOW_HTTP": "aws_allow_http",
}
UNSAFE_RENAME = "AWS_S3_ALLOW_UNSAFE_RENAME"
SETTING_NAMES = frozenset(_ENV_OPTIONS.values())

# the settings of the job this process runs (its config's ``storage:``), over the environment's
_settings: dict[str, str] = {}
_settings_users = 0
_settings_lock = threading.Lock()


class StoreError(PipelineError, ValueError):
    """A location whose store settings would make the writer unsafe or cannot be reached (still a ``ValueError``,
    as it was before it joined the :class:`~pipeline.errors.PipelineError` tree)."""


def is_object_store(location: Where) -> bool:
    """Whether ``location`` is on S3 (``s3://`` or Hadoop's ``s3a://``), which delta-rs reaches itself."""
    return Location.of(location).object_store


def reachable(location: Where) -> bool:
    """Whether the deltalake writer and readers reach ``location``: a local path or an S3 URI."""
    return Location.of(location).reachable


def unreachable_reason(location: Where) -> str | None:
    """Why the deltalake writer and readers cannot reach ``location``; None when they can.

    >>> unreachable_reason("s3a://b/t") is None, unreachable_reason("gs://b/t")
    (True, 'the deltalake package here reaches local or mounted paths, s3:// and s3a://, not gs:')
    """
    loc = Location.of(location)
    if loc.reachable:
        return None
    return f"the deltalake package here reaches local or mounted paths, s3:// and s3a://, not {loc.scheme}:"


@contextmanager
def using_settings(settings: Mapping[str, str | None] | None) -> Iterator[None]:
    """Resolve S3 settings from ``settings`` (delta-rs option names: ``aws_access_key_id``, ``aws_region``,
    ...) over the environment's while the block runs; empty values are left to the environment.

    The runner wraps a job in it with the config's ``storage:`` section. The settings are the process's
    (the job's threads see them too), so two jobs in one process at once must name the same ones.
    """
    given = {k: str(v) for k, v in (settings or {}).items() if v not in (None, "")}
    unknown = sorted(set(given) - SETTING_NAMES)
    if unknown:
        raise StoreError(f"unknown S3 setting(s) {unknown}; known: {sorted(SETTING_NAMES)}")
    global _settings, _settings_users
    with _settings_lock:
        if _settings_users and given != _settings:
            raise StoreError("another job in this process runs with other storage settings; run jobs with "
                             "different storage: sections in separate processes")
        _settings, _settings_users = given, _settings_users + 1
    try:
        yield
    finally:
        with _settings_lock:
            _settings_users -= 1
            if not _settings_users:
                _settings = {}


def delta_uri(location: Where) -> str:
    """What delta-rs opens: ``s3://bucket/key`` for an S3 URI, else the absolute local path."""
    loc = Location.of(location)
    if not loc.reachable:
        raise ValueError(f"{loc.raw!r} is not a local path (scheme {loc.scheme!r})")
    return loc.uri


def located(location: Where, *, environ: Mapping[str, str] | None = None) -> Location:
    """``location`` parsed, with its S3 settings resolved now (:func:`storage_options`): what the run's stages
    pass on, so the readers and writers open it without resolving again."""
    loc = Location.of(location)
    if not loc.object_store:
        return loc
    return replace(loc, options=storage_options(loc.raw, environ=environ))


def storage_options(location: Where, *, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """delta-rs storage options for ``location`` from ``environ`` (the process environment) and the
    settings of :func:`using_settings` over it; None if local.

    Always ``aws_conditional_put: etag``: every log entry is created with ``If-None-Match``, so two
    concurrent commits of one version cannot both land. Raises :class:`StoreError` when the
    environment asks for unsafe-rename commits. A :class:`Location` made by :func:`located` has them already.
    """
    loc = Location.of(location)
    if not loc.object_store:
        return None
    if loc.options is not None and environ is None:
        return dict(loc.options)
    env = os.environ if environ is None else environ
    if env.get(UNSAFE_RENAME, "").strip().lower() in ("1", "true", "yes"):
        raise StoreError(
            f"{UNSAFE_RENAME}=true is set: delta-rs would commit to {location} without a conditional put, and two "
            "concurrent writers could both write the same version. Unset it: this writer commits with "
            "conditional puts (If-None-Match), which S3 and S3-compatible stores (MinIO, R2) honour"
        )
    options = {opt: env[var] for var, opt in _ENV_OPTIONS.items() if env.get(var)}
    options.update(_settings)
    options["aws_conditional_put"] = "etag"
    return options


def configured(location: Where) -> bool:
    """Whether the environment (or the job's settings) names keys or an endpoint for S3 ``location`` (no
    lookup of instance credentials, no traffic to a cloud metadata endpoint, is needed to try it)."""
    try:
        options = storage_options(location) or {}
    except StoreError:
        return False
    return bool(options.get("aws_access_key_id") or options.get("aws_endpoint_url"))


def open_table(location: Where, *, version: int | None = None, options: Mapping[str, str] | None = None) -> Any:
    """``deltalake.DeltaTable`` at ``location`` (local or S3); ``options`` default to :func:`storage_options`."""
    from deltalake import DeltaTable

    opts = dict(options) if options is not None else storage_options(location)
    return DeltaTable(delta_uri(location), version=version, storage_options=opts or None)


def is_table(location: Where, *, options: Mapping[str, str] | None = None) -> bool:
    from deltalake import DeltaTable

    opts = dict(options) if options is not None else storage_options(location)
    return DeltaTable.is_deltatable(delta_uri(location), storage_options=opts or None)


@dataclass(frozen=True)
class TableStore:
    """A table folder's files: relative paths (``ds=2026-11-28/part-....parquet``) on a local disk or S3.

    Picklable (it travels to the executors with the writer); the file system is made on first use.
    """

    location: str
    options: Mapping[str, str] | None = None
    _fs: list = field(default_factory=list, compare=False, repr=False)

    @property
    def remote(self) -> bool:
        return is_object_store(self.location)

    @property
    def uri(self) -> str:
        return delta_uri(self.location)

    @property
    def root(self) -> str:
        """The table folder in the file system's own terms: a local path, or ``bucket/key``."""
        return self.uri[len("s3://"):] if self.remote else self.uri

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "options": dict(self.options) if self.options else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "location", state["location"])
        object.__setattr__(self, "options", state["options"])
        object.__setattr__(self, "_fs", [])

    @property
    def fs(self) -> Any:
        if not self._fs:
            self._fs.append(_filesystem(self.options or {}) if self.remote else None)
        return self._fs[0]

    def full(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def table(self, *, version: int | None = None) -> Any:
        return open_table(self.location, version=version, options=self.options or {})

    def is_table(self) -> bool:
        return is_table(self.location, options=self.options or {})

    # ------------------------------------------------------------ files
    def parquet_target(self, rel: str) -> tuple[str, Any]:
        """``(where, filesystem)`` for ``pyarrow.parquet.ParquetWriter``; local parent folders are made."""
        full = self.full(rel)
        if not self.remote:
            os.makedirs(os.path.dirname(full), exist_ok=True)
        return full, self.fs

    def stat(self, rel: str) -> tuple[int, float]:
        """``(size in bytes, mtime in seconds)`` of a file."""
        if not self.remote:
            full = self.full(rel)
            return os.path.getsize(full), os.path.getmtime(full)
        info = self.fs.get_file_info(self.full(rel))
        return int(info.size), info.mtime.timestamp()

    def exists(self, rel: str) -> bool:
        if not self.remote:
            return os.path.exists(self.full(rel))
        from pyarrow.fs import FileType

        return self.fs.get_file_info(self.full(rel)).type != FileType.NotFound

    def remove(self, rel: str) -> None:
        """Delete a file; one already gone is fine."""
        if not self.remote:
            try:
                os.remove(self.full(rel))
            except FileNotFoundError:
                pass
            return
        try:
            self.fs.delete_file(self.full(rel))
        except FileNotFoundError:
            pass

    def read_parquet(self, rel: str, *, columns: list[str] | None = None) -> Any:
        import pyarrow.parquet as pq

        return pq.read_table(self.full(rel), columns=columns, filesystem=self.fs)

    def files(self, *, containing: str = "", suffix: str = ".parquet",
              folders: Iterable[str] | None = None) -> Iterator[str]:
        """Relative paths of the files under the table folder whose name holds ``containing``: in the whole
        tree, or only directly in ``folders`` (relative; ``""``: the table folder itself)."""
        if not self.remote:
            from pathlib import Path

            root = Path(self.root)
            if root.is_dir():
                found = (root.rglob(f"*{containing}*{suffix}") if folders is None else
                         (f for d in sorted(set(folders)) for f in (root / d).glob(f"*{containing}*{suffix}")))
                for file in found:
                    yield file.relative_to(root).as_posix()
            return
        from pyarrow.fs import FileSelector, FileType

        base = self.root.rstrip("/") + "/"
        selectors = ([FileSelector(base, recursive=True, allow_not_found=True)] if folders is None else
                     [FileSelector(base + d.strip("/"), allow_not_found=True) for d in sorted(set(folders))])
        for info in (i for sel in selectors for i in self.fs.get_file_info(sel)):
            name = info.path.rsplit("/", 1)[-1]
            if info.type == FileType.File and containing in name and name.endswith(suffix):
                yield info.path[len(base):]

    def write_json(self, rel: str, data: Mapping[str, Any]) -> None:
        text = json.dumps(dict(data), default=str).encode()
        if not self.remote:
            full = self.full(rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as out:
                out.write(text)
            return
        with self.fs.open_output_stream(self.full(rel)) as out:
            out.write(text)

    def read_bytes(self, rel: str) -> bytes | None:
        """A whole file's bytes; None when there is no such file."""
        try:
            if not self.remote:
                with open(self.full(rel), "rb") as src:
                    return src.read()
            with self.fs.open_input_stream(self.full(rel)) as src:
                return src.read()
        except FileNotFoundError:
            return None

    def read_json(self, rel: str) -> dict[str, Any]:
        try:
            if not self.remote:
                with open(self.full(rel), "rb") as src:
                    return json.loads(src.read() or b"{}")
            with self.fs.open_input_stream(self.full(rel)) as src:
                return json.loads(src.read() or b"{}")
        except (OSError, ValueError):
            return {}


def table_store(location: Where, *, environ: Mapping[str, str] | None = None) -> TableStore:
    """The :class:`TableStore` of ``location``, its S3 settings resolved from ``environ`` now (a
    :class:`Location` from :func:`located` brings its own)."""
    loc = Location.of(location)
    return TableStore(loc.raw, storage_options(loc, environ=environ))


def _filesystem(options: Mapping[str, str]) -> Any:
    """pyarrow's ``S3FileSystem`` with the same settings delta-rs got."""
    from pyarrow.fs import S3FileSystem

    endpoint = options.get("aws_endpoint_url")
    kwargs: dict[str, Any] = {"region": options["aws_region"]} if options.get("aws_region") else {}
    if options.get("aws_access_key_id"):
        kwargs.update(access_key=options["aws_access_key_id"], secret_key=options.get("aws_secret_access_key"),
                      session_token=options.get("aws_session_token"))
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    return S3FileSystem(**kwargs)
