"""The nightly refresh behind the drift gate: each night a two-tower model retrained on that day's interactions.

Two normal nights (other interactions of the same synthetic world, a model retrained on each) pass; a night whose
model was trained on a corrupted day (every interaction's item shuffled to another user) is refused before its
commit: what the lists hold moved (the items recommended, the overlap with the night before), and neither the
dated table nor the latest table changes.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from deltalake import DeltaTable

from pipeline import run_job
from pipeline.config import build_config
from pipeline.core.drift import Verdict
from pipeline.errors import DriftRefused
from pipeline.recs.config import TrainConfig
from pipeline.recs.data import RecsData, write_recs_tables
from pipeline.recs.registry import save_two_tower
from pipeline.recs.synthetic import make_synthetic_recs
from pipeline.recs.train import train_two_tower

USERS, ITEMS, K = 200, 60, 5


def _day(root, seed: int, *, corrupt: bool = False) -> None:
    """That day's tables, and the model retrained on its interactions (the new LATEST revision)."""
    data = make_synthetic_recs(n_users=USERS, n_items=ITEMS, per_user=10, seed=seed)
    if corrupt:  # a broken upstream day: every interaction's item belongs to someone else's history
        shuffled = data.interactions.copy()
        shuffled["item_id"] = np.random.default_rng(seed).permutation(shuffled["item_id"].to_numpy())
        data = RecsData(users=data.users, items=data.items, interactions=shuffled)
    write_recs_tables(data, root / "recs")
    result = train_two_tower(data, TrainConfig(dim=16, epochs=3, batch_size=128, holdout_per_user=0), log=None)
    save_two_tower(result.model, root / "models" / "two_tower")


def _config(root, ds: str, run_id: str):
    return build_config({
        "job": "refresh_recommendations",
        "source": {"format": "delta", "path": str(root / "recs/users"), "id_column": "user_id"},
        "model": {"path": str(root / "models/two_tower")},
        "task": {"kind": "recommend", "k": K, "batch_size": 64, "interactions": str(root / "recs/interactions"),
                 "latest_path": str(root / "out/latest")},
        "sink": {"path": str(root / "out/recommendations"), "mode": "overwrite_partition", "partition_by": ["ds"]},
        "run": {"progress": False, "ds": ds, "run_id": run_id, "quality": {"on_drift": "refuse"}},
    })


def _verdict(summary) -> Verdict:
    verdict = Verdict.from_dict(summary.quality["drift"])
    for finding in verdict.findings:  # the measured statistics, for the record (pytest -s shows them)
        print(f"{summary.run_id}: {'FLAGGED ' if finding.flagged else ''}{finding.line()}")
    return verdict


@pytest.mark.slow  # three nights of the refresh, three small models trained: 15 s on a shared 2-core machine
def test_a_model_trained_on_a_corrupted_day_is_refused(spark, tmp_path):
    out = io.StringIO()
    _day(tmp_path, seed=3)
    first = run_job(_config(tmp_path, "2026-11-01", "r1"), spark=spark, out=out)
    assert _verdict(first).note and first.rows_out == USERS * K

    _day(tmp_path, seed=4)
    second = _verdict(run_job(_config(tmp_path, "2026-11-02", "r2"), spark=spark, out=out))
    assert second.action == "passed" and not second.flagged and second.history == ("r1",)
    assert {"items", "status", "topk_fill"} <= {f.measure for f in second.findings}
    # a retrain rescales the cosines: the scores are shown, never gated
    scores = [f for f in second.findings if f.measure in ("score", "top_score")]
    assert {f.measure for f in scores} == {"score", "top_score"}, "the scores are shown"
    assert all(f.ignored for f in scores), "and never gated"

    _day(tmp_path, seed=5, corrupt=True)
    dated, latest = DeltaTable(str(tmp_path / "out/recommendations")), DeltaTable(str(tmp_path / "out/latest"))
    versions = dated.version(), latest.version()
    with pytest.raises(DriftRefused) as refused:
        run_job(_config(tmp_path, "2026-11-03", "r3"), spark=spark, out=out)
    verdict = Verdict.from_dict(refused.value.quality["drift"])
    for finding in verdict.findings:
        print(f"r3: {'FLAGGED ' if finding.flagged else ''}{finding.line()}")
    moved = {f.measure for f in verdict.flagged}
    assert {"items", "topk_overlap"} <= moved and verdict.history == ("r1", "r2")
    assert "items: PSI" in str(refused.value) and "topk_overlap: mean drop" in str(refused.value)
    assert (DeltaTable(str(tmp_path / "out/recommendations")).version(),
            DeltaTable(str(tmp_path / "out/latest")).version()) == versions
