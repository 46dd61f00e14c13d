"""Scheduling examples, checked without Databricks or Airflow: the Asset Bundle and the Airflow DAG."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
import types
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from pipeline.cli import build_parser
from pipeline.config import load_config

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "jobs" / "databricks" / "databricks.yml"
DAG_FILE = REPO / "jobs" / "airflow" / "sbi_nightly.py"
JOBS = {"score_documents", "generate_text", "refresh_recommendations"}
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


# ------------------------------------------------------------------ the bundle's fields (the subset we use)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Schedule(_Strict):
    quartz_cron_expression: str
    timezone_id: str
    pause_status: str


class Library(_Strict):
    whl: Optional[str] = None
    requirements: Optional[str] = None


class SparkPythonTask(_Strict):
    python_file: str
    parameters: list[str]


class PythonWheelTask(_Strict):
    package_name: str
    entry_point: str
    parameters: list[str]


class Task(_Strict):
    task_key: str
    depends_on: list[dict[Literal["task_key"], str]] = Field(default_factory=list)
    job_cluster_key: str
    libraries: list[Library]
    spark_python_task: Optional[SparkPythonTask] = None
    python_wheel_task: Optional[PythonWheelTask] = None


class NewCluster(_Strict):
    spark_version: str
    node_type_id: str
    num_workers: Any
    spark_conf: dict[str, str] = Field(default_factory=dict)


class JobCluster(_Strict):
    job_cluster_key: str
    new_cluster: NewCluster


class Job(_Strict):
    name: str
    schedule: Schedule
    max_concurrent_runs: int
    job_clusters: list[JobCluster]
    tasks: list[Task]


class Variable(_Strict):
    description: str
    default: Any


class Artifact(_Strict):
    type: Literal["whl"]
    path: str
    build: str


class Target(_Strict):
    mode: Literal["development", "production"]
    default: bool = False
    variables: dict[str, Any] = Field(default_factory=dict)


class Bundle(_Strict):
    bundle: dict[Literal["name"], str]
    sync: dict[Literal["paths"], list[str]]
    variables: dict[str, Variable]
    artifacts: dict[str, Artifact]
    resources: dict[Literal["jobs"], dict[str, Job]]
    targets: dict[str, Target]


def test_bundle_fields_and_references() -> None:
    raw = BUNDLE.read_text()
    bundle = Bundle.model_validate(yaml.safe_load(raw))
    jobs = bundle.resources["jobs"]
    assert set(jobs) == JOBS
    used = set(re.findall(r"\$\{var\.([a-z_]+)\}", raw))
    assert used <= set(bundle.variables), f"undefined variables {used - set(bundle.variables)}"
    assert [n for n, t in bundle.targets.items() if t.default] == ["dev"]
    assert (BUNDLE.parent / bundle.sync["paths"][0]).resolve() == REPO
    assert (BUNDLE.parent / bundle.artifacts["wheel"].path).resolve() == REPO

    for name, job in jobs.items():
        assert len(job.schedule.quartz_cron_expression.split()) in (6, 7), name
        clusters = {c.job_cluster_key for c in job.job_clusters}
        keys = [t.task_key for t in job.tasks]
        assert len(keys) == len(set(keys)), f"{name}: duplicate task keys"
        for task in job.tasks:
            assert task.job_cluster_key in clusters
            assert all(d["task_key"] in keys for d in task.depends_on)
            assert [lib.whl for lib in task.libraries if lib.whl] == ["../../dist/*.whl"]
            [requirements] = [lib.requirements for lib in task.libraries if lib.requirements]
            assert (BUNDLE.parent / requirements).is_file(), requirements
            assert (task.spark_python_task is None) != (task.python_wheel_task is None), task.task_key
        [main] = [t.spark_python_task for t in job.tasks if t.spark_python_task]
        assert (BUNDLE.parent / main.python_file).resolve() == REPO / "jobs" / f"{name}.py"
        args = main.parameters
        # ds from the job run's start date
        assert args[args.index("--ds") + 1] == "{{job.start_time.iso_date}}"
        conf = args[args.index("--conf") + 1]
        assert conf == f"${{workspace.file_path}}/conf/{name}.yaml" and (REPO / f"conf/{name}.yaml").is_file()
        # the same config, overlay and overrides load here (every path: test_each_bundle_job_resolves_every_path...)
        config = _bundle_job_config(bundle, name, {})
        assert config.sink.writer == "delta"
        # the task installs the libraries of exactly the extras its job needs (pyproject.toml's)
        from pipeline.registry import get_task_kind

        kind = get_task_kind(config.task.kind)
        [requirements] = [lib.requirements for t in job.tasks if t.spark_python_task for lib in t.libraries
                          if lib.requirements]
        assert _requirement_lines(BUNDLE.parent / requirements) == _extra_lines(kind.job.extras(config, kind.task)), name


# the variables as the description of each offers them: the defaults (every table on a Volume), and a warehouse on
# Azure storage (tables through the connector; the runs table and staging stay on the state Volume)
VARIABLE_SETS = {"defaults": {},
                 "abfss": {"warehouse": "abfss://lake@account.dfs.core.windows.net/sbi"}}
# a string in a resolved config that looks like a path (a slash, no spaces or braces): every one must be a location
_PATH_LIKE = re.compile(r"[^\s{}]*/[^\s{}]*")


def _bundle_variables(bundle: Bundle, given: dict[str, str]) -> dict[str, str]:
    """The bundle's variables as ``databricks bundle deploy`` resolves them: the given ones over the defaults."""
    return {name: str(given.get(name, var.default)) for name, var in bundle.variables.items()}


