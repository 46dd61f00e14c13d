"""DataFrame in, DataFrame out: ``score(df)`` and a SQL function, through ``run_job``'s worker code.

For a DataFrame already in hand (filtered, joined, streaming), with the caller's own write::

    from pipeline import score, register_function

    scored = score(docs, "embed", model="/Volumes/main/ml/models/all-MiniLM-L6-v2",
                   text_column="text", id_column="doc_id", batching={"batch_size": 64}, normalize=True)
    scored.write.format("delta").mode("append").save("/tmp/doc_scores")

    register_function(spark, "minilm_embed", "embed", model="/Volumes/main/ml/models/all-MiniLM-L6-v2")
    spark.sql("SELECT doc_id, minilm_embed(text).embedding FROM docs")

The rows are scored by the worker ``run_job`` uses (:func:`pipeline.spark.udf.score_partition`: one model
load per Python worker, length-sorted padded batches, a status per row, poison rows isolated,
out-of-memory splits) inside a column function (:mod:`pipeline.spark.column_udf`), so the same
settings give the same values: ids, statuses, embeddings, lineage.

What differs is who owns the run. ``score(df)`` returns a lazy DataFrame: nothing runs until the caller's
action, nothing is written by the library, and what is committed is what the caller's write commits
(Spark's semantics: a failed write may leave what its sink leaves; a rerun scores again). Rows whose
status ``run_job`` would quarantine stay in the result with their status. ``run_job`` reads the source
itself and owns the commit: row-keyed exactly-once appends, the quarantine table, resume of a killed
run, the runs table. docs/dataframe.md sets the two side by side.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from pipeline.dataframe.checks import (Scoring, check_columns, check_function_name, checked, input_columns,
                                       prepare_scoring)
from pipeline.errors import ConfigError
from pipeline.core.rows import MODEL_LINEAGE_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.udf import UserDefinedFunction

__all__ = ["register_function", "score"]


def score(df: "DataFrame", task: Any, *, model: Any = None, text_column: str | Sequence[str] | None = None,
          id_column: str | None = None, batching: Any = None, **settings: Any) -> "DataFrame":
    """``df`` with the task's output columns added, lazily: every input column and row, then the task's
    result and status columns (``n_tokens``, ``truncated``, ``status``, ``error``) and the lineage
    (``model_name``, ``model_revision``, ``task_fingerprint``).

    ``task``: a task kind (``"embed"``), a dict with ``kind``, or a :class:`~pipeline.config.TaskConfig`;
    ``model``: a folder, ``models:/<name>/<version>``, ``package:<module>``, or a dict / ModelConfig (none for
    a task on an endpoint: ``backend="endpoint", endpoint={...}``); ``batching``: the YAML's ``batching``
    section; any other keyword is a task setting. All are validated as the YAML is, with its messages
    (:class:`~pipeline.config.ConfigError` naming the key).

    ``text_column``: the column(s) the task reads, one per task input (``task.input_columns``: ``text`` for
    text tasks, the image column for image tasks, the template's fields for ``generate``); without it, the
    columns of those names. ``id_column``: the row id, optional; a row whose id is null gets status
    ``invalid_id`` and is not scored, as in ``run_job``.

    Before any Spark job: the settings, the columns named (present, of a type the task reads, and no output
    column already in ``df``) and the model (checked and fingerprinted as ``run_job`` does). Works on batch
    and streaming DataFrames, on classic and Spark Connect sessions. Each of ``df``'s partitions is scored
    as one task: repartition first when a source gives few or uneven ones. Filter before scoring: Spark
    keeps a filter written after ``score`` above the scoring (the function is nondeterministic, so that it
    runs once per row), so the rows it drops are scored first.
    """
    from pyspark.sql import functions as F

    from pipeline.spark.column_udf import plain_ddl

    config, kind, task_obj = prepare_scoring(task, model=model, batching=batching, settings=settings,
                                             id_column=id_column, caller="score()")
    columns = input_columns(task_obj, text_column)
    outputs = [*task_obj.output_schema().names, *MODEL_LINEAGE_COLUMNS]
    check_columns(df, task_obj, outputs, columns=columns, id_column=id_column)
    scoring = checked(config, kind, task_obj, df.sparkSession)
    inputs = [columns[name] for name in task_obj.input_columns]
    udf, arrow = _column_function(scoring, df.sparkSession, with_id=id_column is not None, df=df, inputs=inputs)
    args = [] if not id_column else [_col(id_column)] if arrow else [_col(id_column).isNull()]
    args += [_col(c) for c in inputs]
    kept = df.columns
    struct = _free_name(kept)
    # each added column cast to its own type spelled plainly: a Delta table written from a Connect session then
    # records `string`, not `string collate UTF8_BINARY` (plain_ddl); the values are unchanged
    added = [F.col(f"{struct}.{_quoted(f.name)}").cast(plain_ddl(f.dataType)).alias(f.name)
             for f in udf.returnType.fields]
    return df.select("*", udf(*args).alias(struct)).select(*[_col(c) for c in kept], *added)


def register_function(spark: "SparkSession", name: str, task: Any, *, model: Any = None, batching: Any = None,
                      **settings: Any) -> "UserDefinedFunction":
    """Register ``task`` as the SQL function ``name`` in ``spark`` and return it (usable from Python too).

    The function takes the task's input columns as arguments, in ``task.input_columns`` order
    (``minilm_embed(text)``; ``generate`` with ``template="{title}: {body}"``: ``f(title, body)``) and returns
    a struct: the task's result and status columns, then the lineage, batched and scored as :func:`score`
    does. The keywords are :func:`score`'s, less the column names. Checked before anything is registered:
    the settings and the model.
    """
    check_function_name(name)
    named = sorted(set(settings) & {"text_column", "id_column"})
    if named:
        raise ConfigError(f"register_function({name!r}): {named} are score()'s; the SQL function takes the "
                          f"columns it reads as its arguments, e.g. SELECT {name}(text) FROM docs")
    config, kind, task_obj = prepare_scoring(task, model=model, batching=batching, settings=settings,
                                             id_column=None, caller=f"register_function({name!r})")
    udf, _ = _column_function(checked(config, kind, task_obj, spark), spark, with_id=False)
    return spark.udf.register(name, udf)


def _column_function(scoring: Scoring, spark: "SparkSession", *, with_id: bool, df: "DataFrame | None" = None,
                     inputs: Sequence[str] = ()) -> "tuple[UserDefinedFunction, bool]":
    """The column function and whether it is the Arrow one (Spark 4.1 and later; else a pandas UDF over the same
    worker, given the Arrow types of ``df``'s ``inputs``: the SQL function's come with each call). A task that
    sends rows to a server gets its share of the request rates."""
    from pipeline.core.compat import ARROW_UDF_SINCE, arrow_column_function, session_spark
    from pipeline.endpoint.attempt import journals_requests
    from pipeline.spark.column_udf import inference_udf

    share = 1.0
    if journals_requests(scoring.task):
        from pipeline.spark.planning import count_cores

        share = 1.0 / max(1, count_cores(spark))
    plan = scoring.column_plan(with_id=with_id, rate_share=share)
    version = session_spark(spark)
    if arrow_column_function(version):
        return inference_udf(plan), True
    types: tuple = tuple(None for _ in scoring.task.input_columns)
    if df is not None:
        from pipeline.arrow_types import to_arrow_schema
        from pipeline.spark.pandas_edges import check_pandas_inputs

        fields = {f.name: f for f in df.schema.fields}
        check_pandas_inputs({c: fields[c].dataType.typeName() for c in inputs}, spark_version=version,
                            needs="{}.{}".format(*ARROW_UDF_SINCE))
        from pyspark.sql.types import StructType

        types = tuple(to_arrow_schema(StructType([fields[c]])).field(0).type for c in inputs)
    return inference_udf(replace(plan, pandas_types=types)), False


def _col(name: str) -> "Column":
    """The column named ``name`` exactly (dots and backticks in it quoted)."""
    from pyspark.sql import functions as F

    return F.col(_quoted(name))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _free_name(taken: Sequence[str]) -> str:
    """A name for the struct the function returns that no column of the DataFrame has."""
    name = "_sbi_scored"
    while name in taken:
        name += "_"
    return name
