"""What the wheel declares is what ``pipeline/`` imports, extras by capability, pyspark provided by the platform.

A cluster library install (Databricks, EMR) gets exactly ``pyproject.toml``'s dependencies and the extras the
user names: an import no extra declares is a ``ModuleNotFoundError`` on an executor halfway through a night.
``make test-wheel`` installs the built wheel into fresh venvs; these tests read the declarations themselves.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions, version
from pathlib import Path

import pytest

from pipeline.core import compat, extras
from pipeline.errors import MissingExtraError, UnsupportedSparkError

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# modules whose distribution is not installed in the dev venv (its own venv, or compiled on demand)
NOT_INSTALLED_HERE = {"vllm": "vllm", "llama_cpp": "llama-cpp-python"}
# extras that declare nothing a job imports; the demo's may serve the demo's own modules
NOT_RUNTIME_EXTRAS = ("test", "docs", "demo")
DEMO_MODULES = ("pipeline/demo/", "pipeline/io/local_s3.py")


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> dict[str, set[str]]:
    """``{"base" | extra: distribution names}`` from pyproject.toml (an extra naming others expanded)."""
    found = {"base": {_name(r) for r in PYPROJECT["dependencies"]}}
    for extra, reqs in PYPROJECT["optional-dependencies"].items():
        found[extra] = {_name(r) for r in reqs}
    for extra, reqs in PYPROJECT["optional-dependencies"].items():
        for req in reqs:
            if _name(req) == "spark-batch-inference":
                named = re.search(r"\[(.*)\]", req).group(1).split(",")
                found[extra] = set().union(*(found[n.strip()] for n in named))
    return found


def _third_party_imports() -> dict[str, set[str]]:
    """``{top-level module: files}`` for every non-stdlib import in pipeline/, imports inside functions too."""
    where: dict[str, set[str]] = {}
    for path in (REPO / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("pipeline", "__future__"):
                    where.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return where


@functools.lru_cache(maxsize=1)
def _installed() -> dict[str, list[str]]:
    return packages_distributions()  # reads every installed distribution's files: once per session


def _distributions(module: str) -> set[str]:
    dists = {d.lower().replace("_", "-") for d in _installed().get(module, [])}
    if module in NOT_INSTALLED_HERE:
        dists.add(NOT_INSTALLED_HERE[module])
    return dists


def test_every_third_party_import_is_declared_by_the_base_or_an_extra():
    """By the base or a capability extra: the ``test`` and ``docs`` extras are for this checkout, and ``demo``
    only for the demo's own modules (its data and the local S3 server of ``make demo-s3``)."""
    declared = _declared()
    runtime = set().union(*(dists for extra, dists in declared.items() if extra not in NOT_RUNTIME_EXTRAS))
    undeclared = {}
    for module, files in sorted(_third_party_imports().items()):
        dists = _distributions(module)
        assert dists, f"{module} (imported in {sorted(files)}) is not installed here: cannot tell its distribution"
        for path in sorted(files):
            allowed = runtime | (declared["demo"] if path.startswith(DEMO_MODULES) else set())
            if not dists & allowed:
                undeclared.setdefault(module, (sorted(dists), []))[1].append(path)
    assert not undeclared, f"imported in pipeline/ but declared by no runtime extra in pyproject.toml: {undeclared}"


def test_the_extras_the_runtime_checks_are_the_extras_pyproject_declares():
    declared = _declared()
    for extra, modules in extras.EXTRAS.items():
        assert extra in declared, f"pipeline.core.extras names {extra!r}, which pyproject.toml does not declare"
        for module in modules:
            dists = _distributions(module)
            assert dists & declared[extra], f"extra {extra!r}: module {module} ({sorted(dists)}) is not in its list"
    # every declared capability extra the runtime can ask for is known to it (docs/test/demo/all are not asked for)
    assert set(declared) - {"base", "docs", "test", "demo", "all"} == set(extras.EXTRAS)


def test_pyspark_is_the_platforms_not_a_dependency():
    assert not any(_name(r) == "pyspark" for r in PYPROJECT["dependencies"])
    assert any(_name(r) == "pyspark" for r in PYPROJECT["optional-dependencies"]["spark"])
    spark_req = PYPROJECT["optional-dependencies"]["spark"][0]
    first, last = compat.SUPPORTED_SPARK
    assert f">={first[0]}.{first[1]}" in spark_req and f"<{last[0]}.{last[1] + 1}" in spark_req, spark_req
    # `all` must be safe to add beside a cluster's Spark: it pulls no pyspark through any extra
    assert not {"pyspark", "delta-spark"} & _declared()["all"]


def test_requires_python_matches_the_code():
    uses_strenum = "StrEnum" in (REPO / "pipeline" / "core" / "rows.py").read_text()
    assert uses_strenum, "pipeline.core.rows no longer uses enum.StrEnum: requires-python may go back below 3.11"
    assert PYPROJECT["requires-python"] == ">=3.11"


