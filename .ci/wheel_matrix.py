#!/usr/bin/env python3
"""The docs' Spark/Python matrix, from what the wheel's smoke set ran (standard library only).

``make test-wheel`` (.ci/test_wheel.sh) runs tests/wheel in a fresh venv per Spark line and Python; each run writes
a results file (its pyspark and Python, and each public entry point's and notebook's outcome: tests/wheel/conftest.py).

    wheel_matrix.py complete RESULT.json     exit 1 unless that run passed whole (no failure, skip or test not run)
    wheel_matrix.py merge RESULT.json ...    record those runs in docs/wheel_matrix.json (one entry per Spark line
                                             and Python; a later run of the same pair replaces it)
    wheel_matrix.py render [--write]         the README's and the install page's matrix blocks from
                                             docs/wheel_matrix.json; --write puts them in place, else exit 1 when
                                             a committed block differs (tests/faces/test_wheel_matrix.py too)
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "docs" / "wheel_matrix.json"
MARK = "<!-- matrix -->"
PAGES = {"README.md": "readme", "docs/install.md": "install"}
DATABRICKS = {"4.0": "Databricks 17.3 LTS"}


def _compat() -> tuple[list[str], set[str]]:
    """The supported Spark lines and those with a Delta connector release, read from pipeline/core/compat.py."""
    text = (REPO / "pipeline" / "core" / "compat.py").read_text()
    major, first, last_major, last = map(int, re.search(
        r"SUPPORTED_SPARK = \(\((\d+), (\d+)\), \((\d+), (\d+)\)\)", text).groups())
    assert major == last_major, "the supported range spans one major line"
    lines = [f"{major}.{minor}" for minor in range(first, last + 1)]
    connector = {f"{a}.{b}" for a, b in re.findall(r"\((\d+), (\d+)\)", re.search(
        r"DELTA_CONNECTOR_LINES = frozenset\(\{(.*?)\}\)", text).group(1))}
    return lines, connector


def complete(path: Path) -> bool:
    if not path.is_file():
        print(f"no results file {path}: the smoke set did not finish", file=sys.stderr)
        return False
    result = json.loads(path.read_text())
    tests = result["tests"]
    missing = [k for group in ("entry_points", "notebooks") for k, v in result[group].items() if v != "passed"]
    if result["complete"] and not missing and tests["skipped"] == tests["failed"] == tests["not run"] == 0:
        print(f"[test-wheel]   {tests['passed']} passed: {len(result['entry_points'])} entry points, "
              f"{len(result['notebooks'])} notebooks")
        return True
    print(f"the smoke set did not pass whole: {tests}; not passed: {missing}", file=sys.stderr)
    return False


def merge(paths: list[Path], today: str | None = None) -> dict:
    matrix = json.loads(MATRIX.read_text()) if MATRIX.is_file() else {"runs": {}}
    for path in paths:
        result = json.loads(path.read_text())
        key = f"{result['spark_line']} py{result['python_line']}"
        matrix["runs"][key] = {
            "spark": result["spark_line"], "python": result["python_line"], "pyspark": result["pyspark"],
            "python_version": result["python"], "delta_connector": result["delta_connector"],
            "complete": result["complete"], "date": today or dt.date.today().isoformat(),
            "entry_points": {k: v for k, v in sorted(result["entry_points"].items())},
            "notebooks": {k: v for k, v in sorted(result["notebooks"].items())},
        }
    matrix["runs"] = dict(sorted(matrix["runs"].items()))
    MATRIX.write_text(json.dumps(matrix, indent=2) + "\n")
    return matrix


def _line_key(line: str) -> tuple[int, ...]:
    return tuple(int(p) for p in line.split("."))


def _writers(line: str, connector: set[str]) -> str:
    return ("connector and jar-free" if line in connector
            else f"jar-free (no Delta connector release for {line} yet)")


def _passed(run: dict, group: str) -> list[str]:
    return [k for k, v in run[group].items() if v == "passed"]


def _summary(run: dict) -> str:
    failed = [k for group in ("entry_points", "notebooks") for k, v in run[group].items() if v != "passed"]
    if failed:
        return f"failed: {', '.join(f'`{k}`' for k in failed)} (pyspark {run['pyspark']}, {run['date']})"
    entries, books = len(run["entry_points"]), len(run["notebooks"])
    return (f"all {entries} entry point{'s' * (entries != 1)} and {books} notebook{'s' * (books != 1)} passed "
            f"(pyspark {run['pyspark']}, {run['date']})")


def render(matrix: dict) -> dict[str, str]:
    """``{"readme": block, "install": block}``, each between the two markers (markers included)."""
    lines, connector = _compat()
    runs = matrix["runs"]
    readme = ["| Spark | Python | Delta writers | the built wheel's smoke set (`make test-wheel`) |",
              "|---|---|---|---|"]
    install = ["| Spark | Python | pyspark | Delta writers | entry points passed | notebooks passed | run |",
               "|---|---|---|---|---|---|---|"]
    for line in sorted(lines, key=_line_key, reverse=True):
        label = f"{line} ({DATABRICKS[line]})" if line in DATABRICKS else line
        mine = sorted((r for r in runs.values() if r["spark"] == line), key=lambda r: _line_key(r["python"]),
                      reverse=True)
        if not mine:
            readme.append(f"| {label} | | {_writers(line, connector)} | not run |")
            install.append(f"| {label} | | | {_writers(line, connector)} | not run | | |")
        for run in mine:
            readme.append(f"| {label} | {run['python']} | {_writers(line, connector)} | {_summary(run)} |")
            install.append(f"| {label} | {run['python']} | {run['pyspark']} | {_writers(line, connector)} | "
                           f"{', '.join(f'`{k}`' for k in _passed(run, 'entry_points')) or 'none'} | "
                           f"{', '.join(f'`{k}`' for k in _passed(run, 'notebooks')) or 'none'} | {run['date']} |")
    readme.append("| 3.5 and older | | | refused when a job starts |")
    install.append("| 3.5 and older | | | | refused when a job starts (Databricks 15.4/16.4 LTS, EMR 7) | | |")
    return {"readme": "\n".join([MARK, *readme, MARK]), "install": "\n".join([MARK, *install, MARK])}


def _replace(text: str, block: str, page: str) -> str:
    if text.count(MARK) != 2:
        raise SystemExit(f"{page} must hold the matrix between two {MARK} lines")
    return re.sub(re.escape(MARK) + r".*?" + re.escape(MARK), lambda _: block, text, count=1, flags=re.S)


def check_or_write(write: bool) -> list[str]:
    """The pages whose committed block differs from the rendered one (rewritten with ``write``)."""
    blocks = render(json.loads(MATRIX.read_text()))
    stale = []
    for page, key in PAGES.items():
        path = REPO / page
        text = path.read_text()
        new = _replace(text, blocks[key], page)
        if new != text:
            stale.append(page)
            if write:
                path.write_text(new)
    return stale


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "complete" and len(args) == 1:
        return 0 if complete(Path(args[0])) else 1
    if command == "merge" and args:
        merge([Path(a) for a in args])
        return 0
    if command == "render" and args in ([], ["--write"]):
        stale = check_or_write(write=bool(args))
        if stale and not args:
            print(f"the matrix in {', '.join(stale)} is not the one docs/wheel_matrix.json renders: run "
                  ".ci/wheel_matrix.py render --write", file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