def _resolve(text: str, variables: dict[str, str]) -> str:
    """``${var.*}`` as the bundle resolves them, ``${workspace.file_path}`` as the synced bundle root (this
    checkout: sync.paths is the repository) and the job run's date; anything else left is an error."""
    text = re.sub(r"\$\{var\.([a-z_]+)\}", lambda m: variables[m.group(1)], text)
    text = text.replace("${workspace.file_path}", str(REPO)).replace("{{job.start_time.iso_date}}", "2026-11-30")
    assert "${" not in text and "{{" not in text, f"unresolved reference in {text!r}"
    return text


def _bundle_job_config(bundle: Bundle, name: str, given: dict[str, str]):
    """The config ``jobs/<name>.py`` loads on Databricks: its task's parameters resolved with only the bundle's
    variables, parsed and loaded by the library's own CLI (``job_main``: ``run`` and the parameters)."""
    from pipeline.cli import config_from_args

    variables = _bundle_variables(bundle, given)
    [task] = [t.spark_python_task for t in bundle.resources["jobs"][name].tasks if t.spark_python_task]
    args = build_parser().parse_args(["run", *[_resolve(p, variables) for p in task.parameters]])
    return config_from_args(args)


@pytest.mark.parametrize("values", list(VARIABLE_SETS), ids=list(VARIABLE_SETS))
@pytest.mark.parametrize("name", sorted(JOBS))
def test_each_bundle_job_resolves_every_path_from_the_bundles_variables(name: str, values: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table, folder and file the job reads or writes (``JobConfig.locations``) is absolute and under one of
    the bundle's variables, whatever the driver's working folder (``jobs/`` for a Python-script task on
    Databricks); none is a relative demo path, a path of a dev checkout or a demo filter. The runs table and
    staging are on the state Volume (run.state_path is used, not only set), the recorder writes the runs table
    there through the session's Delta connector, and the report task reads that table."""
    from pipeline.core.locations import uri_scheme
    from pipeline.records.recorder import RunRecorder

    for conf in [REPO / "conf" / f"{name}.yaml", REPO / "conf" / "env" / "databricks.yaml"]:
        for env_name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", conf.read_text()):
            monkeypatch.delenv(env_name, raising=False)  # a fresh cluster: only the bundle's variables
    bundle = Bundle.model_validate(yaml.safe_load(BUNDLE.read_text()))
    variables = _bundle_variables(bundle, VARIABLE_SETS[values])
    roots = {key: variables[key].rstrip("/") + "/" for key in ("warehouse", "models", "state")}
    monkeypatch.chdir(REPO / "jobs")  # the driver's folder on Databricks: the script's
    config = _bundle_job_config(bundle, name, VARIABLE_SETS[values])
    locations = config.locations()
    assert {"source.path", "model.path", "sink.path", "run.runs_path", "run.staging_path"} <= set(locations)
    # tables in the warehouse, models from the models Volume (never a dev checkout's or a package's demo model)
    assert config.source.path.startswith(roots["warehouse"]) and config.sink.path.startswith(roots["warehouse"])
    assert config.model.path.startswith(roots["models"]), config.model.path
    for key, location in locations.items():
        assert uri_scheme(location) is not None or Path(location).is_absolute(), f"{key} {location!r} is relative"
        assert any(location.startswith(root) or location + "/" == root for root in roots.values()), \
            f"{key} {location!r} is under none of the bundle's variables {sorted(roots.values())}"
        assert not location.startswith(str(REPO)), f"{key} {location!r} is in the checkout"
    # the walk misses no path-like value: each is a location it found
    dumped = config.model_dump(mode="json")

    def strings(value, where=""):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from strings(v, f"{where}.{k}" if where else k)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v, where)
        elif isinstance(value, str):
            yield where, value

    unlisted = {k: v for k, v in strings(dumped) if _PATH_LIKE.fullmatch(v) and k not in locations}
    assert not unlisted, f"path-like values no READS or WRITES field names: {unlisted}"
    # nothing of the demo's narrowing survives into the platform's job
    assert config.source.limit is None and config.source.where is None
    # the state Volume is used: the runs table and staging are there, and the recorder writes that table
    assert config.resolved_runs_path() == f"{roots['state']}{name}/runs"
    assert config.run.staging_path == f"{roots['state']}{name}/staging"
    recorder = RunRecorder(config, run_id="r", ds=config.run.resolved_ds())
    assert recorder.path == config.resolved_runs_path() and "Unity Catalog Volume" in recorder.via_spark
    if name == "score_documents":  # the report task reads the runs table the job writes, and writes to the Volume
        [report] = [t.python_wheel_task for t in bundle.resources["jobs"][name].tasks if t.python_wheel_task]
        args = build_parser().parse_args([_resolve(p, variables) for p in report.parameters])
        assert args.target == config.resolved_runs_path()
        assert args.out.startswith(roots["state"]) and args.out.endswith("_2026-11-30.html")


