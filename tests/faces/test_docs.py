"""The docs: every block marked runnable runs, the generated pages are current, the README is a front door,
and the site builds strict and opens in a real browser.

A fenced block right after the line ``<!-- runnable -->`` (or ``<!-- runnable: FILE -->``) in README.md or in
docs/ runs here, the blocks of one page in order, in a folder of the page's own that holds what the examples
name: ``data/reviews`` (a Delta table of ``review_id``, ``body``, ``stars``), ``models/my-encoder`` (a tiny
random BERT), ``models/my-classifier`` (the same with a classification head), ``models/my-llm`` (a tiny
random Llama with a chat template), ``models/my-vlm`` (a tiny random LLaVA with its processor) and
``data/photos`` (two images and a file that is not one). By the block's language:

- ``yaml``: written to FILE (``job.yaml`` when none is named) and run as a job (``load_config`` and
  ``run_job`` on the suite's session); its summary must say every row was written once, and its output
  table must hold this run's rows;
- ``bash``: each line is a shell command, with ``sbi`` on the PATH running this checkout; each must exit 0;
- ``python``: executed as written.

Blocks that need a cluster, Databricks or a real model are plainly not marked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from tests.support.data import REPO, SENTENCES, build_tiny_bert, write_delta

MARKER = re.compile(r"^<!-- runnable(?::\s*(?P<file>[\w./-]+))?\s*-->\s*$")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# pages other branches add: README links to them before they land (the lead removes this set at merge)
README_MAX_LINES = 200


def runnable_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """``(language, file, code)`` of every fenced block right after a runnable marker, in order.

    >>> runnable_blocks("<!-- runnable: a.yaml -->\\n```yaml\\njob: x\\n```\\n```bash\\nls\\n```")
    [('yaml', 'a.yaml', 'job: x\\n')]
    """
    lines, blocks = text.splitlines(), []
    for i, line in enumerate(lines):
        match = MARKER.match(line)
        if not match:
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        assert fence.startswith("```"), f"a runnable marker must sit right above a fenced block, not {fence!r}"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        blocks.append((fence[3:].strip(), match.group("file"), "\n".join(lines[i + 2:end]) + "\n"))
    return blocks


RUNNABLE = {page: blocks for page in PAGES if (blocks := runnable_blocks(page.read_text()))}


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the docs' examples name: the reviews table and the three model folders."""
    import pyarrow as pa

    from tests.support.generation_models import save_model_folder

    root = tmp_path_factory.mktemp("docs-examples")
    bodies = [" ".join([SENTENCES[i % len(SENTENCES)]] * (1 + i % 3)) for i in range(12)]
    bodies[5] = None  # a review without text: kept, with status skipped_null
    write_delta(root / "data" / "reviews", pa.table({
        "review_id": pa.array([f"r{i:03d}" for i in range(12)], pa.string()),
        "body": pa.array(bodies, pa.string()),
        "stars": pa.array([1 + i % 5 for i in range(12)], pa.int64()),
    }))
    build_tiny_bert(root / "models" / "my-encoder", kind="embed")
    build_tiny_bert(root / "models" / "my-classifier", kind="classify")
    save_model_folder(root / "models" / "my-llm")
    from tests.support import image_samples
    from tests.support.vision_models import save_vlm_folder

    save_vlm_folder(root / "models" / "my-vlm")  # a tiny LLaVA and its processor
    photos = root / "data" / "photos"
    photos.mkdir()
    (photos / "cup.png").write_bytes(image_samples.png(1))
    (photos / "dog.jpg").write_bytes(image_samples.jpeg(0))
    (photos / "broken.jpg").write_bytes(b"not an image")
    (root / "bin").mkdir()
    sbi = root / "bin" / "sbi"  # the docs' `sbi`, running this checkout with the suite's interpreter
    sbi.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pipeline "$@"\n')
    sbi.chmod(0o755)
    return root


