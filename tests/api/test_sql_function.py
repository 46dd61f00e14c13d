"""``register_function``: a task as a SQL function returning a struct, batched and scored as ``run_job`` does."""

from __future__ import annotations

import pytest

from pipeline import register_function
from pipeline.config import ConfigError
from pipeline.errors import ModelError
from pipeline.core.rows import MODEL_LINEAGE_COLUMNS, STATUS_FIELDS
from tests.support.scoring import EMBED, SCORE_SETTINGS, assert_same_as_run_job


def test_the_sql_function_gives_run_jobs_rows(embed_reference, any_spark, tiny_embed_model):
    parquet, reference = embed_reference
    any_spark.read.parquet(str(parquet)).createOrReplaceTempView("api_docs")
    settings = {k: v for k, v in EMBED.items() if k != "task"}
    udf = register_function(any_spark, "tiny_embed", "embed", model={"path": str(tiny_embed_model), "name": "tiny-bert"},
                            **SCORE_SETTINGS, **settings)

    struct = any_spark.sql("SELECT tiny_embed(text) AS r FROM api_docs").schema["r"].dataType
    assert struct.fieldNames() == ["embedding", "label", "score", "scores", *(f.name for f in STATUS_FIELDS),
                                   *MODEL_LINEAGE_COLUMNS]
    rows = any_spark.sql("SELECT doc_id, source, r.* FROM (SELECT doc_id, source, tiny_embed(text) AS r "
                         "FROM api_docs) WHERE r.status IS NOT NULL").collect()
    # the same values as run_job; the function has no id, so the row run_job quarantines for its null id is scored
    assert assert_same_as_run_job(rows, reference, skip_null_id=True) == 39
    assert [r["status"] for r in rows if r["doc_id"] is None] == ["ok"]

    # one field straight from the call, as a SQL user writes it; and the same function from Python
    short = any_spark.sql("SELECT doc_id, tiny_embed(text).embedding AS e FROM api_docs WHERE doc_id = 'd00000'")
    (row,) = short.collect()
    assert list(row["e"]) == pytest.approx(reference["d00000"]["embedding"], abs=1e-6)
    from pyspark.sql import functions as F

    (again,) = (any_spark.read.parquet(str(parquet)).where("doc_id = 'd00000'")
                .select(udf(F.col("text")).alias("r")).collect())
    assert again["r"]["status"] == "ok" and again["r"]["task_fingerprint"] == reference["d00000"]["task_fingerprint"]


@pytest.mark.parametrize("name, kwargs, error, message", [
    ("bad-name", {}, ConfigError, "function name 'bad-name' is not a SQL identifier"),
    ("f_cols", {"text_column": "body"}, ConfigError, r"\['text_column'\] are score\(\)'s; the SQL function takes"),
    ("f_key", {"pooling": "max"}, ConfigError, r"invalid config register_function\('f_key'\):\n  task.pooling"),
    ("f_model", {"model": "/no/such/model"}, ModelError, "/no/such/model"),
])
def test_a_function_is_registered_only_when_its_settings_and_model_hold(spark, tiny_embed_model, name, kwargs,
                                                                         error, message):
    kwargs = {"model": str(tiny_embed_model), **kwargs}
    before = _user_functions(spark)
    with pytest.raises(error, match=message):
        register_function(spark, name, "embed", **kwargs)
    assert _user_functions(spark) == before, f"{name!r} was registered"


def _user_functions(spark) -> set[str]:
    """The session's own functions (temporary and persistent), by name as Spark lists them."""
    return {row[0] for row in spark.sql("SHOW USER FUNCTIONS").collect()}
