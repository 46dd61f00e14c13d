"""Spark readers of the file formats a source may be, each keeping what a plain read would lose:
JSON lines (a line that does not parse keeps its raw text), binary files (0-byte files come back as
rows) and text files (one row per line, ids stable per file, multi-GB files read in parallel).

:func:`pipeline.io.sources.read_source` dispatches to these by ``source.format``; Parquet and Delta are
read there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["CORRUPT_RECORD_COLUMN", "read_binary_files", "read_json", "read_text"]

# Spark's corrupt-record column: the raw text of a JSON line it could not parse (null on good lines).
CORRUPT_RECORD_COLUMN = "_corrupt_record"
# The same raw text, as select_input carries it to the task (which flags the row `malformed`).


def read_json(spark: "SparkSession", path: str) -> "DataFrame":
    """JSON lines, with every line Spark cannot parse kept in ``_corrupt_record`` (its raw text).

    Read in ``PERMISSIVE`` mode with the corrupt-record column always in the
    schema (inference adds it only when it meets a bad line): a truncated or
    non-JSON line becomes a row whose fields are all null and whose
    ``_corrupt_record`` holds the line, never a silent null-id row.
    :func:`~pipeline.io.sources.select_input` carries it on as ``_malformed``. Blank lines are no
    rows at all (Spark skips them). Spark refuses a query that references only
    this column over raw JSON: always select it with other columns.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    def reader():
        return spark.read.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_RECORD_COLUMN)

    schema = reader().json(path).schema
    if CORRUPT_RECORD_COLUMN not in schema.fieldNames():
        schema = StructType([*schema.fields, StructField(CORRUPT_RECORD_COLUMN, StringType(), True)])
    return reader().schema(schema).json(path)


def read_binary_files(spark: "SparkSession", path: str) -> "DataFrame":
    """Files as rows ``path``, ``modificationTime``, ``length``, ``content`` (Spark's ``binaryFile`` format).

    ``path`` is a folder (read recursively) or a glob such as ``/data/scans/*.png``.
    The executors read the bytes; nothing about the files is collected to the driver.

    Spark's file sources silently skip 0-byte files, which would lose them; the
    file listing Spark already holds on the driver (``inputFiles``: names only)
    is anti-joined with the rows read, and each missing file comes back as a row
    with empty ``content`` (``length`` 0, ``modificationTime`` null), so the task
    can flag it instead of it vanishing.
    """
    from pyspark.sql import functions as F

    reader = spark.read.format("binaryFile")
    if not any(c in path for c in "*?[{"):
        reader = reader.option("recursiveFileLookup", "true")
    df = reader.load(path)
    # inputFiles() gives URIs (file:///a%20b); the path column has Hadoop's decoded form (file:/a b)
    listed = [(_hadoop_path(f),) for f in df.inputFiles()]
    if not listed:
        return df
    empty = (
        spark.createDataFrame(listed, "path string")
        .join(df.select("path"), on="path", how="left_anti")
        .select("path", F.lit(None).cast("timestamp").alias("modificationTime"),
                F.lit(0).cast("long").alias("length"), F.lit("").cast("binary").alias("content"))
    )
    return df.unionByName(empty)


def _hadoop_path(uri: str) -> str:
    """A file URI as Hadoop's ``Path.toString`` writes it (what binaryFile's ``path`` column holds).

    >>> _hadoop_path("file:///data/a%20b.png"), _hadoop_path("s3a://bucket/x%23y.jpg")
    ('file:/data/a b.png', 's3a://bucket/x#y.jpg')
    """
    from urllib.parse import unquote

    text = unquote(uri)
    return "file:/" + text[len("file:///"):] if text.startswith("file:///") else text


def read_text(spark: "SparkSession", path: str) -> "DataFrame":
    """Plain text files: one row per line; ``id`` = ``<file URI>:<line number in that file>``, from 1.

    For example ``file:/data/logs/BGL_2k.log:17``. An id depends only on its
    own file, so adding or removing other files renumbers nothing. DataFrame API
    only (no RDD: it runs on Spark Connect too) and Spark's own line reader, so
    a multi-GB file is split into blocks and read in parallel, never held in one
    row. Each line's number is its position in its block (the scan keeps file
    order within a block; ``monotonically_increasing_id`` counts it) plus the
    lines of the file's earlier blocks, from a small per-block count that is
    broadcast back: the text is scanned twice, which is cheap next to inference.
    Invalid UTF-8 becomes U+FFFD.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    lines = spark.read.text(path).select(
        F.col("_metadata.file_path").alias("_file"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_pos"),
        F.make_valid_utf8("value").alias("text"),
    )
    earlier = Window.partitionBy("_file").orderBy("_block").rowsBetween(Window.unboundedPreceding, -1)
    blocks = (
        lines.groupBy("_file", "_block")
        .agg(F.min("_pos").alias("_first"), F.count(F.lit(1)).alias("_n"))
        .select("_file", "_block", "_first", F.coalesce(F.sum("_n").over(earlier), F.lit(0)).alias("_before"))
    )
    line_no = F.col("_pos") - F.col("_first") + F.col("_before") + 1
    return lines.join(F.broadcast(blocks), on=["_file", "_block"]).select(
        F.concat(F.col("_file"), F.lit(":"), line_no.cast("string")).alias("id"), "text"
    )
