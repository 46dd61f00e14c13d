"""The drift gate end to end, on a real tiny encoder: every run profiles its output on the executors and is
compared with the job's recent runs before its commit.

Two normal nights (other rows of the same corpus) pass; the encoder folder's weights swapped for the same
tensors shuffled (same architecture, same tokenizer) are refused before the commit, the output table at the
same version, the scored rows staged; the same command with ``--accept-drift`` publishes them without scoring
again and becomes the new normal; an upstream change that empties a third of the texts is flagged.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from pipeline.cli import main
from pipeline.core.drift import Verdict
from pipeline.runner import run_job
from pipeline.records.runs import read_runs
from pipeline.journal.plans import staged_tasks

from tests.support.data import make_corpus, shuffle_weights, write_delta
from tests.support.jobs import job_config

ROWS, TASKS = 240, 2
POISON = {"poison_marker": "POISON"}


def _config(tmp_path: Path, model: Path, ds: str, run_id: str, **run):
    quality = run.pop("quality", {"on_drift": "refuse"})
    return job_config(tmp_path, model, source={"repartition": TASKS},
                      sink={"mode": "overwrite_partition", "partition_by": ["ds"]},
                      run={"ds": ds, "run_id": run_id, "quality": quality, **run})


def _night(tmp_path: Path, *, poison: int | None = None, **corpus) -> str | None:
    """That night's source; ``poison``: that row's text fails its batch every time (quarantined, status error):
    its id is returned."""
    table = make_corpus(ROWS, **corpus)
    if poison is not None:
        texts = table["text"].to_pylist()
        texts[poison] = f"a {POISON['poison_marker']} review"
        table = table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
    write_delta(tmp_path / "docs", table, mode="overwrite")
    return None if poison is None else table["doc_id"][poison].as_py()


def _job_file(tmp_path: Path, config) -> Path:
    """``config`` as the YAML file `python -m pipeline run --conf` reads."""
    path = tmp_path / f"{config.run.run_id}.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True)))
    return path


def _verdict(summary) -> Verdict:
    verdict = Verdict.from_dict(summary.quality["drift"])
    for finding in verdict.findings:  # the measured statistics, for the record (pytest -s shows them)
        print(f"{summary.run_id}: {'FLAGGED ' if finding.flagged else ''}{finding.line()}")
    return verdict


@pytest.mark.slow  # five runs of a tiny encoder: 45 s on a shared 2-core machine
def test_a_swapped_encoder_is_refused_then_accepted_and_emptied_texts_are_flagged(spark, tiny_embed_model, tmp_path,
                                                                                  capsys):
    model = Path(shutil.copytree(tiny_embed_model, tmp_path / "encoder"))
    out = io.StringIO()
    _night(tmp_path, seed=1)
    first = run_job(_config(tmp_path, model, "2026-11-01", "n1"), spark=spark, out=out)
    assert _verdict(first).note.startswith("the first run of score_test") and first.quality["profile"]["cat"]

    _night(tmp_path, seed=2, start=ROWS)
    second = _verdict(run_job(_config(tmp_path, model, "2026-11-02", "n2"), spark=spark, out=out))
    assert second.action == "passed" and second.history == ("n1",) and not second.flagged
    assert {"status", "input_chars", "tokens", "label", "score", "embedding"} <= {f.measure for f in second.findings}

    # the wrong checkpoint, same architecture, dropped into the model folder, on a night with a row that fails
    # (quarantined once published): `python -m pipeline run` exits 3 and commits nothing, the quarantine included
    shuffle_weights(model)
    poisoned = _night(tmp_path, seed=3, start=2 * ROWS, poison=7)
    scores, quarantine = str(tmp_path / "scores"), tmp_path / "scores_quarantine"
    version = DeltaTable(scores).version()
    assert not quarantine.exists(), "the normal nights quarantined nothing"
    night3 = _job_file(tmp_path, _config(tmp_path, model, "2026-11-03", "n3", faults=POISON))
    assert main(["run", "--conf", str(night3)]) == 3, "the drift gate's refusal is exit status 3"
    refused = capsys.readouterr().err
    assert "embedding: centroid shift" in refused and "Nothing was committed" in refused, refused
    assert "--accept-drift" in refused
    assert DeltaTable(scores).version() == version, "the refused night published nothing"
    assert not quarantine.exists(), "the gate comes before the quarantine commit too"
    plans = [p for p in (tmp_path / "scores_staging").iterdir() if p.is_dir()]
    assert sum(len(staged_tasks(str(p))) for p in plans) == TASKS, "the scored rows stay staged"
    refused_row = {r["run_id"]: r for r in read_runs(str(tmp_path / "scores_runs"))}["n3"]
    assert refused_row["outcome"] == "refused" and json.loads(refused_row["drift"])["action"] == "refused"
    assert json.loads(refused_row["profile"])["vec"]["embedding"]["n"] == ROWS - 1

    assert main(["run", "--conf", str(night3), "--run-id", "n3b", "--accept-drift"]) == 0
    accepted = {r["run_id"]: r for r in read_runs(str(tmp_path / "scores_runs"))}["n3b"]
    summary = json.loads(accepted["summary_json"])
    assert summary["rows_reused"] == ROWS and summary["rows_scored"] == 0 and summary["resumed_tasks"] == TASKS
    assert not accepted["model_loads"], "published from staging: no model loaded, nothing scored again"
    assert json.loads(accepted["drift"])["action"] == "accepted" and accepted["delta_version"] == version + 1
    day3 = DeltaTable(scores).to_pyarrow_table(filters=[("ds", "=", dt.date(2026, 11, 3))])
    assert day3.num_rows == ROWS - 1 and set(day3["run_id"].to_pylist()) == {"n3b"}
    failed = DeltaTable(str(quarantine)).to_pyarrow_table().to_pylist()
    assert [(r["doc_id"], r["status"], r["run_id"]) for r in failed] == [(poisoned, "error", "n3b")]

    # the accepted night is the new normal: the same encoder on a night with a third of its texts empty
    _night(tmp_path, seed=4, start=3 * ROWS, empty_share=1 / 3)
    fourth = run_job(_config(tmp_path, model, "2026-11-04", "n4", quality={"on_drift": "warn"}), spark=spark, out=out)
    verdict = _verdict(fourth)
    assert verdict.action == "warned" and verdict.history == ("n3b",)
    moved = {f.measure for f in verdict.flagged}
    assert "status" in moved and "embedding" not in moved and fourth.delta_version == version + 2
    assert "drift                   : status: PSI" in fourth.render()
    outcomes = [(r["run_id"], r["outcome"]) for r in read_runs(str(tmp_path / "scores_runs"))]
    assert outcomes == [("n1", "ok"), ("n2", "ok"), ("n3", "refused"), ("n3b", "ok"), ("n4", "ok")]
