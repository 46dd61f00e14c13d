"""The driver's half of a ``sbi_delta`` write: one Delta transaction for the files the tasks wrote.

:func:`commit_write` is what :meth:`DeltaLakeArrowWriter.commit <pipeline.io.delta.writer.DeltaLakeArrowWriter.commit>`
does with the add actions of the successful attempts:

- a retry of a run whose transaction (``txn_app_id``) the table holds commits nothing;
- with ``require_marker`` the write's marker is taken over first (a sweep that claimed it wins);
- a keyed append commits only the keys no commit since ``read_version`` wrote, retrying against
  each overlapping commit that lands first (:mod:`pipeline.io.delta.keys`);
- a plain append or replace commits once; a replace of one partition carries that partition's
  conflict token, so two replaces of a partition with no files yet cannot both land;
- a column someone else added to the table stays (:mod:`pipeline.io.delta.schema`);
- afterwards the write's marker says what happened and the leftovers of dead writes are swept
  (:mod:`pipeline.io.delta.sweep`). Any failure deletes the files of this write.

>>> DeltaCommit.replace_token({"ds": "2026-11-28"})
'sbi.replace:ds=2026-11-28'
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pyarrow as pa

from pipeline.io.delta import markers
from pipeline.io.delta.files import (TALLY_KEY, PartFile, add_action, attempt_of, check_partitioning,
                                     delete_files, partition_string, sweep_orphans)
from pipeline.io.delta.options import APP_ID_KEY, KEYS_KEY, WRITE_ID_KEY, DeltaLakeOptions

__all__ = ["DeltaCommit", "commit_write"]

_KEYED_ATTEMPTS = 5


def commit_write(store: Any, adds: list[dict[str, Any]], lake: DeltaLakeOptions, *, schema: pa.Schema,
                 overwrite: bool) -> None:
    """Commit ``adds`` (the add actions of every successful task attempt) as one Delta transaction."""
    DeltaCommit(store, lake, schema=schema, overwrite=overwrite).run(adds)


class DeltaCommit:
    """One commit of one write: its store, its typed options, the schema and whether it replaces."""

    def __init__(self, store: Any, lake: DeltaLakeOptions, *, schema: pa.Schema, overwrite: bool) -> None:
        self.store = store
        self.path = store.uri
        self.lake = lake
        self.write_id = lake.write_id
        self.partition_by = list(lake.partition_by)
        self.schema = schema
        self.overwrite = overwrite
        # what the finished marker records: the outcome, and the version the commit read the table at
        # (the writer finds its commit's log entry from there on: pipeline.io.delta.history.commit_entry)
        self.facts: dict[str, Any] = {}

    def run(self, adds: list[dict[str, Any]]) -> None:
        """Commit ``adds``; record the outcome in the write's marker, then sweep dead writes' leftovers."""
        from deltalake.exceptions import TableNotFoundError

        facts = self.facts
        received = [a["path"] for a in adds]
        try:
            try:
                table = self.store.table()
            except TableNotFoundError:
                table = None
            if self.lake.replace_where:
                self._check_inside_partition(adds)
            if self.lake.faults:
                from pipeline.core import faults

                faults.on_commit(self.write_id, self.lake.faults)
            if not self.overwrite and table is not None and self._holds_this_run(table):
                # this logical run already committed (its driver died after the commit): a retry adds nothing
                delete_files(self.store, adds)
                facts["already_committed"] = True
                return
            if self.lake.require_marker:
                markers.claim_for_commit(self.store, self.write_id)
            if self.lake.key_columns and not self.overwrite:
                adds, facts["overlap_rows"] = self._commit_keyed(table, adds)
            elif not self._commit_plain(table, adds):
                delete_files(self.store, adds)  # a concurrent try of this very run created the table first
                facts["already_committed"] = True
                return
        except BaseException as exc:
            delete_files(self.store, adds)
            facts["error"] = f"{type(exc).__name__}: {exc}"[:500]
            raise
        finally:
            markers.finish_marker(self.store, self.write_id, **facts)
            self._sweep_own(received, [a["path"] for a in adds], failed="error" in facts)
        markers.finish_marker(self.store, self.write_id, swept=self._sweep())

    def _sweep_own(self, received: list[str], committed: list[str], *, failed: bool) -> None:
        """Delete this write's files no commit references: all of them after a failure; else, where some
        can be (a retried task attempt's, a keyed append's left out or rewritten ones), in the folders its
        files went to. A write whose every task succeeded at its first attempt and whose files all went into
        the commit has none, and lists nothing (its table's size does not matter)."""
        if failed:
            sweep_orphans(self.store, self.write_id, keep=set())
            return
        retried = any((attempt_of(p) or 0) > 0 for p in received)
        if retried or set(received) != set(committed):
            folders = {p.rsplit("/", 1)[0] if "/" in p else "" for p in (*received, *committed)}
            sweep_orphans(self.store, self.write_id, keep=set(committed), folders=folders)

    def _sweep(self) -> dict[str, Any]:
        """Sweep dead writes' leftovers when the markers ask for it (:func:`~pipeline.io.delta.sweep.sweep_due`);
        what went, as the finished marker records it ({}: no sweep was due)."""
        from pipeline.io.delta.sweep import stamp_swept, sweep_due, sweep_leftovers

        try:
            why = sweep_due(self.store, own=self.write_id, grace_s=self.lake.leftover_grace_s)
            if why is None:
                return {}
            report = sweep_leftovers(self.store, grace_s=self.lake.leftover_grace_s)
            stamp_swept(self.store)
        except Exception as exc:  # noqa: BLE001 - the commit landed; a failed sweep is retried by the next job
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}
        return {"files": len(report.files), "bytes": report.bytes, "markers": len(report.markers), "why": why,
                "log_entries": report.log_entries,
                **({"skipped": report.skipped} if report.skipped else {}),
                **({"left_alone": report.unproven[:20], "left_alone_count": len(report.unproven)}
                   if report.unproven else {})}

    def _properties(self, adds: list[dict[str, Any]], tokens: Sequence[str] = (), token_version: int = 0, *,
                    once: bool = False) -> Any:
        """The commit's properties: its metadata (with the key tally of ``adds``, the files it commits, when
        each was tallied), the run's transaction, ``tokens`` as conflict tokens (delta-rs rejects a commit when
        one that landed since it read the table carries one of them)."""
        from deltalake import CommitProperties
        from deltalake.transaction import Transaction

        metadata = {**self.lake.commit_metadata, WRITE_ID_KEY: self.write_id}
        if (keys := _keys_of(adds)) is not None:
            metadata[KEYS_KEY] = keys
        transactions = [Transaction(t, token_version) for t in tokens]
        if self.lake.txn_app_id:
            metadata[APP_ID_KEY] = self.lake.txn_app_id
            transactions.insert(0, Transaction(self.lake.txn_app_id, self.lake.txn_version))
        return CommitProperties(custom_metadata=metadata, app_transactions=transactions or None,
                                **({"max_commit_retries": 0} if once else {}))

    def _commit_plain(self, table: Any, adds: list[dict[str, Any]]) -> bool:
        """Append ``adds``, or replace the table (or the partition) with them; False when a concurrent try
        of this very run created the table first (nothing committed). ``table`` None: there was none."""
        from deltalake.exceptions import CommitFailedError

        from pipeline.errors import SinkError, lost_commit_message

        actions = [add_action(a) for a in adds]
        self.facts["base_version"] = None if table is None else table.version()
        if table is None:
            if self._create_table(actions, self._properties(adds, once=True)):
                return True
            if self.overwrite:  # another job created the table after this one looked
                raise SinkError(lost_commit_message(self.path, "it created the table first", winner=self._winner(None)))
            table = self.store.table()  # an append goes into the table that won
            if self._holds_this_run(table):
                return False
        check_partitioning(table, self.partition_by, self.path)
        mode = "overwrite" if self.overwrite else "append"
        filters, props = None, self._properties(adds)
        read_version = table.version()
        self.facts["base_version"] = read_version
        replace_where = self.lake.replace_where
        if self.overwrite and replace_where:
            filters = [(c, "=", partition_string(v)) for c, v in replace_where.items()]
            # A replace of a partition that has no files yet removes nothing, and delta-rs lets two such
            # commits both land (every row twice). The partition's token makes them conflict, like two
            # replaces of a partition that has files.
            props = self._properties(adds, [self.replace_token(replace_where)], read_version + 1)
        try:
            table.create_write_transaction(
                actions, mode, self._kept_schema(table), partition_by=self.partition_by or None,
                partition_filters=filters, commit_properties=props,
            )
        except CommitFailedError as exc:
            where = f" partition {dict(replace_where)}" if replace_where else ""
            raise SinkError(lost_commit_message(f"{self.path}{where}", str(exc).splitlines()[0],
                                                winner=self._winner(read_version))) from None
        return True

    def _commit_keyed(self, table: Any, adds: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Append ``adds`` without the keys that commits since ``read_version`` wrote; returns the adds
        committed and the rows dropped. The commit carries the key's conflict token: when an overlapping
        run's commit with the same token lands first, delta-rs rejects this one and the keys are checked
        again against that commit (:mod:`pipeline.io.delta.keys`)."""
        from deltalake.exceptions import CommitFailedError

        from pipeline.errors import SinkError
        from pipeline.io.delta import keys as delta_keys

        key_columns = list(self.lake.key_columns)
        base, dropped = self.lake.read_version, 0
        for attempt in range(_KEYED_ATTEMPTS):
            if table is not None:
                check_partitioning(table, self.partition_by, self.path)
                current = table.version()
                if base is None or current > base:
                    added = delta_keys.files_added_since(table, self.store, base)
                    taken = delta_keys.taken_keys(self.store, added, key_columns, self.partition_by)
                    adds, n = delta_keys.drop_taken(self.store, adds, taken, key_columns, self.partition_by,
                                                    rewrite=self._rewrite)
                    dropped += n
                base = current
            tokens = sorted({delta_keys.key_token(key_columns, a["partition_values"]) for a in adds}
                            or {delta_keys.key_token(key_columns, {})})
            actions = [add_action(a) for a in adds]
            self.facts["base_version"] = base
            try:
                if table is None:
                    if not self._create_table(actions, self._properties(adds, tokens, (base or 0) + 1, once=True)):
                        raise CommitFailedError("another job created the table first")
                else:
                    table.create_write_transaction(actions, "append", self._kept_schema(table),
                                                   partition_by=self.partition_by or None,
                                                   commit_properties=self._properties(adds, tokens, (base or 0) + 1))
                return adds, dropped
            except Exception as exc:  # noqa: BLE001 - a commit that lost the race: check the winner's keys
                lost = isinstance(exc, CommitFailedError) or (table is None and self.store.is_table())
                if not lost or attempt == _KEYED_ATTEMPTS - 1:
                    if lost:
                        raise SinkError(f"conflict: {_KEYED_ATTEMPTS} overlapping commits to {self.path} won the "
                                        "race in a row; this job committed nothing. Rerun it: the keys already "
                                        "written are not scored again") from None
                    raise
                table = self.store.table()
        raise AssertionError("unreachable")

    def _create_table(self, actions: list[Any], props: Any) -> bool:
        """Create the table with ``actions`` as its version 0; False when another job created it first.

        delta-rs retries a create that lost the race for version 0 as a second ``CREATE TABLE`` at the
        next version, rows included: two overlapping first runs left every row twice. Without commit
        retries (``props`` made with ``once``) the losing create fails instead, and the caller writes
        into the table that won.
        """
        from deltalake import Schema as DeltaSchema
        from deltalake.transaction import create_table_with_add_actions

        try:
            create_table_with_add_actions(
                self.path, DeltaSchema.from_arrow(self.schema), actions, mode="append",
                partition_by=self.partition_by or None, commit_properties=props,
                storage_options=self.store.options or None,
            )
        except Exception:
            if self.store.is_table():  # lost the race: the caller decides (check keys, append, or conflict)
                return False
            raise
        return True

    def _kept_schema(self, table: Any) -> Any:
        """The table's schema with this write's new columns added: a column someone else added stays
        (:mod:`pipeline.io.delta.schema`); a type clash fails the commit, naming the column."""
        from deltalake import Schema as DeltaSchema

        from pipeline.errors import SinkError
        from pipeline.io.delta.schema import merge_schemas

        try:
            return merge_schemas(table.schema(), DeltaSchema.from_arrow(self.schema))
        except ValueError as exc:
            raise SinkError(f"Delta table {self.path}: {exc}") from None

    @staticmethod
    def replace_token(replace_where: Mapping[str, Any]) -> str:
        """The conflict token of a partition replace: one per replaced partition of a table."""
        return "sbi.replace:" + ",".join(f"{c}={partition_string(v)}" for c, v in sorted(replace_where.items()))

    def _winner(self, read_version: int | None) -> str | None:
        """Who committed after ``read_version``, as its commit says (``run X, version N``); None if unknown."""
        try:
            table = self.store.table()
            newer = [e for e in table.history(limit=max(1, table.version() - (read_version or -1)))
                     if int(e.get("version", -1)) > (-1 if read_version is None else read_version)]
        except Exception:  # noqa: BLE001 - the conflict stands without a name
            return None
        for entry in sorted(newer, key=lambda e: -int(e["version"])):
            run = entry.get("sbi.run_id")
            if entry.get(WRITE_ID_KEY) != self.write_id:
                return f"run {run}, version {entry['version']}" if run else f"version {entry['version']}"
        return None

    def _holds_this_run(self, table: Any) -> bool:
        """The table already holds this logical run's transaction (an earlier or concurrent try committed it):
        its app id at this write's version or a later one (Delta's rule for ``txnAppId``/``txnVersion``)."""
        if not self.lake.txn_app_id:
            return False
        held = table.transaction_version(self.lake.txn_app_id)
        return held is not None and held >= self.lake.txn_version

    def _rewrite(self, partition_values: dict[str, Any], rows: pa.Table) -> dict[str, Any]:
        """A staged file again, with fewer rows (its old file is swept as an orphan after the commit)."""
        key = tuple(partition_values.get(c) for c in self.partition_by)
        part = PartFile(self.store, self.partition_by, key, self.write_id, "keyed", tally=self.lake.tally_columns)
        part.write(rows)
        return part.close()

    def _check_inside_partition(self, adds: list[dict[str, Any]]) -> None:
        want = {c: partition_string(v) for c, v in self.lake.replace_where.items()}
        for add in adds:
            if add["partition_values"] != want:
                raise ValueError(
                    f"rows for partition {add['partition_values']} were written while replacing only {want}; "
                    "every row must belong to the replaced partition"
                )


def _keys_of(adds: list[dict[str, Any]]) -> str | None:
    """The key tally of the files ``adds`` commit (``rows:hash``), when each file's writer tallied its rows."""
    from pipeline.core.rows import KeyTally

    total = KeyTally()
    for add in adds:
        part = KeyTally.from_text(add.get(TALLY_KEY)) if add.get(TALLY_KEY) else None
        if part is None:
            return None
        total = total + part
    return total.to_text()
