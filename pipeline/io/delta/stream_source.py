"""A Delta table read as a stream without the Delta connector: a Spark Python streaming data source on
delta-rs and pyarrow (``format("sbi_delta_stream")``), for jar-free sessions; with the connector a stream
reads ``format("delta")`` (:mod:`pipeline.io.streams` chooses).

An offset is ``{"version": v, "snapshot": s}``: every row through table version ``v`` has been read.
``snapshot`` is true only for the start of a stream without ``stream.starting_version``: its first
micro-batch reads the whole table at the version it finds (delta-rs resolves that snapshot), as the
connector does. Every later micro-batch reads what each commit after the last one read added, from that
commit's own record in the log (``_delta_log/<version>.json``, the Delta protocol's account of what a
version did; delta-rs offers no per-commit actions in Python):

- ``add`` actions with ``dataChange`` are the new rows (one Spark task per data file, read with pyarrow);
- a commit that rewrites files without changing rows (``OPTIMIZE``: ``dataChange`` false) adds nothing;
- a commit that removes rows (a delete, update, merge or overwrite) stops the query: a stream reads
  appends, and would otherwise miss the change or read rows twice;
- a commit that changes the schema (a ``metaData`` action with other columns) stops the query, naming the
  columns; a restart reads on with the new schema (older files give nulls for an added column).

``stream.max_files_per_trigger`` / ``max_bytes_per_trigger`` end a micro-batch before the commit that would
pass the limit (whole commits, at least one). From Spark 4.2 pyspark hands ``latestOffset`` the micro-batch's start
and the limit. Below it pyspark asks ``latestOffset()`` with neither, so the reader keeps them itself (options
``own_limits``, ``resume_offset``): the start is the checkpoint's last offset when the query starts (read on the
driver, :func:`pipeline.io.streams.open_stream`), then each end it hands out. An available-now query there reads
one micro-batch only (Spark 4.0 and 4.1 run a source without ``SupportsTriggerAvailableNow`` as a single batch),
so the job runs it on a processing-time trigger, with ``until_version`` (the table's version when it starts)
as the last version read, and stops it there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader

from pipeline.errors import SourceError
from pipeline.io.delta.log import action_path, log_entry
from pipeline.io.delta.reader import FilePartition, NamedDataSource, file_batches, log_string

__all__ = ["STREAM_FORMAT", "CommitFiles", "DeltaStreamDataSource", "commit_files", "schema_change",
           "stream_options"]

STREAM_FORMAT = "sbi_delta_stream"

try:  # pyspark 4.2: an available-now query asks the source for its end offset once, then reads in limits
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as _AvailableNow
except ImportError:  # pragma: no cover - older pyspark: an available-now query reads all in one micro-batch
    _AvailableNow = object  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class CommitFiles:
    """What one commit added for a stream: ``files`` (``{"path", "partition_values", "size"}``)."""

    version: int
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(int(f.get("size") or 0) for f in self.files)


def schema_change(before: str, after: str) -> str | None:
    """What changed between two Delta schema strings (the log's ``schemaString``), in words; None when nothing.

    >>> a = '{"type":"struct","fields":[{"name":"id","type":"string","nullable":true,"metadata":{}}]}'
    >>> b = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}},' \\
    ...     '{"name":"lang","type":"string","nullable":true,"metadata":{}}]}'
    >>> schema_change(a, b)
    'column lang added (string); column id: string -> long'
    >>> schema_change(a, a) is None
    True
    """
    def columns(text: str) -> dict[str, str]:
        return {f["name"]: json.dumps(f["type"]) if isinstance(f["type"], dict) else f["type"]
                for f in json.loads(text).get("fields", [])}

    old, new = columns(before), columns(after)
    changes = [f"column {name} added ({new[name]})" for name in new if name not in old]
    changes += [f"column {name} removed" for name in old if name not in new]
    changes += [f"column {name}: {old[name]} -> {new[name]}" for name in old if name in new and old[name] != new[name]]
    return "; ".join(changes) or None


def commit_files(store: Any, version: int, *, schema_string: str, path: str) -> CommitFiles:
    """The data files commit ``version`` of the table in ``store`` added, from its log entry; raises
    :class:`SourceError` for a commit a stream cannot follow (rows removed, the schema changed, the entry gone)."""
    actions = log_entry(store, version)
    if actions is None:
        raise SourceError(
            f"the log entry of version {version} of the stream's source {path} is gone (the table's log retention "
            "removed it before this stream read it): the checkpoint is too far behind. Start the stream again with "
            "a new stream.checkpoint_path (and stream.starting_version to say where to begin)")
    files, operation = [], "?"
    for action in actions:
        if "commitInfo" in action:
            operation = action["commitInfo"].get("operation", operation)
        elif refusal := _refusal(action, version, path=path, schema_string=schema_string, operation=operation):
            raise SourceError(refusal)
        elif "add" in action and action["add"].get("dataChange", True):
            add = action["add"]
            files.append({"path": action_path(add), "partition_values": dict(add.get("partitionValues") or {}),
                          "size": int(add.get("size") or 0)})
    return CommitFiles(version, files)


def _refusal(action: dict[str, Any], version: int, *, path: str, schema_string: str, operation: str) -> str | None:
    """Why a stream cannot follow ``action`` of commit ``version`` (the schema changed, rows removed); None: it can."""
    if "metaData" in action and (change := schema_change(schema_string, action["metaData"]["schemaString"])):
        return (f"the schema of the stream's source {path} changed at version {version}: {change}. The query "
                "stopped before reading it; if the job can score the new rows (its source.id_column, text column "
                "and keep_columns are still there), run the same command again: the stream reads on from version "
                f"{version} with the new schema")
    if "remove" in action and action["remove"].get("dataChange", True):
        return (f"version {version} of the stream's source {path} removes or rewrites rows ({operation}); a stream "
                "reads appended rows only, so it stopped before that version. Score the table as a batch "
                "(drop source.stream; run.incremental scores only changed rows), or start a new stream with "
                f"stream.starting_version {version + 1} and a new stream.checkpoint_path")
    return None


def stream_options(store: Any, *, arrow_schema: pa.Schema, schema_string: str, starting_version: int | None,
                   max_files: int | None, max_bytes: int | None, resume_offset: dict | None = None,
                   own_limits: bool = False, until_version: int | None = None) -> dict[str, str]:
    """The Spark options of a ``sbi_delta_stream`` read (the S3 settings under the key Spark redacts).

    ``own_limits``: the reader applies the read limits itself (pyspark below 4.2), from ``resume_offset`` (the
    checkpoint's last offset; None: the stream's first) and, for an available-now run, to ``until_version``."""
    options = {"path": store.location, "arrow_schema": arrow_schema.serialize().to_pybytes().hex(),
               "schema_string": schema_string}
    for key, value in (("starting_version", starting_version), ("max_files", max_files), ("max_bytes", max_bytes),
                       ("until_version", until_version)):
        if value is not None:
            options[key] = str(value)
    if own_limits:
        options["own_limits"] = "1"
        if resume_offset is not None:
            options["resume_offset"] = json.dumps(resume_offset)
    if store.remote:
        options["storage_options_secret"] = json.dumps(store.options)
    return options


class DeltaStreamDataSource(NamedDataSource):
    """``format("sbi_delta_stream")``: the rows appended to a Delta table, micro-batch by micro-batch."""

    format_name = STREAM_FORMAT

    def streamReader(self, schema: Any) -> "DeltaStreamReader":
        return DeltaStreamReader(dict(self.options))


class DeltaStreamReader(DataSourceStreamReader, _AvailableNow):
    """The offsets, the files of each micro-batch and their rows (see the module's docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        from pipeline.io.stores import TableStore

        self.store = TableStore(options["path"], json.loads(options.get("storage_options_secret") or "null"))
        self.schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(options["arrow_schema"])))
        self.schema_string = options["schema_string"]
        self.starting_version = _int(options.get("starting_version"))
        self.max_files, self.max_bytes = _int(options.get("max_files")), _int(options.get("max_bytes"))
        self._commits: dict[int, CommitFiles] = {}
        self._target: int | None = _int(options.get("until_version"))  # an available-now query's last version
        # below Spark 4.2: the limits applied here, from the start the reader keeps (see the module's docstring)
        self.own_limits = options.get("own_limits") == "1"
        self._start: dict | None = json.loads(options["resume_offset"]) if options.get("resume_offset") else None

    def prepareForTriggerAvailableNow(self) -> None:
        """An available-now query reads to the version the table has now, in micro-batches within the limit."""
        self._target = self.store.table().version()

    def initialOffset(self) -> dict:
        if self.starting_version is None:
            return {"version": -1, "snapshot": True}
        return {"version": self.starting_version - 1, "snapshot": False}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxFiles

        if self.max_files:
            return ReadMaxFiles(self.max_files)
        return ReadMaxBytes(self.max_bytes) if self.max_bytes else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        """The offset this micro-batch reads to: the table's latest version, or (with a read limit, after the
        first micro-batch) the last commit that keeps the new files within it. pyspark below 4.2 asks without
        ``start`` and ``limit``: from the start this reader keeps, within its own limits (``own_limits``), else
        to the latest version."""
        if start is None and self.own_limits:
            start = self._start if self._start is not None else self.initialOffset()
            end = self.latestOffset(start, _Limits(self.max_files, self.max_bytes))
            self._start = end  # Spark reads this micro-batch to it; the next starts there
            return end
        latest = self.store.table().version() if self._target is None else self._target
        if start is None or start.get("snapshot"):
            return {"version": latest, "snapshot": False}
        if latest <= start["version"]:
            return start
        max_files, max_bytes = getattr(limit, "max_files", None), getattr(limit, "max_bytes", None)
        if not max_files and not max_bytes:
            return {"version": latest, "snapshot": False}
        files, size, end = 0, 0, start["version"]
        while end < latest:  # whole commits, at least one, while they stay within the limit
            commit = self._commit(end + 1)
            files, size = files + len(commit.files), size + commit.bytes
            if end > start["version"] and ((max_files and files > max_files) or (max_bytes and size > max_bytes)):
                break
            end += 1
        return {"version": end, "snapshot": False}

    def partitions(self, start: dict, end: dict) -> Sequence[FilePartition]:
        if start.get("snapshot"):
            return [FilePartition(f["path"], f["partition_values"]) for f in self._snapshot(end["version"])]
        return [FilePartition(f["path"], f["partition_values"])
                for version in range(start["version"] + 1, end["version"] + 1) for f in self._commit(version).files]

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        yield from file_batches(self.store, partition.rel, partition.partition_values, self.schema)

    def commit(self, end: dict) -> None:
        for version in [v for v in self._commits if v <= end["version"]]:
            del self._commits[version]

    def _commit(self, version: int) -> CommitFiles:
        if version not in self._commits:
            self._commits[version] = commit_files(self.store, version, schema_string=self.schema_string,
                                                  path=self.store.location)
        return self._commits[version]

    def _snapshot(self, version: int) -> list[dict[str, Any]]:
        """Every data file of the table at ``version`` (the first micro-batch of a stream read from the start)."""
        table = self.store.table(version=version)
        if change := schema_change(self.schema_string, table.schema().to_json()):
            raise SourceError(f"the schema of the stream's source {self.store.location} changed before the first "
                              f"micro-batch read it ({change}); run the same command again")
        columns = list(table.metadata().partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        return [{"path": action_path(a), "partition_values": {c: log_string(a.get(f"partition.{c}")) for c in columns}}
                for a in actions]


@dataclass(frozen=True)
class _Limits:
    """The read limits as pyspark 4.2's ``ReadMaxFiles`` / ``ReadMaxBytes`` carry them (below 4.2: the options')."""

    max_files: int | None
    max_bytes: int | None


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "", "None") else None
