"""The HTML report (pipeline.report, ``pipeline report``): from runs tables read back, in a real headless browser."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.report import Thresholds, find_deviations, render_report
from pipeline.records.runs import read_runs, run_row, write_run_row

from tests.support.data import make_documents, write_delta
from tests.support.runs import job_config, quality_record, summary

NIGHT = dt.datetime(2026, 11, 26, 2, 0, tzinfo=dt.timezone.utc)


def nightly_runs(tmp_path: Path, rows_per_night: list[int], seconds: float = 10.0) -> str:
    """A runs table with one ok run per night (rows as given, same duration) next to ``tmp_path/scores``."""
    config = job_config(tmp_path)
    path = str(tmp_path / "scores_runs")
    for i, rows in enumerate(rows_per_night):
        start = NIGHT + dt.timedelta(days=i)
        write_run_row(path, run_row(
            config=config, run_id=f"r{i}", ds=start.date(), started_at=start, outcome="ok",
            ended_at=start + dt.timedelta(seconds=seconds), summary=summary(f"r{i}", rows=rows, seconds=seconds),
        ))
    return path


def images(page: str) -> list[str]:
    return re.findall(r"<img alt='[^']*' src='data:image/png;base64,([A-Za-z0-9+/=]+)'>", page)


def test_deviations_against_the_median_of_previous_runs() -> None:
    def run(i: int, rows: int, tput: float, flagged: int = 0, outcome: str = "ok") -> dict:
        return {"run_id": f"r{i}", "outcome": outcome, "rows_in": rows, "docs_per_s": tput, "rows_flagged": flagged,
                "error_class": "JobError" if outcome == "failed" else None}

    runs = [run(0, 100, 10), run(1, 100, 10), run(2, 85, 10), run(3, 100, 6), run(4, 100, 10, flagged=20),
            run(5, 0, 0, outcome="failed"), run(6, 100, 10)]
    found = find_deviations(runs)
    assert set(found) == {"r3", "r4", "r5"}  # r2 dropped 15%: under the 20% threshold
    assert "throughput" in found["r3"][0] and "flagged rows 20.0%" in found["r4"][0]
    assert found["r5"] == ["failed: JobError"]
    assert set(find_deviations(runs, Thresholds(rows_drop=0.1))) == {"r2", "r3", "r4", "r5"}
    assert find_deviations(runs[:1] + [run(1, 10, 1)]) == {}  # one run before is not enough to judge


def test_report_cli_history_flags_the_short_night(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = nightly_runs(tmp_path, [1000, 1040, 980, 500])
    out = tmp_path / "report.html"
    # an output table path whose table is elsewhere: its runs table is found beside it
    assert main(["report", str(tmp_path / "scores"), "--history", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"report: {out}" in printed
    assert "flagged run r3: rows in 500 is 50% below the median 1,000" in printed
    page = out.read_text()
    assert len(images(page)) >= 3 + 3  # this run's plots and the three history plots
    assert page.count("<tr class='flagged'>") == 1 and "2026-11-29" in page
    # a run id with --runs reports that run; --fail-on-deviation turns a flagged night into exit 3
    assert main(["report", "r1", "--runs", runs, "--out", str(tmp_path / "r1.html")]) == 0
    assert "run r1 " in (tmp_path / "r1.html").read_text()
    assert main(["report", runs, "--history", "4", "--out", str(out), "--fail-on-deviation"]) == 3
    assert main(["report", runs, "--history", "4", "--out", str(out), "--max-rows-drop", "60",
                 "--max-throughput-drop", "60", "--fail-on-deviation"]) == 0


def test_fail_on_deviation_judges_the_reported_run_not_a_flagged_night_in_its_history(tmp_path: Path) -> None:
    """One short night in the history is listed, but only a flagged reported run fails the scheduler's task."""
    runs = nightly_runs(tmp_path, [1000, 1040, 500, 1000, 1010])  # r2 is flagged, the latest run r4 is not
    out = str(tmp_path / "report.html")
    assert main(["report", runs, "--history", "5", "--out", out, "--fail-on-deviation"]) == 0
    assert main(["report", "r2", "--runs", runs, "--history", "5", "--out", out, "--fail-on-deviation"]) == 3
    assert main(["report", "r3", "--runs", runs, "--history", "5", "--out", out, "--fail-on-deviation"]) == 0


def test_report_errors_name_what_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "some-run-id"]) == 2
    assert "or a run id together with --runs" in capsys.readouterr().err
    runs = nightly_runs(tmp_path, [10])
    assert main(["report", "nope", "--runs", runs]) == 2
    assert "run id 'nope' is not in the runs table" in capsys.readouterr().err


def test_generation_report_has_finish_reasons(tmp_path: Path) -> None:
    row = read_runs(nightly_runs(tmp_path, [10]))[0]
    metrics = json.loads(row["batch_metrics"])
    metrics["finish_reasons"] = {"stop": 7, "length": 3}
    metrics["generation"] = {"prompt_tokens": 100, "completion_tokens": 300, "generate_seconds": 3.0}
    page = render_report({**row, "batch_metrics": json.dumps(metrics)})
    assert "Generation: finish reasons and tokens/s" in page and len(images(page)) == 5


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


