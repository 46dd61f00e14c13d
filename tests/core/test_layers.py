"""The layers hold: every import in pipeline/ goes down, imports inside functions included, and no circle.

import-linter (``make lint``, the contracts in pyproject.toml) checks the
floors too; this test reads every module with ``ast`` itself, so an import
tucked into a function or under ``if TYPE_CHECKING`` is seen whatever the
linter's settings, and it also refuses a circle between modules of one floor,
which a layers contract allows. The floors, ground up, are those of
docs/architecture.md.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# make lint runs this file; make test and make test-drills leave it to lint (-m "not lint")
pytestmark = pytest.mark.lint

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"

# ground floor first; a module's floor is that of its longest matching prefix (a prefix covers itself and
# the modules below it: "pipeline.io" covers pipeline.io.delta.sink)
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # the ground floor is a package; the error classes, public, stay at the top beside it
    ("core", ("pipeline.core", "pipeline.errors")),
    ("config", ("pipeline.config",)),
    ("registry", ("pipeline.registry",)),
    # engines and platform share a floor: each may use the other, never in a circle (checked below)
    ("engines and platform", ("pipeline.models", "pipeline.generation", "pipeline.endpoint", "pipeline.images",
                              "pipeline.recs", "pipeline.spark", "pipeline.io", "pipeline.journal",
                              "pipeline.arrow_types")),
    ("tasks", ("pipeline.tasks",)),
    ("run stages", ("pipeline.stages", "pipeline.records", "pipeline.report")),
    ("run", ("pipeline.runner",)),
    ("faces", ("pipeline.__main__", "pipeline.cli", "pipeline.notebook", "pipeline.docs", "pipeline.demo",
               "pipeline.dataframe")),
]
# the package's own __init__ is on the top floor by itself: as a prefix, "pipeline" would cover every module,
# and a module added to no floor would sit, unnoticed, where no import of it can run up a floor
ROOT = ("pipeline", len(LAYERS) - 1)


# the modules at pipeline/'s top level: the faces and the public modules (docs/architecture.md); every floor's
# machinery is a package (arrow_types: the platform's, used by both spark/ and io/, see its docstring)
TOP_LEVEL = {"__init__", "__main__", "cli", "notebook", "docs", "errors", "registry", "runner", "arrow_types"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, source: str, known: set[str], *, is_package: bool = False) -> set[str]:
    """The pipeline modules ``source`` (module ``name``) imports anywhere in it, functions included."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pipeline.io import stores` imports the module pipeline.io.stores
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name and target.startswith("pipeline"):
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path.read_text(), known, is_package=path.name == "__init__.py")
            for name, path in found.items()}


def floor_of(name: str) -> int | None:
    """The floor (index into :data:`LAYERS`) of module ``name``; None when no floor lists it."""
    if name == ROOT[0]:
        return ROOT[1]
    best = (-1, -1)
    for level, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if name == prefix or name.startswith(prefix + "."):
                best = max(best, (len(prefix), level))
    return best[1] if best[1] >= 0 else None


def floor(name: str) -> int:
    level = floor_of(name)
    assert level is not None, f"{name} is on no floor: add it to LAYERS (and docs/architecture.md)"
    return level


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} ({LAYERS[floor(src)][0]}) imports {dst} ({LAYERS[floor(dst)][0]})"
                  for src, targets in graph.items() for dst in targets if floor(dst) > floor(src))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_on_a_floor():
    unplaced = [name for name in modules() if floor_of(name) is None]
    assert unplaced == [], f"on no floor: add them to LAYERS (and docs/architecture.md): {unplaced}"


def test_the_top_level_holds_only_the_faces_and_the_public_modules():
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.stem not in TOP_LEVEL)
    assert loose == [], f"modules loose at pipeline/'s top level: move each into its floor's package: {loose}"


def test_a_module_outside_every_floor_is_on_none():
    assert [floor_of(name) for name in ("pipeline.stages2", "pipeline.newthing", "pipeline.io_extra")] == [None] * 3
    assert floor_of("pipeline") == floor_of("pipeline.__main__") == floor_of("pipeline.cli") == len(LAYERS) - 1
    assert floor_of("pipeline.io.delta.sink") == floor_of("pipeline.io") == 3
    assert floor_of("pipeline.runner") == 6 and floor_of("pipeline.errors") == 0
    assert floor_of("pipeline.core.rows") == floor_of("pipeline.errors") and floor_of("pipeline.config.identity") == 1
    assert floor_of("pipeline.records.runs") == floor_of("pipeline.stages.small_jobs") == 5
    assert floor_of("pipeline.dataframe.checks") == len(LAYERS) - 1


