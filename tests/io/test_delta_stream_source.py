"""The jar-free Delta stream reader (``pipeline.io.delta.stream_source``): what each commit adds, what stops it, its
offsets and read limits on real delta-rs tables, and a real Structured Streaming query over it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from pipeline.errors import SourceError
from pipeline.io.delta.stream_source import DeltaStreamReader, commit_files, stream_options
from pipeline.io.stores import table_store


def _ids(start: int, n: int, **extra) -> pa.Table:
    return pa.table({"id": [f"i{k:03d}" for k in range(start, start + n)], "text": ["x"] * n,
                     **{k: [v] * n for k, v in extra.items()}})


def _reader(path, **options) -> DeltaStreamReader:
    store = table_store(str(path))
    table = store.table()
    settings = stream_options(store, arrow_schema=pa.schema(table.schema().to_arrow()),
                              schema_string=table.schema().to_json(), starting_version=options.get("starting_version"),
                              max_files=options.get("max_files"), max_bytes=options.get("max_bytes"),
                              own_limits=options.get("own_limits", False), resume_offset=options.get("resume_offset"),
                              until_version=options.get("until_version"))
    return DeltaStreamReader(settings)


def _read(reader: DeltaStreamReader, start: dict, end: dict) -> list[str]:
    return sorted(i for p in reader.partitions(start, end) for b in reader.read(p) for i in b.column("id").to_pylist())


def test_appends_are_read_once_per_commit_and_a_compaction_adds_nothing(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), _ids(0, 3))
    for start in (3, 6):
        write_deltalake(str(path), _ids(start, 3), mode="append")
    DeltaTable(str(path)).optimize.compact()  # version 3: the three files rewritten as one, dataChange false
    write_deltalake(str(path), _ids(9, 2), mode="append")
    store = table_store(str(path))
    schema = DeltaTable(str(path)).schema().to_json()
    assert [len(commit_files(store, v, schema_string=schema, path=str(path)).files) for v in range(5)] == [1, 1, 1, 0, 1]

    reader = _reader(path)
    first = reader.latestOffset(reader.initialOffset(), None)
    assert first == {"version": 4, "snapshot": False}
    assert _read(reader, reader.initialOffset(), first) == [f"i{k:03d}" for k in range(11)], "the table as it is"
    assert reader.latestOffset(first, None) == first, "nothing new: no micro-batch"
    since = _reader(path, starting_version=1)
    assert _read(since, since.initialOffset(), {"version": 4, "snapshot": False}) == \
        [f"i{k:03d}" for k in range(3, 11)], "from version 1: its rows and the appends after; not the compaction's"


def test_a_read_limit_ends_a_micro_batch_at_the_commit_that_reaches_it(tmp_path):
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

    path = tmp_path / "t"
    write_deltalake(str(path), _ids(0, 2))
    for start in range(2, 10, 2):
        write_deltalake(str(path), _ids(start, 2), mode="append")
    reader = _reader(path, starting_version=0, max_files=2)
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxFiles)
    offsets, start = [], reader.initialOffset()
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        offsets.append((_read(reader, start, end), end["version"]))
        reader.commit(end)
        start = end
    assert [v for _, v in offsets] == [1, 3, 4] and sum(len(ids) for ids, _ in offsets) == 10
    assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable()) == {"version": 4, "snapshot": False}


def test_rows_removed_or_a_changed_schema_stop_the_stream_naming_the_version(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), _ids(0, 3))
    store = table_store(str(path))
    schema = DeltaTable(str(path)).schema().to_json()
    DeltaTable(str(path)).delete("id = 'i001'")
    with pytest.raises(SourceError, match=r"version 1 of the stream's source .* removes or rewrites rows \(DELETE\)"):
        commit_files(store, 1, schema_string=schema, path=str(path))
    write_deltalake(str(path), _ids(3, 2, lang="en"), mode="append", schema_mode="merge")
    with pytest.raises(SourceError, match=r"changed at version 2: column lang added \(string\)"):
        commit_files(store, 2, schema_string=schema, path=str(path))
    (path / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(SourceError, match="log entry of version 0 .* is gone"):
        commit_files(store, 0, schema_string=schema, path=str(path))


def test_a_query_over_the_reader_reads_every_appended_row_once(spark, tmp_path):
    """Structured Streaming over ``read_stream`` on a jar-free session: two micro-batches (one commit each), then
    a restart from the checkpoint after another append reads only that append."""
    from pipeline.config import SourceConfig
    from pipeline.io.sources import has_delta_connector
    from pipeline.io.streams import read_stream

    assert not has_delta_connector(spark), "the jar-free reader: the connector's session streams format('delta')"
    path = tmp_path / "t"
    write_deltalake(str(path), _ids(0, 3))
    write_deltalake(str(path), _ids(3, 3), mode="append")
    source = SourceConfig(format="delta", path=str(path), id_column="id", where="id != 'i004'",
                          stream={"checkpoint_path": str(tmp_path / "chk"), "starting_version": 0,
                                  "max_files_per_trigger": 1})
    seen: list[tuple[int, list[str]]] = []

    def run() -> None:
        query = (read_stream(spark, source).writeStream
                 .foreachBatch(lambda df, batch: seen.append((batch, sorted(r.id for r in df.collect()))))
                 .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
        query.awaitTermination()

    run()
    assert seen == [(0, ["i000", "i001", "i002"]), (1, ["i003", "i005"])], "source.where applied"
    from pipeline.io.streams import checkpoint_offset

    assert checkpoint_offset(spark, str(tmp_path / "chk")) == {"version": 1, "snapshot": False}, "Spark's own log"
    write_deltalake(str(path), _ids(6, 2), mode="append")
    run()
    assert seen[2:] == [(2, ["i006", "i007"])]


def test_below_spark_4_2_the_reader_keeps_the_start_and_applies_the_limit_itself(tmp_path):
    """pyspark 4.0 and 4.1 ask ``latestOffset()`` with no start and no limit: with ``own_limits`` the reader reads
    on from the offset it handed out last (or the checkpoint's, ``resume_offset``), within its own limit, and
    stops at ``until_version``. Without the start kept, each call would read from the first version again."""
    path = tmp_path / "t"
    write_deltalake(str(path), _ids(0, 2))
    for start in range(2, 10, 2):
        write_deltalake(str(path), _ids(start, 2), mode="append")
    reader = _reader(path, starting_version=0, max_files=2, own_limits=True)
    ends, start = [], reader.initialOffset()
    while (end := reader.latestOffset()) != start and len(ends) < 6:  # the 4.0 runner's call; then start -> end
        ends.append((_read(reader, start, end), end["version"]))
        start = end
    assert [v for _, v in ends] == [1, 3, 4] and sum(len(ids) for ids, _ in ends) == 10

    resumed = _reader(path, starting_version=0, max_bytes=1, own_limits=True,
                      resume_offset={"version": 1, "snapshot": False}, until_version=3)
    assert [resumed.latestOffset()["version"] for _ in range(3)] == [2, 3, 3], "one commit each, up to until"
    unlimited = _reader(path, starting_version=0, max_files=2)  # no own limits: to the latest version, as before
    assert unlimited.latestOffset() == {"version": 4, "snapshot": False}


def test_the_checkpoints_last_offset_is_read_and_another_readers_refused(spark, tmp_path):
    import json

    from pipeline.io.streams import checkpoint_offset

    checkpoint = tmp_path / "chk"
    assert checkpoint_offset(spark, str(checkpoint)) is None, "no checkpoint yet: a new stream"
    (checkpoint / "offsets").mkdir(parents=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    for batch, version in ((0, 1), (1, 3), (2, 12)):  # as Spark 4.0 to 4.2 write them: v1, metadata, one per source
        (checkpoint / "offsets" / str(batch)).write_text(f"v1\n{meta}\n" + json.dumps({"version": version,
                                                                                     "snapshot": False}))
    (checkpoint / "offsets" / ".2.crc").write_bytes(b"x")
    assert checkpoint_offset(spark, str(checkpoint)) == {"version": 12, "snapshot": False}, "the last, by number"
    (checkpoint / "offsets" / "3").write_text(f"v1\n{meta}\n" + json.dumps({"sourceVersion": 1, "reservoirVersion": 4}))
    with pytest.raises(SourceError, match=r"holds another reader's offsets .* micro-batch 3\): it was written with "
                                          "the Delta connector"):
        checkpoint_offset(spark, str(checkpoint))