def _run_job(path: Path, spark) -> None:
    import io

    from deltalake import DeltaTable

    from pipeline import load_config, run_job

    config = load_config(str(path), overrides=["run.progress=false"])
    summary = run_job(config, spark=spark, out=io.StringIO())
    assert summary.complete, f"{path.name}: {summary.incomplete}"
    assert summary.rows_in == 12 and summary.rows_out + summary.rows_quarantined == 12
    written = DeltaTable(config.sink.path).to_pyarrow_table()  # a fresh folder per page: this run's rows only
    assert written.num_rows == summary.rows_out and set(written.column("run_id").to_pylist()) == {summary.run_id}


def _run_shell(code: str, cwd: Path, env: dict[str, str]) -> None:
    for line in code.splitlines():
        command = line.split(" #", 1)[0].strip()
        if not command or command.startswith("#"):
            continue
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("page", sorted(RUNNABLE), ids=lambda p: str(p.relative_to(REPO)))
def test_every_runnable_block_runs(page: Path, examples: Path, spark, tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    for name in ("data", "models"):
        (work / name).symlink_to(examples / name)
    monkeypatch.chdir(work)
    env = {**os.environ, "PATH": f"{examples / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    for language, file, code in RUNNABLE[page]:
        if language == "yaml":
            (work / (file or "job.yaml")).write_text(code)
            _run_job(work / (file or "job.yaml"), spark)
        elif language == "bash":
            _run_shell(code, work, env)
        elif language == "python":
            exec(compile(code, f"{page.name} (runnable block)", "exec"), {"__name__": "__docs__"})
        else:
            pytest.fail(f"{page}: a runnable block in {language!r}; yaml, bash and python run")


def test_the_docs_have_runnable_blocks_of_each_kind() -> None:
    """The marker is used (a renamed marker would silently run nothing) and README's job is among them."""
    languages = {language for blocks in RUNNABLE.values() for language, _, _ in blocks}
    assert languages == {"yaml", "bash", "python"}
    assert REPO / "README.md" in RUNNABLE and REPO / "docs" / "getting-started" / "local.md" in RUNNABLE


# ------------------------------------------------------------------ generated pages

def test_the_cli_reference_page_is_generated_from_the_parser() -> None:
    """Fails when an option or its help changes without regenerating docs/reference/cli.md."""
    from pipeline.cli import build_parser
    from pipeline.docs import CLI_BEGIN, CLI_END, cli_reference

    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    block = page.split(CLI_BEGIN, 1)[1].split(CLI_END, 1)[0].strip()
    assert block == cli_reference(build_parser()), (
        "docs/reference/cli.md is stale: run `python -m pipeline config-reference --write docs/reference/cli.md`")
    assert "### `vacuum`" in block and "`--dry-run` | off |" in block


def test_write_refuses_a_file_without_markers_and_a_cli_block_without_the_parser(tmp_path: Path) -> None:
    from pipeline.docs import CLI_BEGIN, CLI_END, write_config_reference

    plain = tmp_path / "plain.md"
    plain.write_text("# nothing generated here\n")
    with pytest.raises(ValueError, match="no generated-reference markers"):
        write_config_reference(plain)
    cli = tmp_path / "cli.md"
    cli.write_text(f"{CLI_BEGIN}\n{CLI_END}\n")
    with pytest.raises(ValueError, match="pass the CLI's parser"):
        write_config_reference(cli)


# ------------------------------------------------------------------ the README

def _slugs(heading: str) -> set[str]:
    """The anchor of a heading as the site (Python-Markdown's toc) and as GitHub make it."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip()
    site = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    site = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", site).strip().lower())
    github = re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text.lower()))
    return {site, github}


def _anchors(page: Path) -> list[set[str]]:
    fenced, anchors = False, []
    for line in page.read_text().splitlines():
        fenced = fenced != line.startswith("```")
        if not fenced and (match := re.match(r"#{1,6}\s+(.*)", line)):
            anchors.append(_slugs(match.group(1)))
    return anchors


def _prose(text: str) -> list[str]:
    """README's paragraphs and list items outside code blocks and the matrix (which the install page owns)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!-- matrix -->.*?<!-- matrix -->", "", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n|\n(?=- )", text) if p.strip()]


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    assert "make demo" in readme and "make test" in readme  # CI's hook looks for both
    assert readme.count("<!-- matrix -->") == 2
    assert 'pip install "spark-batch-inference[' in readme


def test_every_readme_link_resolves_and_every_anchor_is_a_heading_on_both_renderers() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", (REPO / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert len(local) >= 20
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / path
        assert target.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            assert any(anchor in slugs and len(slugs) == 1 for slugs in _anchors(target)), (
                f"README links to {link}: no heading of {path} has that anchor on both the site and GitHub")


MEASURED = re.compile(r"\b\d+(?:[.,]\d+)*(?:-\d+(?:\.\d+)?)?\s?(?:x|s|%|ms|min|GB|MB|docs/s|tokens/s)(?![\w/])"
                      r"|\b0\.\d+")


def test_every_number_in_the_readme_links_to_the_page_that_measured_it() -> None:
    """A measured figure (a ratio, a time, a rate) sits in a sentence that links to a benchmark page."""
    for paragraph in _prose((REPO / "README.md").read_text()):
        for sentence in re.split(r"(?<=[.;:])\s+(?=[A-Z(])", paragraph):
            if MEASURED.search(re.sub(r"`[^`]*`", "", sentence)):
                assert re.search(r"\]\(docs/benchmarks[\w]*\.md", sentence), (
                    f"a measured number without a link to the page that measured it: {sentence!r}")


def test_the_number_check_catches_an_unlinked_figure() -> None:
    assert MEASURED.search("the rerun took 0.67 of a clean run") and MEASURED.search("in 20.5 s")
    assert MEASURED.search("1.8x faster") and not MEASURED.search("Python 3.11 and Java 17")
    assert _slugs("Small jobs run light, against the hand-written job") == {
        "small-jobs-run-light-against-the-hand-written-job"}


# ------------------------------------------------------------------ the site

def _current_site() -> Path | None:
    """``site/`` when `make docs` built it strict (its ``.strict-ok``) after the last change to anything it is built
    from (mkdocs.yml, docs/, the docstrings in pipeline/): CI builds it right before the tests; else None."""
    stamp = REPO / "site" / ".strict-ok"
    if not stamp.is_file():
        return None
    sources = [REPO / "mkdocs.yml", *(REPO / "docs").rglob("*"), *(REPO / "pipeline").rglob("*.py")]
    newest = max(p.stat().st_mtime for p in sources if p.is_file())
    return stamp.parent if stamp.stat().st_mtime > newest else None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict`` into a fresh folder: a warning (a broken link or anchor among them) fails it; or
    the site `make docs` built that way from the files as they are (:func:`_current_site`), not built twice."""
    current = _current_site()
    if current is not None:
        return current
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                           "--site-dir", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return out


def test_the_site_builds_strict_with_every_page_and_the_python_api(site: Path) -> None:
    assert (site / "index.html").is_file() and (site / "getting-started" / "local" / "index.html").is_file()
    api = (site / "reference" / "python" / "index.html").read_text()
    assert 'id="pipeline.run_job"' in api and 'id="pipeline.load_config"' in api  # from the docstrings
    assert "0.88-0.93" in (site / "index.html").read_text()


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.parametrize("page, heading", [("index.html", "Spark batch inference"),
                                           ("getting-started/local/index.html", "On a laptop")])
def test_a_built_page_opens_in_headless_chromium_with_its_heading(site: Path, tmp_path: Path, page: str,
                                                                  heading: str) -> None:
    binary = _chromium()
    if binary is None:
        pytest.skip("no chromium binary (apt-get install -y chromium; .ci/run installs it)")
    # the flags tests/run/test_report.py found to work here
    flags = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=10000"]
    dom = subprocess.run([*flags, "--dump-dom", (site / page).as_uri()], capture_output=True, text=True, timeout=120)
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", dom.stdout, re.S)
    assert h1, f"chromium did not render {page}: rc {dom.returncode}, {dom.stderr[-2000:]}"
    assert re.sub(r"<[^>]+>", "", h1.group(1)).strip().rstrip("¶").strip() == heading
    assert "md-nav" in dom.stdout  # the theme's navigation rendered around it
    subprocess.run([*flags, "--hide-scrollbars", "--window-size=1200,900", f"--screenshot={tmp_path / 'page.png'}",
                    (site / page).as_uri()], capture_output=True, timeout=120)
