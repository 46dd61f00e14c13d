"""``score(df)`` and the SQL function on Spark 4.0's column function: a pandas UDF over the same worker.

Spark 4.0 has no Arrow column function (``arrow_udf`` came in 4.1), so there the worker runs inside an iterator
pandas UDF whose edges convert pandas to Arrow and back (:mod:`pipeline.spark.pandas_edges`). Here, on the suite's
newer pyspark, ``$SBI_COLUMN_FUNCTION=pandas`` takes that path, and every task kind, the SQL function and a
streaming DataFrame give the Arrow path's rows, statuses and values; ``make test-wheel`` runs the same calls on a
real pyspark 4.0 (tests/wheel).
"""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline import register_function, score
from pipeline.core.compat import COLUMN_FUNCTION_ENV
from pipeline.errors import SourceError
from tests.api.test_score_kinds import CASES, models  # noqa: F401 - the kinds' rows and models, and their fixture
from tests.support.scoring import EMBED, SCORE_SETTINGS, assert_same_value, documents

# what differs between two runs of the same rows whatever the path: the time a generation took
UNTIMED = {"latency_ms"}


def _scored(make: Any, monkeypatch: pytest.MonkeyPatch, path: str) -> Any:
    """``make()`` (a lazy DataFrame built by score or the SQL function) collected on the column function ``path``."""
    if path == "pandas":
        monkeypatch.setenv(COLUMN_FUNCTION_ENV, "pandas")
    else:
        monkeypatch.delenv(COLUMN_FUNCTION_ENV, raising=False)
    return [r.asDict(recursive=True) for r in make().collect()]


def _assert_same_rows(pandas_rows: list[dict], arrow_rows: list[dict], key: str) -> int:
    assert [r[key] for r in pandas_rows] == [r[key] for r in arrow_rows], "the same rows, in the same order"
    for ours, theirs in zip(pandas_rows, arrow_rows):
        assert ours.keys() == theirs.keys()
        for column in sorted(set(ours) - UNTIMED):
            assert_same_value(ours[column], theirs[column], f"{ours[key]}.{column}")
    return len(pandas_rows)


@pytest.mark.parametrize("kind", sorted(set(CASES) - {"classify"}))  # classify's map: the documents' test below
def test_each_kind_gives_the_arrow_paths_rows_on_the_pandas_path(spark, kind, models, tiny_embed_model,  # noqa: F811
                                                                  tiny_classify_model, monkeypatch):
    make_rows, model, settings, _, _ = CASES[kind]
    df = make_rows(spark)
    folder = model(models, tiny_embed_model, tiny_classify_model)

    def make() -> Any:
        return score(df, kind, model=folder, id_column="rid", **settings)

    arrow = _scored(make, monkeypatch, "arrow")
    assert _assert_same_rows(_scored(make, monkeypatch, "pandas"), arrow, "rid") == df.count()


def test_null_ids_strings_and_values_on_both_sessions(any_spark, tmp_path, tiny_embed_model, monkeypatch):
    """The suite's documents (a null id, a null and a blank text) over three partitions, classic and Connect."""
    docs = any_spark.read.parquet(str(documents(tmp_path))).repartition(3)
    settings = {**EMBED, **SCORE_SETTINGS}

    def make() -> Any:
        return score(docs, settings["task"], model=str(tiny_embed_model), id_column="doc_id", labels=EMBED["labels"],
                     batching=SCORE_SETTINGS["batching"])

    arrow = _scored(make, monkeypatch, "arrow")
    pandas = _scored(make, monkeypatch, "pandas")
    assert _assert_same_rows(pandas, arrow, "doc_id") == 40
    statuses = sorted(r["status"] for r in pandas)
    assert statuses == sorted(["ok"] * 37 + ["skipped_null", "skipped_empty", "invalid_id"])


