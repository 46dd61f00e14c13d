"""The two-tower model: feature encoding, training determinism, the versioned model folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.recs.config import TrainConfig
from pipeline.recs.features import FeatureSpec, IdIndex, infer_feature_spec, pack_lists
from pipeline.recs.model import encode_users
from pipeline.recs.registry import load_two_tower, resolve_two_tower_path, save_two_tower
from pipeline.recs.synthetic import make_synthetic_recs
from pipeline.recs.train import evaluate_two_tower, train_two_tower

TINY = TrainConfig(dim=16, epochs=8, batch_size=128, temperature=0.1, holdout_per_user=2)


@pytest.fixture(scope="module")
def data():
    return make_synthetic_recs(n_users=40, n_items=48, per_user=10, seed=1)


@pytest.fixture(scope="module")
def trained(data):
    return train_two_tower(data, TINY, log=None)


def test_feature_specs_encode_unknown_and_null_as_zero():
    import pandas as pd

    cat = infer_feature_spec("occupation", pd.Series(["b", "a", "b", None]))
    assert cat.vocab == ("a", "b")
    assert cat.encode(["a", "b", "zzz", None]).tolist() == [1, 2, 0, 0]
    age = FeatureSpec("age", "bucket", boundaries=(18.0, 30.0))
    assert age.encode([10, 18, 29, 30, 70, None]).tolist() == [1, 2, 2, 3, 3, 0]
    assert FeatureSpec.from_dict(age.to_dict()) == age


def test_id_index_positions_follow_id_order():
    index = IdIndex.from_values([30, 10, 20, 10])
    assert index.ids.tolist() == [10, 20, 30]
    assert index.positions([20, 99, 10, 5]).tolist() == [1, -1, 0, -1]
    with pytest.raises(ValueError, match="sorted"):
        IdIndex(np.array([3, 1]))


def test_encode_users_caps_history_but_keeps_all_seen(trained):
    spec = trained.model.spec
    known = spec.item_ids.ids[:5].tolist()
    inputs = encode_users(spec, [1, 99999], {"age": [25, None], "gender": ["F", None], "occupation": ["x", "y"]},
                          [known + [123456], None], max_history=3)
    assert inputs.user_idx[0] > 0 and inputs.user_idx[1] == 0  # unknown user -> index 0
    assert np.diff(inputs.seen_offsets).tolist() == [5, 0]  # the unknown item 123456 is dropped
    assert inputs.history.tolist() == spec.item_ids.positions(known[-3:]).tolist()  # latest 3
    assert inputs.truncated.tolist() == [True, False]


def test_training_lowers_loss_and_beats_popularity(data, trained):
    assert trained.epoch_losses[-1] < trained.epoch_losses[0]
    metrics = evaluate_two_tower(trained.model, data, trained.holdout)
    assert metrics["model"]["hit_rate@10"] > metrics["popularity"]["hit_rate@10"]
    assert metrics["model"]["users"] == 40


def test_same_seed_same_revision_and_round_trip(tmp_path, data, trained):
    folder, revision = save_two_tower(trained.model, tmp_path / "two_tower", metrics={"note": "first"})
    again = train_two_tower(data, TINY, log=None)
    folder2, revision2 = save_two_tower(again.model, tmp_path / "two_tower", metrics={"note": "second"})
    assert (folder2, revision2) == (folder, revision)
    assert json.loads((folder / "metrics.json").read_text()) == {"note": "second"}
    assert (tmp_path / "two_tower" / "LATEST").read_text().strip() == revision
    assert resolve_two_tower_path(tmp_path / "two_tower") == folder.resolve()

    loaded, loaded_revision = load_two_tower(tmp_path / "two_tower")
    assert loaded_revision == revision
    with torch.no_grad():
        np.testing.assert_array_equal(loaded.item_vectors().numpy(), trained.model.item_vectors().numpy())

    other = train_two_tower(data, TINY.model_copy(update={"seed": 8}), log=None)
    _, revision3 = save_two_tower(other.model, tmp_path / "two_tower")
    assert revision3 != revision


def test_missing_model_folder_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_recommender"):
        resolve_two_tower_path(tmp_path)


def test_pack_lists_treats_none_as_empty():
    flat, offsets = pack_lists([[1, 2], None, [], [3]])
    assert flat.tolist() == [1, 2, 3] and offsets.tolist() == [0, 2, 2, 2, 3]
