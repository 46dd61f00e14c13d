"""What the ``sbi_delta`` data source is asked to do, typed, and its one translation to Spark options.

Spark hands a data source its options as ``dict[str, str]``. Everything the deltalake writer needs
(where, how it partitions, which partition it replaces, the run's transaction, a keyed append's read
version) is a field of :class:`DeltaLakeOptions`; :meth:`~DeltaLakeOptions.to_options` is the one
place it becomes strings and :meth:`~DeltaLakeOptions.from_options` the one place they are read back,
so the planner and the writer cannot disagree on a key or an encoding.

>>> o = DeltaLakeOptions(path="/t", partition_by=("ds",), write_id="w1", replace_where={"ds": "2026-11-29"},
...                      key_columns=("id", "ds"), read_version=3, txn_app_id="sbi-run-1", txn_version=4,
...                      tally_columns=("id", "content_hash"))
>>> DeltaLakeOptions.from_options(o.to_options()) == o
True
>>> o.to_options()["partition_by"], o.to_options()["read_version"]
('ds', '3')
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["APP_ID_KEY", "FORMAT_NAME", "KEYS_KEY", "SECRET_KEY", "WRITE_ID_KEY", "DeltaLakeOptions"]

# the data source's name: ``df.write.format(FORMAT_NAME)``
FORMAT_NAME = "sbi_delta"
# commit info keys: which write made a commit, and for which logical run
WRITE_ID_KEY = "sbi.write_id"
APP_ID_KEY = "sbi.app_id"
# commit info key: the KeyTally (rows:hash) of the keys the commit's files hold, as their writers tallied them
KEYS_KEY = "sbi.keys"

# Spark redacts the value of an option whose key says "secret" (the S3 settings travel under it)
SECRET_KEY = "storage_options_secret"


def _names(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


@dataclass(frozen=True)
class DeltaLakeOptions:
    """One write of the deltalake-backed data source.

    ``replace_where`` (``{column: value}``, with overwrite) replaces only that partition, like Delta's
    ``replaceWhere``; ``txn_app_id`` (the run key) makes an append idempotent: the commit records the
    transaction ``(txn_app_id, txn_version)`` and is skipped when the table holds that app id at
    ``txn_version`` or later (a stream's micro-batches: its query's app id, the batch id as the version); ``key_columns`` keys an
    append on its rows, committing only keys no commit since ``read_version`` wrote (None: there was no
    table); ``require_marker`` makes the write leave the markers a sweep reads; ``storage_options`` are
    the S3 settings resolved on the driver (None: a local table).
    """

    path: str
    write_id: str
    partition_by: tuple[str, ...] = ()
    commit_metadata: Mapping[str, Any] = field(default_factory=dict)
    faults: Mapping[str, Any] = field(default_factory=dict)
    require_marker: bool = False
    leftover_grace_s: float = 900.0
    target_file_rows: int = 1_000_000
    txn_app_id: str | None = None
    txn_version: int = 0
    replace_where: Mapping[str, Any] = field(default_factory=dict)
    key_columns: tuple[str, ...] = ()
    read_version: int | None = None
    storage_options: Mapping[str, str] | None = None
    # (id column, content hash column): each file's writer tallies their keys (pipeline.core.rows.KeyTally) and the
    # commit records the sum, which the run's read-back compares with what it sent; (): no tally
    tally_columns: tuple[str, ...] = ()

    def to_options(self) -> dict[str, str]:
        """The Spark options that carry this write (the S3 settings under the redacted key)."""
        options = {
            "path": self.path,
            "write_id": self.write_id,
            "partition_by": ",".join(self.partition_by),
            "commit_metadata": json.dumps(dict(self.commit_metadata), default=str),
            "faults": json.dumps(dict(self.faults)),
            "require_marker": "true" if self.require_marker else "false",
            "leftover_grace_s": str(self.leftover_grace_s),
            "target_file_rows": str(self.target_file_rows),
        }
        if self.txn_app_id:
            options["txn_app_id"] = self.txn_app_id
            options["txn_version"] = str(self.txn_version)
        if self.replace_where:
            options["replace_where"] = json.dumps(dict(self.replace_where), default=str)
        if self.key_columns:
            options["key_columns"] = json.dumps(list(self.key_columns))
            options["read_version"] = "" if self.read_version is None else str(self.read_version)
        if self.storage_options is not None:
            options[SECRET_KEY] = json.dumps(dict(self.storage_options))
        if self.tally_columns:
            options["tally_columns"] = json.dumps(list(self.tally_columns))
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "DeltaLakeOptions":
        """Read back what :meth:`to_options` wrote; a write without a path is refused."""
        path = options.get("path")
        if not path:
            raise ValueError("the sbi_delta writer needs .option('path', <table folder>)")
        read_version = options.get("read_version", "")
        secret = json.loads(options.get(SECRET_KEY) or "null")
        return cls(
            path=path,
            write_id=options.get("write_id") or "",
            partition_by=_names(options.get("partition_by")),
            commit_metadata=json.loads(options.get("commit_metadata") or "{}"),
            faults=json.loads(options.get("faults") or "{}"),
            require_marker=options.get("require_marker") == "true",
            leftover_grace_s=float(options.get("leftover_grace_s") or "900"),
            target_file_rows=int(options.get("target_file_rows") or "1000000"),
            txn_app_id=options.get("txn_app_id") or None,
            txn_version=int(options.get("txn_version") or "0"),
            replace_where=json.loads(options.get("replace_where") or "{}"),
            key_columns=tuple(json.loads(options.get("key_columns") or "[]")),
            read_version=int(read_version) if read_version not in ("", "none", "None") else None,
            storage_options=secret,
            tally_columns=tuple(json.loads(options.get("tally_columns") or "[]")),
        )

    def with_storage(self, storage_options: Mapping[str, str] | None) -> "DeltaLakeOptions":
        """This write with the S3 settings the driver resolved (they travel with the write, not the plan)."""
        from dataclasses import replace

        return replace(self, storage_options=None if storage_options is None else dict(storage_options))