# injected before the report's own markup: records load errors, then counts the images that decoded
_CHECK = """<script>
window.__errors = [];
window.addEventListener('error', e => __errors.push(e.message || ('failed to load ' + (e.target.src || '').slice(0, 40))), true);
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const pre = document.createElement('pre'); pre.id = 'sbi-check';
  pre.textContent = JSON.stringify({images: imgs.length, decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
                                    errors: __errors, title: document.title});
  document.body.appendChild(pre);
});
</script>"""


def load_in_chromium(page: Path, tmp_path: Path) -> dict:
    binary = chromium()
    if binary is None:
        pytest.skip("no chromium binary (apt-get install -y chromium; .ci/run installs it)")
    checked = tmp_path / "checked.html"
    checked.write_text(page.read_text().replace("<head>", "<head>" + _CHECK, 1))
    flags = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=10000"]
    dom = subprocess.run([*flags, "--dump-dom", checked.as_uri()], capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="sbi-check">(.*?)</pre>', dom.stdout, re.S)
    assert match, f"chromium did not load the page: rc {dom.returncode}, {dom.stderr[-2000:]}"
    # a screenshot of the unmodified report, to look at (kept in the test's tmp folder)
    subprocess.run([*flags, "--hide-scrollbars", "--window-size=1100,3400", f"--screenshot={tmp_path / 'report.png'}",
                    page.as_uri()], capture_output=True, timeout=120)
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_report_loads_in_headless_chromium(tmp_path: Path) -> None:
    nightly_runs(tmp_path, [1000, 1040, 980, 500])
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "scores"), "--history", "4", "--out", str(out)]) == 0
    result = load_in_chromium(out, tmp_path)
    assert result["errors"] == []
    assert result["decoded"] == result["images"] >= 3
    assert result["title"] == "score_documents run r3"
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_three_nights_in_spark_then_history_flags_the_short_one(spark, tmp_path: Path, tiny_embed_model: Path) -> None:
    """The issue's acceptance run: three ds values through run_job, the third with half the rows."""
    from pipeline.config import build_config
    from pipeline.runner import run_job

    write_delta(tmp_path / "docs", make_documents(120))
    summaries = []
    for ds, limit in (("2026-11-27", 120), ("2026-11-28", 120), ("2026-11-29", 60)):
        config = build_config({
            "job": "score_test",
            "source": {"path": str(tmp_path / "docs"), "id_column": "doc_id", "limit": limit},
            "model": {"path": str(tiny_embed_model), "name": "tiny-bert"},
            "task": {"kind": "embed"}, "batching": {"batch_size": 16},
            "sink": {"path": str(tmp_path / "scores")},
            "run": {"progress": False, "ds": ds, "report_path": str(tmp_path / f"report-{ds}.html")},
        })
        summaries.append(run_job(config, spark=spark, out=io.StringIO()))

    rows = read_runs(str(tmp_path / "scores_runs"))
    assert [r["run_id"] for r in rows] == [s.run_id for s in summaries]  # one row per run
    for row, s in zip(rows, summaries):
        assert row["outcome"] == "ok" and row["ds"].isoformat() == s.ds
        assert (row["rows_in"], row["rows_out"], row["rows_flagged"]) == (s.rows_in, s.rows_out, s.rows_flagged)
        assert json.loads(row["status_counts"]) == s.status and row["delta_version"] == s.delta_version
        assert (row["tokens"], row["batches"], row["model_loads"]) == (s.tokens, s.batches, sum(s.model_loads.values()))
        assert row["spark_master"].startswith("local") and row["spark_app_id"]
        metrics = json.loads(row["batch_metrics"])
        assert sum(b["batches"] for b in metrics["by_length"]) == s.batches  # every batch in the histogram
        assert sum(b["rows"] for b in metrics["by_length"]) == s.rows_in - 2  # null and blank rows skip batching
        assert metrics["timeline"] and metrics["slowest"]
    assert (tmp_path / "report-2026-11-29.html").is_file()  # run.report_path: written by each run

    out = tmp_path / "history.html"
    capture = io.StringIO()
    from contextlib import redirect_stdout

    with redirect_stdout(capture):
        assert main(["report", str(tmp_path / "scores"), "--history", "3", "--out", str(out)]) == 0
    assert f"flagged run {summaries[2].run_id}: rows in 60 is 50% below the median 120" in capture.getvalue()
    page = out.read_text()
    assert all(ds in page for ds in ("2026-11-27", "2026-11-28", "2026-11-29"))
    if chromium():
        result = load_in_chromium(out, tmp_path)
        assert result["errors"] == [] and result["decoded"] == result["images"] >= 3


def test_the_report_plots_the_profile_against_its_history_and_flags_the_drift(tmp_path: Path) -> None:
    row = read_runs(nightly_runs(tmp_path, [10]))[0]
    quality = quality_record("refused")
    page = render_report({**row, "outcome": "refused", "profile": json.dumps(quality["profile"]),
                          "drift": json.dumps(quality["drift"])})
    assert "Output quality: the profile against the job's recent runs" in page
    assert "<span class='failed'>refused</span>" in page and "skipped_empty 0.0% -&gt; 33.3%" in page
    assert "alt='status'" in page and "alt='input_chars'" in page  # one plot per measure, this run against history
    assert len(images(page)) == 4 + 2
    [reason] = find_deviations([{**row, "outcome": "refused", "drift": json.dumps(quality["drift"])}])[row["run_id"]]
    assert reason.startswith("drift (refused): status PSI 1.99 > 0.25: skipped_empty 0.0% -> 33.3%")
