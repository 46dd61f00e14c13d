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
                              max_files=options.get("max_files"), max_bytes=None)
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
    write_deltalake(str(path), _ids(6, 2), mode="append")
    run()
    assert seen[2:] == [(2, ["i006", "i007"])]
