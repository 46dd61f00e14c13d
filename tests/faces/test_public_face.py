"""The public face in one place: what the docs use is exported from ``pipeline``, and every error is a PipelineError.

**What counts as a public use.** The Python code of the docs: every fenced block of README.md and docs/**/*.md
whose language is ``python`` or ``py`` (lines starting with ``%``, notebook magics like ``%pip install``, are
dropped first), and every notebook in notebooks/ (the whole file). In that code, a *path* below ``pipeline`` is
used by

- ``from pipeline import X``                 the path ``X``;
- ``from pipeline.A.B import X``             the path ``A.B.X``;
- ``import pipeline.A.B``                    the path ``A.B``;
- ``pipeline.A.B`` as an expression          the path ``A.B`` (where ``import pipeline`` bound the name);
- ``pipeline.A.B`` in a comment of the code  the path ``A.B`` (``# job=MyHooks() (a pipeline.TaskJob)``).

A path is public when either

- its first name is in ``pipeline.__all__``: an exported object (what follows is its attributes), or an
  exported module (``cli``, ``errors``, ``notebook``), whose next name must then be in that module's own
  ``__all__``; or
- it reaches into modules that are not exported, down to the first object that is not a module, and that
  object is exported from ``pipeline`` under the same name, the very same object
  (``from pipeline.config import TaskConfig`` is public: ``pipeline.TaskConfig`` is that class).

A path that stops at a module nobody exported (``import pipeline.io.stores``) or that reaches an object
``pipeline`` does not export (``from pipeline.io.stores import StoreError``) fails. Every exported name is also
on the API reference page (docs/reference/python.md, a ``::: pipeline.<name>`` directive of mkdocstrings).

**Every error a user can meet is a PipelineError.** Every module of the package is imported and every exception
class it defines must derive from :class:`pipeline.errors.PipelineError`, but for :data:`EXEMPT`: exceptions that
steer control flow inside the library and never leave it, each with the reason. Classes that joined the tree late
keep the builtin base their callers catch (:data:`KEPT_BASES`).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import pkgutil
import re
import subprocess
import sys
import tokenize
import types
from pathlib import Path

import pytest

import pipeline
from pipeline.errors import PipelineError

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
API_PAGE = REPO / "docs" / "reference" / "python.md"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)")
DOTTED = re.compile(r"\bpipeline((?:\.[A-Za-z_]\w*)+)")

# internal control-flow exceptions: raised and caught inside the library, never seen by a caller
EXEMPT = {
    "pipeline.endpoint.batches._Lost": "BatchApi._call raises it for a request whose answer was lost, and only "
    "BatchApi.create asks for it: it catches it, looks for the batch in the listing, and gives up with a "
    "BatchApiError (an EngineError)",
    "pipeline.models.verdicts.VerdictMissing": "raised only for a warm-up plan (recall_verdict_only: replay a "
    "remembered gate verdict or load nothing); the warm-up thread swallows every failure (pipeline/spark/warmup.py) "
    "and the inference tasks then measure the gate themselves",
}
# errors that joined the PipelineError tree after callers already caught them by their builtin base
KEPT_BASES = {
    "pipeline.io.stores.StoreError": ValueError,
    "pipeline.endpoint.wire.WireError": ValueError,
    "pipeline.images.decode.ImageRejected": ValueError,
}


# ------------------------------------------------------------------ what the docs use


def python_blocks(text: str) -> list[str]:
    """The code of every fenced ``python`` / ``py`` block of a Markdown page, magics (``%pip``) dropped.

    >>> page = "x\\n```python\\n%pip install a\\nimport b\\n```\\n```bash\\nls\\n```\\n  ```py\\n  c = 1\\n  ```"
    >>> python_blocks(page)
    ['import b\\n', 'c = 1\\n']
    """
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        if match.group("lang") in ("python", "py"):
            body = [line[len(match.group("indent")):] for line in lines[i + 1:end]]
            blocks.append("".join(f"{line}\n" for line in body if not line.lstrip().startswith("%")))
        i = end + 1
    return blocks


def _attribute_path(node: ast.expr) -> list[str] | None:
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return [*reversed(names)] if isinstance(node, ast.Name) and node.id == "pipeline" else None


def used_paths(code: str) -> set[tuple[str, ...]]:
    """The paths below ``pipeline`` that ``code`` uses (the rules of this module's docstring).

    >>> sorted(used_paths("from pipeline import score\\nfrom pipeline.io.stores import StoreError\\n"
    ...                   "import pipeline.notebook\\npipeline.run_job(c)  # a pipeline.tasks.job.TaskJob"))
    [('io', 'stores', 'StoreError'), ('notebook',), ('run_job',), ('score',), ('tasks', 'job', 'TaskJob')]
    """
    found: set[tuple[str, ...]] = set()
    tree = ast.parse(code)
    binds_pipeline = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                node.module == "pipeline" or node.module.startswith("pipeline.")):
            below = node.module.split(".")[1:]
            found.update((*below, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "pipeline":
                    binds_pipeline = binds_pipeline or alias.asname is None
                    if len(parts) > 1:
                        found.add(tuple(parts[1:]))
    if binds_pipeline:
        attributes = [_attribute_path(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)]
        paths = [p for p in attributes if p]
        # pipeline.a.b(...) is one use, not also the shorter pipeline.a
        found.update(tuple(p) for p in paths if not any(len(q) > len(p) and q[:len(p)] == p for q in paths))
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            found.update(tuple(m.group(1)[1:].split(".")) for m in DOTTED.finditer(token.string))
    return found


def refusal(path: tuple[str, ...]) -> str | None:
    """Why the use of ``pipeline.<path>`` is not public (see the rules above); None when it is."""
    dotted = "pipeline." + ".".join(path)
    first = path[0]
    if first in pipeline.__all__:
        exported = getattr(pipeline, first)
        if isinstance(exported, types.ModuleType) and len(path) > 1 and path[1] not in exported.__all__:
            return f"{dotted}: {path[1]} is not in pipeline.{first}.__all__ (the public module's names)"
        return None
    obj: object = pipeline
    for depth, name in enumerate(path):
        if isinstance(obj, types.ModuleType):
            module = f"{obj.__name__}.{name}"
            is_module = hasattr(obj, "__path__") and importlib.util.find_spec(module) is not None
            try:
                obj = importlib.import_module(module) if is_module else getattr(obj, name)
            except AttributeError:
                return f"{dotted}: there is no {name} in {obj.__name__}"
        if not isinstance(obj, types.ModuleType):
            if name not in pipeline.__all__:
                return f"{dotted}: {name} is not exported from pipeline (add it to pipeline.__all__)"
            if getattr(pipeline, name) is not obj:
                return f"{dotted}: pipeline.{name} is another object than {'.'.join(path[:depth + 1])}"
            return None
    return f"{dotted}: the module {obj.__name__} is not exported from pipeline"


def _doc_code() -> list[tuple[str, str]]:
    code = [(f"{page.relative_to(REPO)} block {n}", block) for page in PAGES
            for n, block in enumerate(python_blocks(page.read_text()), start=1)]
    return code + [(str(path.relative_to(REPO)), path.read_text()) for path in NOTEBOOKS]


def test_every_name_the_docs_use_is_exported_from_pipeline():
    code = _doc_code()
    uses = {(where, path) for where, text in code for path in used_paths(text)}
    assert len(code) >= 15 and len(uses) >= 20, "the docs' Python code was not found: the rule reads nothing"
    refused = sorted(f"{where}: {why}" for where, path in uses if (why := refusal(path)))
    assert not refused, "the docs use names pipeline does not export:\n" + "\n".join(refused)


@pytest.mark.parametrize("code, why", [
    ("from pipeline.io.stores import StoreError", "StoreError is not exported from pipeline"),
    ("import pipeline.io.stores", "the module pipeline.io.stores is not exported"),
    ("import pipeline\npipeline.records.runs.read_runs(p).count", None),
    ("import pipeline\npipeline.records.runs.run_row(p)", "run_row is not exported from pipeline"),
    ("from pipeline import nothing_here", "there is no nothing_here in pipeline"),
    ("from pipeline.notebook import run_notebook, WIDGETS", "WIDGETS is not in pipeline.notebook.__all__"),
    ("x = 1  # the hooks: a pipeline.tasks.job.TaskJob", None),
    ("x = 1  # the hooks: a pipeline.tasks.job.checked_model", "checked_model is not exported"),
    ("from pipeline.config import TaskConfig\nfrom pipeline import errors", None),
])
def test_the_rule_refuses_a_name_reached_in_a_module_and_passes_an_exported_one(code, why):
    reasons = [r for path in used_paths(code) if (r := refusal(path))]
    if why is None:
        assert not reasons
    else:
        assert len(reasons) == 1 and why in reasons[0], reasons


def test_every_exported_name_is_on_the_api_reference_page():
    directives = set(re.findall(r"^::: (\S+)\s*$", API_PAGE.read_text(), re.M))
    missing = sorted(name for name in pipeline.__all__ if f"pipeline.{name}" not in directives)
    assert not missing, f"exported but not on {API_PAGE.relative_to(REPO)}: add `::: pipeline.<name>` for {missing}"
    assert all(name in dir(pipeline) for name in pipeline.__all__)
    assert len(set(pipeline.__all__)) == len(pipeline.__all__) and pipeline.__all__ == sorted(pipeline.__all__)


def test_import_pipeline_pulls_in_no_spark_and_no_torch():
    """The exported names must stay cheap to import: a driver or a notebook imports the package first."""
    code = ("import sys, pipeline\nfrom pipeline import *\n"
            "print(sorted(m for m in ('pyspark', 'torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]", done.stdout


# ------------------------------------------------------------------ every error under PipelineError


def exception_classes() -> dict[str, type[BaseException]]:
    """``{module.Class: class}`` of every exception class a module of the package defines (all imported)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        if info.name == "pipeline.__main__":  # runs the command line when imported
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


@pytest.fixture(scope="module")
def exceptions() -> dict[str, type[BaseException]]:
    return exception_classes()


def test_every_exception_class_a_user_can_meet_is_a_pipeline_error(exceptions):
    assert len(exceptions) >= 25 and "pipeline.io.stores.StoreError" in exceptions, sorted(exceptions)
    outside = sorted(name for name, cls in exceptions.items() if not issubclass(cls, PipelineError)
                     and name not in EXEMPT)
    assert not outside, (f"exception classes outside the PipelineError tree: {outside}; derive them from "
                         "PipelineError (keeping the builtin base callers catch), or, for one that never leaves the "
                         "library, add it to EXEMPT with the reason")


def test_the_exemptions_are_few_current_and_still_needed(exceptions):
    assert len(EXEMPT) <= 3, "the exemptions are for control flow inside the library, not for errors users meet"
    for name, reason in EXEMPT.items():
        assert name in exceptions, f"{name} is exempt but no longer defined: drop it from EXEMPT"
        assert not issubclass(exceptions[name], PipelineError), f"{name} is a PipelineError now: drop it from EXEMPT"
        assert len(reason) > 40


@pytest.mark.parametrize("name", sorted(KEPT_BASES))
def test_an_error_that_joined_the_tree_is_still_caught_by_its_builtin_base(name, exceptions):
    cls = exceptions[name]
    assert issubclass(cls, PipelineError) and issubclass(cls, KEPT_BASES[name])