def test_no_import_runs_up_a_floor():
    assert upward_imports(import_graph()) == []


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_checker_sees_imports_inside_functions_and_circles():
    known = {"pipeline.errors", "pipeline.runner", "pipeline.config", "pipeline.config.models", "pipeline.io",
             "pipeline.io.stores"}
    source = "import os\nfrom . import models\n\ndef f():\n    from pipeline.runner import run_job\n"
    assert imports_of("pipeline.config", source, known, is_package=True) == {"pipeline.runner",
                                                                             "pipeline.config.models"}
    graph = {"pipeline.errors": {"pipeline.runner"}, "pipeline.runner": {"pipeline.errors"}}
    assert upward_imports(graph) == ["pipeline.errors (core) imports pipeline.runner (run)"]
    assert cycles(graph) == [["pipeline.errors", "pipeline.runner"]]
    assert imports_of("pipeline.io", "from pipeline.io import stores", known, is_package=True) == {"pipeline.io.stores"}


MAX_FUNCTION_LINES = 80  # docs/architecture.md: a function that does more is split into named steps


def long_functions(source: str, module: str) -> list[str]:
    """``module.name (N lines)`` for each function or method in ``source`` over :data:`MAX_FUNCTION_LINES`,
    counted from its ``def`` to its last line (a nested function counts inside its parent, and on its own)."""
    return [f"{module}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_in_the_package_is_over_80_lines():
    found = [f for path in sorted(PACKAGE.rglob("*.py"))
             for f in long_functions(path.read_text(), str(path.relative_to(PACKAGE.parent)))]
    assert found == []


def test_the_length_check_counts_a_long_function():
    def body(lines: int) -> str:
        return "".join(f"    x{i} = {i}\n" for i in range(lines))

    too_long = f"def f():\n{body(MAX_FUNCTION_LINES)}\ndef g():\n    pass\n"
    assert long_functions(too_long, "m") == [f"m.f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(f"def f():\n{body(MAX_FUNCTION_LINES - 1)}", "m") == []



MAX_MODULE_LINES = 400  # docs/architecture.md: a module that grows past this is split by concern


def long_modules(package: Path = PACKAGE) -> list[str]:
    """``path (N lines)`` for each module under ``package`` longer than :data:`MAX_MODULE_LINES`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{path.relative_to(package.parent)} ({lines} lines)")
    return found


def test_no_module_in_the_package_is_over_400_lines():
    assert long_modules() == []


def test_the_module_check_counts_a_long_module(tmp_path):
    package = tmp_path / "pipeline"
    (package / "io").mkdir(parents=True)
    (package / "io" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (package / "small.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    assert long_modules(package) == [f"pipeline/io/big.py ({MAX_MODULE_LINES + 1} lines)"]


def between(graph: dict[str, set[str]], one: str, other: str) -> list[str]:
    """Every import from a module of package ``one`` into package ``other``, and back."""
    def inside(name: str, package: str) -> bool:
        return name == package or name.startswith(package + ".")

    return sorted(f"{src} imports {dst}" for src, targets in graph.items() for dst in targets
                  if (inside(src, one) and inside(dst, other)) or (inside(src, other) and inside(dst, one)))


def test_spark_and_io_never_import_each_other():
    """The Spark glue (sessions, UDFs, progress) and the tables (sources, Delta, stores) meet in the stages
    above them; staging (pipeline.journal) and the session settings (pipeline.core.sessions) are what both use."""
    assert between(import_graph(), "pipeline.spark", "pipeline.io") == []


def test_the_independence_check_sees_both_directions():
    graph = {"pipeline.spark.udf": {"pipeline.io.paths"}, "pipeline.io.delta.sink": {"pipeline.spark.session"},
             "pipeline.io.stores": {"pipeline.io.paths"}, "pipeline.spark.session": {"pipeline.core.sessions"}}
    assert between(graph, "pipeline.spark", "pipeline.io") == [
        "pipeline.io.delta.sink imports pipeline.spark.session", "pipeline.spark.udf imports pipeline.io.paths"]