def test_the_sql_function_on_the_pandas_path(any_spark, tmp_path, tiny_embed_model, monkeypatch):
    any_spark.read.parquet(str(documents(tmp_path))).createOrReplaceTempView("pandas_docs")
    query = "SELECT doc_id, r.* FROM (SELECT doc_id, {name}(text) AS r FROM pandas_docs) ORDER BY doc_id"

    def make(name: str) -> Any:
        register_function(any_spark, name, "embed", model=str(tiny_embed_model), **SCORE_SETTINGS)
        return any_spark.sql(query.format(name=name))

    arrow = _scored(lambda: make("arrow_embed"), monkeypatch, "arrow")
    pandas = _scored(lambda: make("pandas_embed"), monkeypatch, "pandas")
    assert _assert_same_rows(pandas, arrow, "doc_id") == 40
    assert [r["status"] for r in pandas if r["doc_id"] is None] == ["ok"], "no id in a SQL call: scored"


def test_a_streaming_dataframe_on_the_pandas_path(spark, tmp_path, tiny_embed_model, monkeypatch):
    parquet = documents(tmp_path)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    table = pq.read_table(parquet)
    for n, start in enumerate(range(0, table.num_rows, 15)):
        pq.write_table(table.slice(start, 15), incoming / f"part-{n}.parquet")
    schema = spark.read.parquet(str(parquet)).schema

    def scored_stream(path: str) -> list[dict]:
        if path == "pandas":
            monkeypatch.setenv(COLUMN_FUNCTION_ENV, "pandas")
        stream = spark.readStream.schema(schema).parquet(str(incoming))
        scored = score(stream, "embed", model=str(tiny_embed_model), id_column="doc_id", **SCORE_SETTINGS)
        out = tmp_path / f"out_{path}"
        (scored.writeStream.format("parquet").option("checkpointLocation", str(tmp_path / f"ck_{path}"))
         .trigger(availableNow=True).start(str(out)).awaitTermination())
        return sorted(pq.read_table(out).to_pylist(), key=lambda r: str(r["doc_id"]))

    arrow = scored_stream("arrow")
    assert _assert_same_rows(scored_stream("pandas"), arrow, "doc_id") == 40


def test_the_path_follows_the_spark_line_and_the_setting(spark, tiny_embed_model, monkeypatch):
    from pyspark.sql.functions import PandasUDFType

    from pipeline.dataframe.checks import checked, prepare_scoring
    from pipeline.core.compat import arrow_column_function
    from pipeline.dataframe import _column_function

    config, kind, task = prepare_scoring("embed", model=str(tiny_embed_model), batching=None, settings={},
                                         id_column=None, caller="test")
    scoring = checked(config, kind, task, spark)
    monkeypatch.delenv(COLUMN_FUNCTION_ENV, raising=False)
    udf, arrow = _column_function(scoring, spark, with_id=False)
    assert arrow and udf.evalType != PandasUDFType.SCALAR_ITER, "Spark 4.1 and later: the Arrow UDF"
    assert not arrow_column_function("4.0.1") and arrow_column_function("4.1.0")
    monkeypatch.setenv(COLUMN_FUNCTION_ENV, "pandas")
    udf, arrow = _column_function(scoring, spark, with_id=False)
    assert not arrow and udf.evalType == PandasUDFType.SCALAR_ITER


def test_a_column_pandas_cannot_carry_exactly_is_refused_before_any_work(spark, models, monkeypatch):  # noqa: F811
    monkeypatch.setenv(COLUMN_FUNCTION_ENV, "pandas")
    df = spark.createDataFrame([("r0", "a film", 3)], "rid string, review string, stars long")
    with pytest.raises(SourceError, match=r"passes the columns it reads through pandas .* not column 'stars' of type "
                                          r"long .* cast it to string first, e.g. F.col\('stars'\).cast\('string'\)"):
        score(df, "generate", model=str(models["llm"]), id_column="rid", template="{review} ({stars} stars)",
              backend="transformers", max_new_tokens=4)
    monkeypatch.delenv(COLUMN_FUNCTION_ENV)
    assert "completion" in score(df, "generate", model=str(models["llm"]), id_column="rid",
                                 template="{review} ({stars} stars)", backend="transformers", max_new_tokens=4).columns
