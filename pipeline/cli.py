"""Command line: ``python -m pipeline run conf/score_documents.yaml --set batching.batch_size=128``.

The spark-submit entries in ``jobs/`` call :func:`main` with the same arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, NamedTuple, Sequence

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "python -m pipeline") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Spark batch inference jobs")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the library's version and the pyspark and Python it runs with, then exit")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a job from its YAML config")
    add_job_arguments(run)
    check = sub.add_parser("check", help="validate a config and print it resolved, then check that this machine "
                           "has the Spark and the libraries the job needs, without running")
    add_job_arguments(check)
    sub.add_parser("tasks", help="list the registered task kinds and their config keys")
    docs = sub.add_parser("config-reference", help="print the config reference (the docs' generated pages)")
    docs.add_argument("--write", metavar="FILE", action="append", default=[],
                      help="replace the generated blocks inside this file (repeatable), e.g. docs/reference/config.md")
    vacuum = sub.add_parser("vacuum", help="delete crash leftovers (uncommitted files of dead writes) of a Delta "
                            "table written by the deltalake writer; never files any version references")
    vacuum.add_argument("table", help="the table folder, e.g. warehouse/scores")
    vacuum.add_argument("--dry-run", action="store_true", help="list what would go, delete nothing")
    vacuum.add_argument("--grace-s", type=float, default=900.0, metavar="S",
                        help="an unfinished write silent for S seconds counts as dead (900, as sink.leftover_grace_s)")
    vacuum.add_argument("--marker-retention-hours", type=float, default=168.0, metavar="H",
                        help="remove a dead write's marker (its proof that files are ours) once H hours old (168)")
    vacuum.add_argument("--staging-max-age-hours", type=float, default=72.0, metavar="H",
                        help="also remove staged task output (<table>_staging) untouched for H hours: what no "
                             "rerun claimed (72, as run.staging_max_age_hours)")
    add_report_arguments(sub.add_parser(
        "report", help="write an HTML report of a run (or the last N runs) from the runs table"))
    return parser


class _Version(argparse.Action):
    """``--version``: one unwrapped line on stdout (argparse's own action wraps it to the terminal's width)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``spark-batch-inference 0.2.0 (pyspark 4.2.0, Python 3.11.7)``."""
    from pipeline.core.compat import runtime_versions

    versions = runtime_versions()
    shown = ", ".join(f"{name} {versions[key]}" for key, name in
                      (("pyspark", "pyspark"), ("python", "Python"), ("torch", "torch"), ("transformers", "transformers"))
                      if key in versions)
    return f"spark-batch-inference {versions['spark_batch_inference']} ({shown or 'no pyspark'})"


def check_environment(config) -> list[str]:
    """What ``check`` says about this machine for ``config``: the Spark found and the extras the job needs.

    Raises the job's own error (the one ``run`` would give before any work) when one is missing.
    """
    from pipeline.core.compat import SUPPORTED_TEXT, check_spark
    from pipeline.registry import get_task_kind

    found = check_spark()
    kind = get_task_kind(config.task.kind)
    kind.job.check_extras(config, kind.task)
    extras = kind.job.extras(config, kind.task)
    return [f"pyspark {found}: supported (Spark {SUPPORTED_TEXT})",
            f"libraries for task.kind {config.task.kind}: installed ({', '.join(extras) or 'core only'})"]


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", help="an output table path, its runs table (<output>_runs), or a run id with --runs")
    parser.add_argument("--runs", metavar="PATH", help="the runs table (needed when target is a run id)")
    parser.add_argument("--history", type=int, metavar="N", help="also cover the job's last N runs, flagging deviations")
    parser.add_argument("--out", metavar="FILE", help="HTML file to write (default: <runs table>_report_<run id>.html)")
    parser.add_argument("--max-rows-drop", type=float, default=20.0, metavar="PCT",
                        help="flag a night whose rows in are more than PCT%% below the median before it (20)")
    parser.add_argument("--max-throughput-drop", type=float, default=30.0, metavar="PCT",
                        help="flag a night whose docs/s are more than PCT%% below the median before it (30)")
    parser.add_argument("--fail-on-deviation", action="store_true",
                        help="exit 3 when the reported run itself is flagged (for a scheduler's alert)")


def report_command(args: argparse.Namespace) -> int:
    """``pipeline report``: write the HTML file, print where, and list flagged nights."""
    from pipeline.report import Thresholds, report_main

    thresholds = Thresholds(rows_drop=args.max_rows_drop / 100, throughput_drop=args.max_throughput_drop / 100)
    path, reported, deviations = report_main(args.target, out=args.out, history=args.history, runs_path=args.runs,
                                             thresholds=thresholds)
    print(f"report: {path}")
    for flagged, reasons in deviations.items():
        print(f"flagged run {flagged}: " + "; ".join(reasons))
    # only the reported run decides the exit: a night flagged earlier in the history is listed, not failed again
    return 3 if args.fail_on_deviation and reported in deviations else 0


def vacuum_command(args: argparse.Namespace) -> int:
    """``pipeline vacuum``: sweep leftovers (see ``pipeline.io.delta.sweep``) and say what went."""
    from pipeline.errors import SinkError
    from pipeline.io.delta.sweep import sweep_leftovers
    from pipeline.core.locations import is_local, local_path

    if not is_local(args.table):
        raise SinkError(f"vacuum works on local or mounted table folders, not {args.table!r}")
    root = local_path(args.table)
    from pathlib import Path

    if not Path(root).is_dir():
        raise SinkError(f"no table folder at {root}; pass the folder of a Delta table (sink.path)")
    report = sweep_leftovers(root, grace_s=args.grace_s, dry_run=args.dry_run,
                             marker_retention_s=args.marker_retention_hours * 3600)
    verb = "would remove" if args.dry_run else "removed"
    for rel in report.files:
        print(f"{verb}: {rel}")
    print(f"{root}: {verb} {report.line()}")
    for rel in report.unproven[:5]:
        print(f"left alone (named like ours, but no marker of ours names its write): {rel}")
    from pipeline.journal.layout import staging_root
    from pipeline.journal.sweep import sweep_staging

    staging = staging_root(root)
    staged = sweep_staging(staging, max_age_s=args.staging_max_age_hours * 3600, dry_run=args.dry_run)
    for name in staged.removed:
        print(f"{verb}: {staging}/{name}")
    print(f"{root}: {verb} {len(staged.removed)} staged plan folder(s) older than {args.staging_max_age_hours:g} h")
    if warning := staged.warning(staging):
        print(f"warning: {warning}")
    return 0


class _Shortcut(NamedTuple):
    """A flag that stands for one ``--set`` (``--incremental`` is ``--set run.incremental=true``); its help says so.

    >>> _Shortcut("--log-json", "run.log_format=json", "lines as JSON", see="docs/logging.md").help()
    'lines as JSON (same as --set run.log_format=json; see docs/logging.md)'
    """

    flag: str
    setting: str  # ``key=value`` for a switch; ``key`` for a flag that takes the value
    does: str
    see: str = ""

    def help(self) -> str:
        key, _, value = self.setting.partition("=")
        return f"{self.does} (same as --set {key}={value or '...'}" + (f"; see {self.see})" if self.see else ")")

    def override(self, args: argparse.Namespace) -> str | None:
        """The ``--set`` the parsed ``args`` give for this flag, None when it was not given."""
        given = getattr(args, self.flag.removeprefix("--").replace("-", "_"), None)
        return None if not given else self.setting if "=" in self.setting else f"{self.setting}={given}"


_SHORTCUTS = (
    _Shortcut("--ds", "run.ds", "run date YYYY-MM-DD"),
    _Shortcut("--run-id", "run.run_id", "run id"),
    _Shortcut("--incremental", "run.incremental=true", "score only rows new or changed since the last run"),
    _Shortcut("--allow-empty", "run.allow_empty=true", "replace the day even when the source gives far fewer rows "
              "than it holds, or none", see="run.min_rows_fraction"),
    _Shortcut("--accept-drift", "run.accept_drift=true", "publish a run the drift gate flagged; a rerun of a refused "
              "run publishes its staged rows without scoring again", see="run.quality"),
    _Shortcut("--submit-only", "run.submit_only=true", "task.endpoint.mode batch: submit the run's batches to the "
              "provider and end, committing nothing; the same command later collects and commits"),
    _Shortcut("--retry-quarantined", "run.retry_quarantined=true", "with --incremental: score again the rows "
              "quarantined earlier with the same content and fingerprint"),
    _Shortcut("--log-json", "run.log_format=json", "the run's lines as JSON lines, one event per driver stage and "
              "the summary among them", see="docs/logging.md"),
)


def add_job_arguments(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    if positional:
        parser.add_argument("config", nargs="?", help="job config YAML, e.g. conf/score_documents.yaml")
    parser.add_argument("--conf", dest="config_opt", metavar="YAML", help="job config YAML (same as the positional)")
    parser.add_argument("--overlay", action="append", default=[], metavar="YAML",
                        help="environment overlay merged on top (repeatable), e.g. conf/env/databricks.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one key, e.g. --set batching.batch_size=128 (repeatable)")
    for shortcut in _SHORTCUTS:
        switch = "=" in shortcut.setting
        parser.add_argument(shortcut.flag, help=shortcut.help(), **({"action": "store_true"} if switch else {}))
    parser.add_argument("--verbose", action="store_true",
                        help="on an error, print the whole traceback and Spark's full error text, not just one line")


def config_from_args(args: argparse.Namespace):
    from pipeline.config import ConfigError, load_config

    path = args.config_opt or getattr(args, "config", None)
    if not path:
        raise ConfigError("no config given: pass a YAML path, e.g. conf/score_documents.yaml")
    overrides = list(args.overrides) + [s for shortcut in _SHORTCUTS if (s := shortcut.override(args))]
    return load_config(path, overrides=overrides, overlays=args.overlay)


def undated_run_warning(config) -> str | None:
    """What to say when an append or incremental run has no explicit run date.

    Its date is then "today in UTC" when it starts: a retry after midnight UTC is another day (another
    ``(id, ds)`` key, another partition) and writes the rows again. Schedulers pass the date.

    >>> from pipeline.config import build_config
    >>> raw = {"job": "j", "source": {"path": "/d"}, "model": {"path": "/m"}, "task": {"kind": "embed"},
    ...        "sink": {"path": "/out", "mode": "append"}}
    >>> undated_run_warning(build_config(raw)).split(";")[0]
    'sink.mode append without --ds: the run date is today in UTC'
    >>> undated_run_warning(build_config({**raw, "run": {"ds": "2026-11-29"}})) is None
    True
    """
    if config.run.ds is not None or config.source.stream is not None \
            or not (config.run.incremental or config.sink.mode == "append"):
        return None  # a stream's micro-batches are kept once by their transaction, whatever the day
    what = "run.incremental" if config.run.incremental else f"sink.mode {config.sink.mode}"
    return (f"{what} without --ds: the run date is today in UTC; a retry after midnight UTC becomes a new day "
            "and writes its rows again. Pass the scheduled date (--ds 2026-11-29, or {{ ds }} in Airflow)")


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m pipeline") -> int:
    """Run the command line with ``argv`` (``sys.argv[1:]`` when None); the exit status.

    ``0`` done; ``2`` a :class:`~pipeline.errors.PipelineError`, its message printed as one line on stderr;
    ``3`` a run refused for drift (or, with ``report --fail-on-deviation``, a run that deviated); ``143`` a run
    stopped by SIGTERM; ``1`` a failure Spark reported, in one line.
    """
    from pipeline.errors import PipelineError

    args = build_parser(prog).parse_args(argv)
    secrets: list[str] = []  # the config's storage keys, kept out of the error line
    try:
        if args.command == "report":
            return report_command(args)
        if args.command == "vacuum":
            return vacuum_command(args)
        if args.command == "tasks":
            from pipeline.docs import task_kinds_text

            print(task_kinds_text())
            return 0
        if args.command == "config-reference":
            from pipeline.docs import config_reference, write_config_reference

            for path in args.write:
                changed = write_config_reference(path, parser=build_parser())
                print(f"{path}: generated reference {'updated' if changed else 'already up to date'}")
            if not args.write:
                print(config_reference())
            return 0
        config = config_from_args(args)
        secrets = config.secret_values()
        if args.command == "check":
            import json

            # values from ${VAR} show as ${VAR}: check output lands in CI logs and terminals
            print(json.dumps(config.printable(), indent=2))
            for line in check_environment(config):
                print(f"check: {line}", file=sys.stderr)
            return 0
        from pipeline.runner import run_job

        warning = undated_run_warning(config)
        if warning:  # logged before the run starts: with no logging configured, Python prints it on stderr
            logging.getLogger("pipeline.cli").warning("warning: %s", warning)
        run_job(config)
        return 0
    except PipelineError as exc:  # every deliberate error: its message says what to change
        from pipeline.errors import DriftRefused, RunStopped

        _print_error(exc, verbose=getattr(args, "verbose", False), secrets=secrets)
        if isinstance(exc, DriftRefused):
            return 3  # the output moved: a quality alert (as `pipeline report --fail-on-deviation`), nothing published
        return 143 if isinstance(exc, RunStopped) else 2  # 128 + SIGTERM, as a shell reports a stopped job
    except Exception as exc:  # a failure Spark reports (e.g. a worker's exception): one line, not pages of Java
        from pipeline.core.error_text import is_spark_error

        if not is_spark_error(exc):
            raise  # our bug: the full traceback is the useful report
        _print_error(exc, verbose=getattr(args, "verbose", False), secrets=secrets)
        return 1


def _print_error(exc: BaseException, *, verbose: bool, secrets: Sequence[str] = ()) -> None:
    """``error: <one line>`` on stderr, ``secrets`` (the config's keys) scrubbed; with ``verbose`` the whole
    traceback (and Spark's text) first."""
    from pipeline.config.redaction import scrub

    from pipeline.errors import PipelineError
    from pipeline.core.error_text import error_line, is_spark_error

    if verbose:
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    spark_cause = next((e for e in (exc, exc.__cause__) if e is not None and is_spark_error(e)), None)
    line = str(exc).strip() if isinstance(exc, PipelineError) else error_line(exc)
    if spark_cause is not None and not verbose:
        line += " (--verbose prints Spark's full error)"
    print(f"error: {scrub(line, secrets)}", file=sys.stderr, flush=True)


def job_main(default_config: str, argv: Sequence[str] | None = None) -> int:
    """Entry for ``jobs/*.py`` under spark-submit: ``[--conf YAML] [--set k=v ...]``, config defaulted."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--conf" or a.startswith("--conf=") for a in argv) and not (argv and not argv[0].startswith("-")):
        argv = ["--conf", default_config, *argv]
    return main(["run", *argv], prog="spark-submit jobs/<job>.py")