def _requirement_lines(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def _extra_lines(extras: tuple[str, ...]) -> set[str]:
    optional = PYPROJECT["project"]["optional-dependencies"]
    return {req for extra in extras for req in optional[extra]}


def test_a_job_keeps_its_state_in_the_databricks_overlays_volume(monkeypatch) -> None:
    """conf/env/databricks.yaml gives a job working runs-table and staging locations (and a sink.table job its
    quarantine) on the state Volume."""
    monkeypatch.setenv("SBI_STATE_PATH", "/Volumes/main/ml/state")
    config = load_config(REPO / "conf/score_documents.yaml", overlays=[REPO / "conf/env/databricks.yaml"],
                         overrides=["sink.table=main.ml.document_scores", "sink.path=null"])
    assert config.sink.resolved_quarantine_path() == "/Volumes/main/ml/state/score_documents/quarantine"
    assert config.resolved_runs_path() == "/Volumes/main/ml/state/score_documents/runs"
    assert config.run.staging_path == "/Volumes/main/ml/state/score_documents/staging"
    # keys set on their own win; a path sink keeps its own <sink.path>_... defaults
    own = load_config(REPO / "conf/score_documents.yaml", overlays=[REPO / "conf/env/databricks.yaml"],
                      overrides=["sink.table=main.ml.document_scores", "sink.path=null",
                                 "sink.quarantine_path=/Volumes/main/ml/q"])
    assert own.sink.resolved_quarantine_path() == "/Volumes/main/ml/q"
    # a path sink keeps its runs table and staging there too (the driver and executors reach a Volume as files);
    # its quarantine stays beside its output, written by the same writer
    path_sink = load_config(REPO / "conf/score_documents.yaml", overlays=[REPO / "conf/env/databricks.yaml"],
                            overrides=["sink.path=abfss://lake@acct.dfs.core.windows.net/sbi/document_scores"])
    assert path_sink.resolved_runs_path() == "/Volumes/main/ml/state/score_documents/runs"
    assert path_sink.run.staging_path == "/Volumes/main/ml/state/score_documents/staging"
    assert path_sink.sink.resolved_quarantine_path() == path_sink.sink.path + "_quarantine"
    local = load_config(REPO / "conf/score_documents.yaml")  # no state_path: beside the output, as before
    assert local.run.staging_path is None and local.resolved_runs_path() == local.sink.path + "_runs"


def test_bundle_report_task_runs_the_report_cli() -> None:
    bundle = Bundle.model_validate(yaml.safe_load(BUNDLE.read_text()))
    [report] = [t for t in bundle.resources["jobs"]["score_documents"].tasks if t.python_wheel_task]
    wheel = report.python_wheel_task
    assert wheel.package_name == PYPROJECT["project"]["name"]
    assert PYPROJECT["project"]["scripts"][wheel.entry_point] == "pipeline.cli:main"
    args = build_parser().parse_args(wheel.parameters)
    assert (args.command, args.history, args.fail_on_deviation) == ("report", 14, True)
    [requirements] = [lib.requirements for lib in report.libraries if lib.requirements]
    assert _requirement_lines(BUNDLE.parent / requirements) == _extra_lines(("report",))
    assert report.depends_on == [{"task_key": "score"}]


# ------------------------------------------------------------------ the Airflow DAG, with stand-in airflow modules


class _Operator:
    created: list["_Operator"] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.downstream: list[_Operator] = []
        _Operator.created.append(self)

    def __rshift__(self, other: "_Operator") -> "_Operator":
        self.downstream.append(other)
        return other


class _SparkSubmit(_Operator):
    pass


class _Bash(_Operator):
    pass


class _DAG:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __enter__(self) -> "_DAG":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def load_dag(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    stubs = {
        "airflow": {"DAG": _DAG},
        "airflow.providers": {}, "airflow.providers.apache": {}, "airflow.providers.apache.spark": {},
        "airflow.providers.apache.spark.operators": {},
        "airflow.providers.apache.spark.operators.spark_submit": {"SparkSubmitOperator": _SparkSubmit},
        "airflow.providers.standard": {}, "airflow.providers.standard.operators": {},
        "airflow.providers.standard.operators.bash": {"BashOperator": _Bash},
    }
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("SBI_HOME", str(REPO))
    monkeypatch.delenv("SBI_WAREHOUSE", raising=False)
    _Operator.created = []
    spec = importlib.util.spec_from_file_location("sbi_nightly", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dag_module_level_only_builds_the_dag() -> None:
    tree = ast.parse(DAG_FILE.read_text())
    allowed = (ast.Import, ast.ImportFrom, ast.Assign, ast.FunctionDef, ast.With)
    body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body  # the docstring
    assert all(isinstance(node, allowed) for node in body), [type(n).__name__ for n in body]
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "airflow.providers.apache.spark.operators.spark_submit" in imported


def test_dag_submits_each_job_with_its_config_and_the_logical_date(monkeypatch: pytest.MonkeyPatch) -> None:
    module = load_dag(monkeypatch)
    assert module.dag.kwargs["dag_id"] == "sbi_nightly" and module.dag.kwargs["catchup"] is False
    submits = {op.kwargs["task_id"]: op.kwargs for op in _Operator.created if isinstance(op, _SparkSubmit)}
    assert set(submits) == JOBS
    for job, kwargs in submits.items():
        assert Path(kwargs["application"]) == REPO / "jobs" / f"{job}.py" and Path(kwargs["application"]).is_file()
        args = kwargs["application_args"]
        assert Path(args[args.index("--conf") + 1]) == REPO / "conf" / f"{job}.yaml"
        assert args[args.index("--ds") + 1] == "{{ ds }}"
        assert kwargs["env_vars"]["PYSPARK_PYTHON"] == f"{REPO}/.venv/bin/python"
        sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
        load_config(args[args.index("--conf") + 1], overrides=sets + ["run.ds=2026-11-30"])
    [report] = [op for op in _Operator.created if isinstance(op, _Bash)]
    command = re.sub(r"\{\{\s*ds\s*\}\}", "2026-11-30", report.kwargs["bash_command"]).split()  # as Jinja renders it
    assert command[:3] == [f"{REPO}/.venv/bin/python", "-m", "pipeline"]
    args = build_parser().parse_args(command[3:])
    assert args.command == "report" and args.target.endswith("demo/document_scores") and args.out.endswith("_2026-11-30.html")
    assert report in module.score.downstream
