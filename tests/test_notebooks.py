from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))


def test_there_is_a_notebook_per_job():
    jobs = {p.stem for p in (REPO / "jobs").glob("*.py") if not p.stem.startswith("prepare_")
            and not p.stem.startswith("train_")}
    assert jobs and jobs <= {p.stem for p in NOTEBOOKS}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_databricks_source_and_calls_the_library(path):
    text = path.read_text()
    assert text.startswith("# Databricks notebook source\n")
    cells = text.split("# COMMAND ----------")
    assert len(cells) >= 3
    assert "dbutils.widgets" in cells[1], "widgets are declared in the first code cell"
    ast.parse(text)  # valid Python
    last = cells[-1]
    assert "from pipeline" in last and "(" in last, "the last cell calls one library function"
    assert "sys.path" not in text, "notebooks import the installed package"
