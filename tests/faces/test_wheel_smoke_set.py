"""The wheel's smoke set covers the public surface, and the docs' matrix is what its runs wrote.

``make test-wheel`` runs tests/wheel in a fresh venv per Spark line and Python; its tests name the entry points
and notebooks they run with markers (``@pytest.mark.entry``, ``@pytest.mark.notebook``). Here, read from their
source: every name in ``pipeline.__all__``, the ``sbi`` command and every shipped notebook is run there. The
matrix blocks of README.md and docs/install.md are the ones ``.ci/wheel_matrix.py`` renders from the committed
results (docs/wheel_matrix.json). And a smoke set that did not run against an installed wheel fails the script
instead of passing as skipped.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import pipeline

REPO = Path(__file__).resolve().parents[2]
WHEEL_TESTS = sorted((REPO / "tests" / "wheel").glob("test_*.py"))


def _matrix_module():
    spec = importlib.util.spec_from_file_location("wheel_matrix", REPO / ".ci" / "wheel_matrix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _marked(kind: str) -> dict[str, list[str]]:
    """``{name: [test functions]}`` for every ``pytest.mark.<kind>("name", ...)`` on a smoke-set test."""
    found: dict[str, list[str]] = {}
    for path in WHEEL_TESTS:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            for decorator in node.decorator_list:
                if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr == kind and ast.unparse(decorator.func.value) == "pytest.mark"):
                    for arg in decorator.args:
                        assert isinstance(arg, ast.Constant), f"{path.name}::{node.name}: name the {kind} plainly"
                        found.setdefault(arg.value, []).append(f"{path.name}::{node.name}")
    return found


def _entry_points() -> set[str]:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {*pipeline.__all__, *scripts}


def test_every_public_entry_point_runs_in_the_smoke_set():
    marked = _marked("entry")
    missing = sorted(_entry_points() - set(marked))
    assert not missing, f"public entry points the wheel's smoke set never runs: {missing} (pipeline.__all__ and " \
                        "[project.scripts]); add a test to tests/wheel marked @pytest.mark.entry(name)"
    unknown = sorted(set(marked) - _entry_points())
    assert not unknown, f"smoke tests marked with names that are no public entry point: {unknown}"


def test_every_shipped_notebook_runs_in_the_smoke_set():
    notebooks = {p.stem for p in (REPO / "notebooks").glob("*.py")}
    marked = _marked("notebook")
    assert notebooks, "no notebooks found"
    missing = sorted(notebooks - set(marked))
    assert not missing, f"shipped notebooks the wheel's smoke set never runs: {missing}; add a test to " \
                        "tests/wheel/test_notebooks.py marked @pytest.mark.notebook(name)"
    assert not sorted(set(marked) - notebooks), "a notebook test names no shipped notebook"


def test_the_docs_matrix_is_rendered_from_the_committed_results():
    matrix = _matrix_module()
    assert matrix.check_or_write(write=False) == [], "run .ci/wheel_matrix.py render --write"
    runs = json.loads((REPO / "docs" / "wheel_matrix.json").read_text())["runs"]
    for key, run in runs.items():
        assert set(run["entry_points"]) <= _entry_points() and set(run["notebooks"]) <= set(_marked("notebook")), key


def test_the_matrix_says_what_each_run_passed(tmp_path, monkeypatch):
    """Rendered from results files as the smoke set writes them: a run that passed all, one with a failure, and
    a supported line no run covered."""
    matrix = _matrix_module()
    monkeypatch.setattr(matrix, "MATRIX", tmp_path / "wheel_matrix.json")
    results = []
    for pyspark, python, outcome in (("4.0.1", "3.12.1", "passed"), ("4.3.0", "3.11.7", "failed")):
        path = tmp_path / f"{pyspark}-{python}.json"
        path.write_text(json.dumps({
            "pyspark": pyspark, "spark_line": pyspark[:3], "python": python, "python_line": python[:4],
            "delta_connector": pyspark.startswith("4.0"), "complete": outcome == "passed",
            "tests": {"passed": 3, "failed": int(outcome != "passed"), "skipped": 0, "not run": 0},
            "entry_points": {"run_job": "passed", "score": outcome}, "notebooks": {"preview_scores": "passed"}}))
        results.append(path)
    assert matrix.complete(results[0]) and not matrix.complete(results[1])
    blocks = matrix.render(matrix.merge(results, today="2026-12-06"))
    readme = blocks["readme"].splitlines()
    assert ("| 4.0 (Databricks 17.3 LTS) | 3.12 | connector and jar-free | all 2 entry points and 1 notebook passed "
            "(pyspark 4.0.1, 2026-12-06) |") in readme
    assert "| 4.3 | 3.11 | jar-free (no Delta connector release for 4.3 yet) | failed: `score` (pyspark 4.3.0, " \
           "2026-12-06) |" in readme
    assert "| 4.1 | | connector and jar-free | not run |" in readme
    assert "| 4.0 (Databricks 17.3 LTS) | 3.12 | 4.0.1 | connector and jar-free | `run_job`, `score` | " \
           "`preview_scores` | 2026-12-06 |" in blocks["install"].splitlines()


@pytest.mark.parametrize("expect", ["4.2.0", ""])
def test_a_smoke_set_run_from_a_checkout_fails_the_script_instead_of_passing_skipped(tmp_path, expect):
    """As the script runs it (a copy of tests/wheel outside the checkout), but importing this checkout's
    ``pipeline``: with ``$SBI_EXPECT_PYSPARK`` (the script's runs) an error before any test; without, all
    skipped, and a results file the script's completeness check refuses."""
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests" / "__init__.py", tmp_path / "tests")
    for folder in ("support", "wheel"):
        shutil.copytree(REPO / "tests" / folder, tmp_path / "tests" / folder)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SBI_EXPECT_PYSPARK": expect,
           "SBI_WHEEL_RESULTS": str(tmp_path / "results")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "tests/wheel"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    if expect:
        assert done.returncode != 0 and "imported pipeline from" in done.stdout + done.stderr, done.stdout
        assert not (tmp_path / "results").exists()
    else:
        assert done.returncode == 0 and " skipped" in done.stdout and " passed" not in done.stdout, done.stdout
        (result,) = (tmp_path / "results").glob("*.json")
        assert not _matrix_module().complete(result), "an all-skipped set is not a passed line"
