"""The config sections of where rows come from and go: the source, the sink, and the S3 settings of both.

Unknown keys and bad values fail validation naming the key path
(:class:`~pipeline.config.base.ConfigSection`); a source or sink without a
location is refused here, before any Spark work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_serializer, model_validator

from pipeline.config.base import READS, WRITES, ConfigSection
from pipeline.config.redaction import REDACTED
from pipeline.core.locations import Location

__all__ = ["SinkConfig", "SourceConfig", "StorageConfig", "StreamConfig"]


SourceFormat = Literal["delta", "table", "parquet", "json", "text", "binary_file"]
# the source formats a stream reads: new Delta versions, or new files in a folder
STREAM_FORMATS = ("delta", "parquet", "json")


class StreamConfig(ConfigSection):
    """Read the source as a stream (Structured Streaming): each micro-batch scores only what arrived since the
    last one, and commits once (see docs/streaming.md)."""

    checkpoint_path: str = Field(
        description="the query's checkpoint folder (a local path or any URI Spark reaches): what was read, "
        "micro-batch by micro-batch; one folder per job, kept between runs (a new folder reads the source from "
        "its start again)", json_schema_extra=WRITES)
    trigger: Literal["available_now", "processing_time"] = Field(
        "available_now", description="`available_now`: score what is there and stop (a nightly job); "
        "`processing_time`: keep running, a micro-batch every `interval_s` (stopped by SIGTERM)")
    interval_s: float = Field(
        60.0, gt=0, description="`processing_time`: seconds between the starts of micro-batches")
    max_files_per_trigger: int | None = Field(
        None, gt=0, description="the most new files (Delta: data files) one micro-batch reads; none: Spark's "
        "default (1,000 for Delta and file sources)")
    max_bytes_per_trigger: int | None = Field(
        None, gt=0, description="Delta source: the most bytes of new data files one micro-batch reads (whole "
        "commits, at least one; with the connector a soft limit); none: no limit")
    starting_version: int | None = Field(
        None, ge=0, description="Delta source: the first table version read (its rows and the later versions'); "
        "none: the whole table as it is when the stream first starts, then every version after it")
    schema_ddl: str | None = Field(
        None, description="file sources: the rows' schema as DDL (`doc_id string, text string`); none: taken "
        "from the files in the folder when the stream starts (an empty folder then needs it)")
    record_every_s: float = Field(
        3600.0, gt=0, description="`processing_time`: one runs-table row per this many seconds of micro-batches "
        "(and one when the stream stops); `available_now` records one row per run")


class SourceConfig(ConfigSection):
    """Where the rows to score come from."""

    format: SourceFormat = Field(
        "delta", description="`delta`, `table`, `parquet`, `json`, `text`, `binary_file` (files as rows: "
        "`path`, `modificationTime`, `length`, `content`; id: `path`)")
    path: str | None = Field(
        None, description="a local path or any URI (`s3://...`, `abfss://...`, `file:/...`), passed to Spark "
        "untouched; a remote `delta` path needs the Delta connector; `text` ids are `<file URI>:<line>`; "
        "`binary_file`: a folder (read recursively) or a glob", json_schema_extra=READS)
    table: str | None = Field(None, description="`catalog.schema.name` of a `table` source")

    @property
    def location(self) -> Location | None:
        """``path`` parsed (:class:`~pipeline.core.locations.Location`): what the run passes on; None without one."""
        return Location.of(self.path) if self.path else None
    id_column: str = Field("id", description="the row id column (checked before any work); `binary_file`: `path`")
    text_column: str = Field("text", description="text tasks: the column scored (checked before any work)")
    keep_columns: list[str] = Field(default_factory=list, description="source columns copied unchanged to the output")
    where: str | None = Field(None, description="SQL filter applied to the source")
    limit: int | None = Field(None, gt=0, description="row cap")
    repartition: int | None = Field(
        None, gt=0, description="inference tasks (rows dealt evenly by input length); none: planned from the row count "
        "(see `spark.rows_per_task`)")
    unique_ids: bool = Field(False, description="fail before work on null or duplicate ids")
    stream: StreamConfig | None = Field(
        None, description="read the source as a stream: only what arrived since the last micro-batch "
        "(`delta`, `parquet`, `json`); none: a batch over the whole source")

    @model_validator(mode="before")
    @classmethod
    def _binary_file_id(cls, data: Any) -> Any:
        # a folder of files has no id column of its own: each file's path is its id
        if isinstance(data, dict) and data.get("format") == "binary_file" and "id_column" not in data:
            data = {**data, "id_column": "path"}
        return data

    @model_validator(mode="after")
    def _location(self) -> "SourceConfig":
        if self.format == "table":
            if not self.table:
                raise ValueError("format 'table' needs 'table: catalog.schema.name'")
        elif not self.path:
            raise ValueError(f"format {self.format!r} needs 'path'")
        if self.stream is not None:
            if self.format not in STREAM_FORMATS:
                raise ValueError(f"stream: format {self.format!r} cannot be read as a stream; use one of "
                                 f"{', '.join(STREAM_FORMATS)}, or drop 'stream' to score it as a batch")
            if self.limit is not None:
                raise ValueError(f"stream: 'limit' {self.limit} has no meaning for a stream (each micro-batch "
                                 "reads what arrived); drop it, or use stream.max_files_per_trigger")
            if self.stream.starting_version is not None and self.format != "delta":
                raise ValueError("stream.starting_version is for a delta source; a folder of files is read "
                                 "from the files not read before")
            if self.stream.schema_ddl is not None and self.format == "delta":
                raise ValueError("stream.schema_ddl is for file sources; a Delta table has its own schema")
        return self


class SinkConfig(ConfigSection):
    """Where results go: a Delta table by path (or a catalog table with the Delta connector)."""

    path: str | None = Field(
        None, description="output Delta folder: a local path, or any URI with the Delta connector "
        "(refused before any work without it)", json_schema_extra=WRITES)
    table: str | None = Field(None, description="output catalog table (needs the Delta connector)")
    # overwrite_partition replaces only this run's partition (for example one ds),
    # so a rerun of the same day replaces its rows instead of duplicating them.
    mode: Literal["append", "overwrite", "overwrite_partition"] = Field(
        "overwrite_partition", description="`append`, `overwrite`, `overwrite_partition` (replace this run's `ds`)")
    partition_by: list[str] = Field(default_factory=lambda: ["ds"], description="partition columns")
    writer: Literal["auto", "delta", "deltalake"] = Field(
        "auto", description="`auto`, `delta` (the connector), `deltalake` (Python data source)")
    quarantine_path: str | None = Field(
        None, description="where failed rows go; none: `<sink.path>_quarantine`", json_schema_extra=WRITES)
    leftover_grace_s: float = Field(
        900.0, gt=0, description="`deltalake` writer: seconds without a heartbeat after which an unfinished "
        "write counts as dead, so the next job's sweep (or `pipeline vacuum`) deletes its uncommitted files")

    @property
    def location(self) -> Location | None:
        """``path`` parsed (:class:`~pipeline.core.locations.Location`): what the run passes on; None without one."""
        return Location.of(self.path) if self.path else None

    @property
    def quarantine_location(self) -> Location:
        """:meth:`resolved_quarantine_path` parsed (same ValueError for a catalog sink without one)."""
        return Location.of(self.resolved_quarantine_path())

    def resolved_quarantine_path(self) -> str:
        if self.quarantine_path:
            return self.quarantine_path
        if self.path:
            return self.path.rstrip("/") + "_quarantine"
        raise ValueError("sink.table needs an explicit sink.quarantine_path")

    @model_validator(mode="after")
    def _location(self) -> "SinkConfig":
        if not (self.path or self.table):
            raise ValueError("needs 'path' (a Delta table folder) or 'table' (a catalog table)")
        if self.mode == "overwrite_partition" and not self.partition_by:
            raise ValueError("mode 'overwrite_partition' needs 'partition_by', e.g. [ds]")
        return self


class StorageConfig(ConfigSection):
    """S3 settings of the job's ``s3://``/``s3a://`` locations, over the environment's ``AWS_*`` variables.

    Give the keys as ``${VAR}`` (secrets stay out of YAML): they are held as secrets, dumped and
    printed as ``***``, and reach only the stores (the deltalake writer and readers, resolved on the
    driver and handed to their tasks) and the S3A settings of a session the library builds.
    """

    access_key_id: SecretStr | None = Field(
        None, description="S3 access key id, as `${VAR}`; none: `$AWS_ACCESS_KEY_ID`, else the SDKs' own chain")
    secret_access_key: SecretStr | None = Field(
        None, description="S3 secret access key, as `${VAR}`; none: `$AWS_SECRET_ACCESS_KEY`")
    session_token: SecretStr | None = Field(
        None, description="session token of temporary keys, as `${VAR}`; none: `$AWS_SESSION_TOKEN`")
    region: str | None = Field(None, description="the buckets' region; none: `$AWS_REGION`/`$AWS_DEFAULT_REGION`")
    endpoint_url: str | None = Field(
        None, description="an S3-compatible server (MinIO, moto), e.g. `http://127.0.0.1:9000` (S3A then uses "
        "path-style access); none: `$AWS_ENDPOINT_URL`, else AWS")
    allow_http: bool | None = Field(
        None, description="`true` for a plain-HTTP `endpoint_url`; none: `$AWS_ALLOW_HTTP`")

    @field_serializer("access_key_id", "secret_access_key", "session_token")
    def _hidden(self, value: SecretStr | None) -> str | None:
        return None if value is None else REDACTED

    def options(self) -> dict[str, str]:
        """The settings given, in delta-rs's option names (``aws_access_key_id``, ...), secrets revealed.

        >>> StorageConfig(region="eu-west-1", allow_http=True).options()
        {'aws_region': 'eu-west-1', 'aws_allow_http': 'true'}
        """
        values = {
            "aws_access_key_id": self.access_key_id, "aws_secret_access_key": self.secret_access_key,
            "aws_session_token": self.session_token, "aws_region": self.region,
            "aws_endpoint_url": self.endpoint_url,
            "aws_allow_http": None if self.allow_http is None else str(self.allow_http).lower(),
        }
        revealed = {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in values.items()}
        return {k: v for k, v in revealed.items() if v}  # `${TOKEN:-}` left empty: not given
