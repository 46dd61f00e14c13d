"""The quarantine: a run's failed rows with their error, lineage and original inputs, committed before
the output (a crash between the two leaves a day a rerun replaces), and the check that an
``overwrite_partition`` run's output and quarantine hold the same run's rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.config import JobConfig
from pipeline.errors import JobError
from pipeline.core.rows import MALFORMED_COLUMN, QUARANTINED_STATUSES
from pipeline.stages.inputs import malformed_originals
from pipeline.stages.outcomes import LINEAGE_COLUMNS, Prepared, RunPlan
from pipeline.stages.verify import day_rows, write_tallied

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["check_quarantine_pair", "commit_quarantine", "say_swept"]


def _quarantine_rows(scored: "DataFrame", config: JobConfig, input_columns: tuple[str, ...]) -> "DataFrame":
    """Failed rows with their error, lineage and original inputs, one row per failed row.

    The inputs come with the row out of the scoring task (``_sbi_input_<c>``, carried for failed rows only:
    :func:`pipeline.spark.chunks.carry_failed_inputs`), so the source is not read again; a malformed source
    line keeps its raw text in the first input column.
    """
    from pyspark.sql import functions as F

    from pipeline.spark.udf import CARRIED_PREFIX

    id_col = config.source.id_column
    failed = scored.where(F.col("status").isin(*QUARANTINED_STATUSES))
    carried = failed.select(id_col, "content_hash", "status", "error", *LINEAGE_COLUMNS,
                            *(["ds"] if "ds" in scored.columns else []),
                            *[F.col(CARRIED_PREFIX + c).alias(c) for c in (*input_columns, MALFORMED_COLUMN)
                              if CARRIED_PREFIX + c in scored.columns])
    originals = malformed_originals(carried, input_columns)
    kept = [c for c in originals.columns if c not in (*input_columns, MALFORMED_COLUMN)]
    return originals.select(*kept, *_valid_text_and_bytes(originals, input_columns))


def _valid_text_and_bytes(inputs: "DataFrame", input_columns: tuple[str, ...]) -> list[Any]:
    """The quarantine's ``input_<c>`` columns: string inputs as valid UTF-8 (invalid bytes become U+FFFD, so any
    Delta reader opens the table), with the original bytes beside them in ``input_<c>_bytes`` (binary) for the
    rows whose bytes were not valid UTF-8 (null otherwise)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    out = []
    for c in input_columns:
        if isinstance(inputs.schema[c].dataType, StringType):
            out += [F.make_valid_utf8(F.col(c)).alias(f"input_{c}"),
                    F.when(~F.is_valid_utf8(F.col(c)), F.col(c).cast("binary")).alias(f"input_{c}_bytes")]
        else:
            out.append(F.col(c).alias(f"input_{c}"))
    return out


def commit_quarantine(prep: Prepared, plan: RunPlan, scored: "DataFrame", *, errors: int,
                      metadata: dict[str, str]) -> tuple[int | None, str, Any]:
    """The quarantine commit, before the output's: ``(version, run id of its rows, the write's result)``;
    version and result None when there is nothing to commit and no quarantine table yet."""
    from pipeline.core import faults as fault_hooks
    from pipeline.io.delta.history import committed_run_via
    from pipeline.io.delta.plan import CommitOptions

    config, spark, sink, ident = prep.config, prep.spark, plan.sink, plan.identity
    quarantine_path = plan.quarantine_path
    quarantine_version, q = None, None
    quarantine_run = ident.run_id
    # quarantine first: a crash before the output commit leaves a partition a rerun replaces
    if errors or (plan.micro_batch is None and _quarantine_exists(prep, plan)):
        # a run's is written even when empty once it exists, so a rerun replaces that day's failures too (a
        # micro-batch appends, and a replay of it finds its transaction: it commits only failed rows)
        q = write_tallied(prep, _quarantine_rows(scored, config, tuple(prep.task.input_columns)), sink,
                          commit=CommitOptions(txn_app_id=ident.app_id, txn_version=ident.txn_version),
                          partition_values={"ds": ident.ds}, commit_metadata=metadata, path=quarantine_path,
                          in_driver=prep.small, faults=fault_hooks.quarantine_write_faults(prep.faults))
        say_swept(prep, q)
        quarantine_version = q.version
        if q.already_committed:  # an earlier try of this run committed them: read back its rows
            earlier = committed_run_via(spark, quarantine_path, ident.app_id)
            quarantine_run = (earlier and earlier[1]) or ident.run_id
        fault_hooks.after_quarantine_commit(prep.faults, version=q.version, run_id=ident.run_id)
        prep.clock.lap("quarantine commit", rows=errors, version=q.version)
    return quarantine_version, quarantine_run, q


def _quarantine_exists(prep: Prepared, plan: RunPlan) -> bool:
    """Whether the quarantine table exists: as the plan read it (its log, once), else asked now."""
    from pipeline.io.sources import is_delta_table

    if plan.quarantine_state is not None:
        return plan.quarantine_state.exists
    return is_delta_table(prep.spark, plan.quarantine_path)


def check_quarantine_pair(prep: Prepared, plan: RunPlan, *, version: int, when: str) -> None:
    """An ``overwrite_partition`` run's output and quarantine replace the day in two commits: raise when
    another run replaced the day's quarantine after this run's (at ``version``), so the two tables never
    silently hold two runs' rows. A quarantine with no later commit passes without a scan."""
    from pyspark.sql import functions as F

    from pipeline.io.sources import table_version

    spark, run_id, ds, path = prep.spark, plan.identity.run_id, plan.identity.ds, plan.quarantine_path
    latest = table_version(spark, path)
    if latest == version:
        return
    now = day_rows(spark, path, ds, version=latest)  # the version just compared, not resolved again
    others = sorted(r[0] for r in now.where(F.col("run_id") != F.lit(run_id)).select("run_id").distinct()
                    .limit(3).collect())
    if not others and now.count() == day_rows(spark, path, ds, version=version).count():
        return
    by = f"run {', '.join(others)}" if others else "another job"
    raise JobError(f"conflict: {by} replaced the quarantine of ds {ds} in {path} after this run's quarantine "
                   f"commit; {when}")


def say_swept(prep: Prepared, result: Any) -> None:
    """One line for the leftovers a write's sweep removed, one for the files it kept because nothing
    proves them ours."""
    if result.swept.get("files"):
        prep.say(f"swept {result.swept['files']} leftover file(s) ({result.swept['bytes'] / 1e6:.1f} MB) of crashed "
                 f"writes from {result.output}")
    if left := result.swept.get("left_alone"):
        prep.say(f"left alone in {result.output}: {result.swept.get('left_alone_count')} file(s) named "
                 f"like this project's but no marker of ours names their write ({', '.join(left[:5])}); nothing "
                 "proves them ours, so the sweep keeps them", warning=True)
