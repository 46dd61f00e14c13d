"""The config sections of where rows come from and go: the source, the sink, and the S3 settings of both.

Unknown keys and bad values fail validation naming the key path
(:class:`~pipeline.config.base.ConfigSection`); a source or sink without a
location is refused here, before any Spark work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_serializer, model_validator

from pipeline.config.base import ConfigSection
from pipeline.config.redaction import REDACTED

__all__ = ["SinkConfig", "SourceConfig", "StorageConfig"]


SourceFormat = Literal["delta", "table", "parquet", "json", "text", "binary_file"]


class SourceConfig(ConfigSection):
    """Where the rows to score come from."""

    format: SourceFormat = Field(
        "delta", description="`delta`, `table`, `parquet`, `json`, `text`, `binary_file` (files as rows: "
        "`path`, `modificationTime`, `length`, `content`; id: `path`)")
    path: str | None = Field(
        None, description="a local path or any URI (`s3://...`, `abfss://...`, `file:/...`), passed to Spark "
        "untouched; a remote `delta` path needs the Delta connector; `text` ids are `<file URI>:<line>`; "
        "`binary_file`: a folder (read recursively) or a glob")
    table: str | None = Field(None, description="`catalog.schema.name` of a `table` source")
    id_column: str = Field("id", description="the row id column (checked before any work); `binary_file`: `path`")
    text_column: str = Field("text", description="text tasks: the column scored (checked before any work)")
    keep_columns: list[str] = Field(default_factory=list, description="source columns copied unchanged to the output")
    where: str | None = Field(None, description="SQL filter applied to the source")
    limit: int | None = Field(None, gt=0, description="row cap")
    repartition: int | None = Field(
        None, gt=0, description="inference tasks (rows dealt evenly by input length); none: planned from the row count "
        "(see `spark.rows_per_task`)")
    unique_ids: bool = Field(False, description="fail before work on null or duplicate ids")

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
        return self


class SinkConfig(ConfigSection):
    """Where results go: a Delta table by path (or a catalog table with the Delta connector)."""

    path: str | None = Field(
        None, description="output Delta folder: a local path, or any URI with the Delta connector "
        "(refused before any work without it)")
    table: str | None = Field(None, description="output catalog table (needs the Delta connector)")
    # overwrite_partition replaces only this run's partition (for example one ds),
    # so a rerun of the same day replaces its rows instead of duplicating them.
    mode: Literal["append", "overwrite", "overwrite_partition"] = Field(
        "overwrite_partition", description="`append`, `overwrite`, `overwrite_partition` (replace this run's `ds`)")
    partition_by: list[str] = Field(default_factory=lambda: ["ds"], description="partition columns")
    writer: Literal["auto", "delta", "deltalake"] = Field(
        "auto", description="`auto`, `delta` (the connector), `deltalake` (Python data source)")
    quarantine_path: str | None = Field(
        None, description="where failed rows go; none: `<sink.path>_quarantine`")
    leftover_grace_s: float = Field(
        900.0, gt=0, description="`deltalake` writer: seconds without a heartbeat after which an unfinished "
        "write counts as dead, so the next job's sweep (or `pipeline vacuum`) deletes its uncommitted files")

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