def test_one_version_source_and_a_license():
    import pipeline

    assert "version" not in PYPROJECT.get("dynamic", [])
    assert pipeline.__version__ == version("spark-batch-inference") == PYPROJECT["version"], (
        "the installed metadata is stale: reinstall (make venv) after changing pyproject.toml's version")
    text = (REPO / "LICENSE").read_text()
    assert PYPROJECT["license"] == "Apache-2.0" and "Apache License" in text and "Version 2.0, January 2004" in text
    assert not re.search(r"__version__\s*=\s*[\"']\d", (REPO / "pipeline" / "__init__.py").read_text())


def test_sbi_version_names_the_library_and_the_spark_it_runs_with():
    done = subprocess.run([sys.executable, "-m", "pipeline", "--version"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    import pipeline

    assert done.stdout.strip().startswith(f"spark-batch-inference {pipeline.__version__} (pyspark {version('pyspark')},")


def test_a_missing_extra_fails_before_any_spark_work_with_the_pip_line(tmp_path):
    """vllm is never in this venv (it has one of its own): a job on the vllm backend is refused in the driver
    before a JVM starts, with the line that installs what it needs."""
    conf = tmp_path / "job.yaml"
    conf.write_text(json.dumps({
        "job": "needs_vllm", "source": {"format": "delta", "path": str(tmp_path / "docs"), "id_column": "doc_id"},
        "model": {"path": str(tmp_path / "model")}, "task": {"kind": "generate", "template": "{text}", "backend": "vllm"},
        "sink": {"path": str(tmp_path / "out")},
    }))
    probe = ("import sys\nfrom pipeline import load_config, run_job\nfrom pipeline.errors import MissingExtraError\n"
             f"try:\n    run_job(load_config({str(conf)!r}))\nexcept MissingExtraError as exc:\n"
             "    print('refused:', exc)\nprint('jvm:', 'py4j.java_gateway' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "refused: task.kind generate (backend vllm) needs vllm (vllm)" in done.stdout, done.stdout + done.stderr
    assert "pip install 'spark-batch-inference[transformers,vllm]'" in done.stdout
    assert "jvm: False" in done.stdout
    assert not (tmp_path / "out").exists()


def test_require_names_every_missing_module_and_the_extras_together():
    with pytest.raises(MissingExtraError) as caught:
        extras.require(("transformers", "vllm"), for_what="this job")
    message = str(caught.value)
    assert "vllm (vllm)" in message and "torch" not in message.split("which")[0]
    assert message.endswith("(on Databricks: a cluster library, or %pip install in the notebook)")
    extras.require(("transformers", "endpoint"), for_what="nothing missing")  # both installed here: no error


@pytest.mark.parametrize("found, ok", [("4.0.0", True), ("4.2.0", True), ("4.3.1", True), ("3.5.2", False),
                                       ("4.4.0", False), ("4.1.0.dev0", True)])
def test_the_supported_spark_range(found, ok, monkeypatch):
    monkeypatch.delenv(compat.ALLOW_UNSUPPORTED_ENV, raising=False)
    if ok:
        assert compat.check_spark(found) == found
        return
    with pytest.raises(UnsupportedSparkError) as caught:
        compat.check_spark(found, where="the Spark Connect server")
    message = str(caught.value)
    assert f"the Spark Connect server is Spark {found}" in message and "supports Spark 4.0 to 4.3" in message
    assert "'pyspark>=4.0,<4.4'" in message and compat.ALLOW_UNSUPPORTED_ENV in message


def test_an_unsupported_spark_can_be_tried_on_purpose(monkeypatch, capsys):
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    assert compat.check_spark("3.5.2") == "3.5.2"
    assert "warning: the installed pyspark is Spark 3.5.2" in capsys.readouterr().err
    # a feature that needs a newer Spark is refused all the same, naming what it needs
    with pytest.raises(UnsupportedSparkError, match="needs Spark 4.0 or later; this is Spark 3.5.2"):
        compat.check_spark_feature("the jar-free deltalake writer", (4, 0), "3.5.2")


def test_the_installed_pyspark_is_read_without_importing_it():
    probe = "import sys\nfrom pipeline.core.compat import installed_pyspark\nprint(installed_pyspark(), 'pyspark' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == [version("pyspark"), "False"]


def test_the_delta_connector_for_each_spark_line():
    assert compat.delta_connector_package("4.0.1", delta_spark=None) == "io.delta:delta-spark_4.0_2.13:4.4.0"
    assert compat.delta_connector_package("4.2.0", delta_spark="4.4.0") == "io.delta:delta-spark_4.2_2.13:4.4.0"
    assert compat.delta_connector_package("4.3.0", delta_spark=None) is None
    from pipeline.io.paths import connector_hint

    assert connector_hint().startswith("spark-submit --packages io.delta:delta-spark_")


def test_runtime_versions_name_what_a_run_ran_with():
    versions = compat.runtime_versions()
    assert versions["spark_batch_inference"] == version("spark-batch-inference")
    assert versions["pyspark"] == version("pyspark") and versions["torch"] == version("torch")
    assert versions["transformers"] == version("transformers")
