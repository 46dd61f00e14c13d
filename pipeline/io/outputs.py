"""One whole file a run writes at its end (the summary JSON, the HTML report): a local path or an S3 object.

``run.summary_path``, ``run.report_path`` and ``sbi report --out`` are locations like any other: a
plain path or ``file:`` URI is a local file (its folders made), ``s3://`` and ``s3a://`` name an object
put through pyarrow's S3 file system with the job's store settings (:mod:`pipeline.io.stores`: the
``storage:`` section over the ``AWS_*`` environment). A URI is never turned into a local path: that
wrote a folder named ``s3:`` beside the driver and reported success. Other schemes are refused
before the run does any work (:func:`check_output`).

>>> check_output("gs://bucket/summary.json", key="run.summary_path")
Traceback (most recent call last):
...
pipeline.errors.SinkError: run.summary_path 'gs://bucket/summary.json': a summary or report is written to a local or mounted path, s3:// or s3a://, not gs:; set run.summary_path to one of those
>>> check_output("s3://bucket", key="run.report_path")
Traceback (most recent call last):
...
pipeline.errors.SinkError: run.report_path 's3://bucket' names a bucket, not a file: give the object's key, e.g. s3://bucket/reports/run.html
"""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import SinkError
from pipeline.io.stores import table_store
from pipeline.core.locations import Location

__all__ = ["check_output", "read_output", "write_output"]


def check_output(location: "str | Location", *, key: str) -> None:
    """Refuse, before any work, a file location this process cannot write (``key`` names the setting)."""
    loc = Location.of(location)
    location = loc.raw
    if loc.local:
        return
    if not loc.object_store:
        raise SinkError(f"{key} {location!r}: a summary or report is written to a local or mounted path, s3:// or "
                        f"s3a://, not {loc.scheme}:; set {key} to one of those")
    if "/" not in location.split("://", 1)[1].strip("/"):
        raise SinkError(f"{key} {location!r} names a bucket, not a file: give the object's key, e.g. "
                        f"{location.rstrip('/')}/reports/run.html")


def write_output(location: "str | Location", data: str | bytes, *, key: str = "the output") -> str:
    """Write ``data`` (text is UTF-8) to ``location`` whole, replacing what was there; returns ``location``."""
    loc = Location.of(location)
    check_output(loc, key=key)
    location = loc.raw
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if loc.local:
        path = Path(loc.path or "")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
        return location
    folder, _, name = location.rstrip("/").rpartition("/")
    store = table_store(folder)
    with store.fs.open_output_stream(store.full(name)) as out:
        out.write(payload)
    return location


def read_output(location: str) -> bytes:
    """The bytes of a file :func:`write_output` wrote (local or S3)."""
    loc = Location.of(location)
    if loc.local:
        return Path(loc.path or "").read_bytes()
    folder, _, name = location.rstrip("/").rpartition("/")
    store = table_store(folder)
    with store.fs.open_input_stream(store.full(name)) as src:
        return bytes(src.read())
