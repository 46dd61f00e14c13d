"""Fitting the two-tower model on interactions, and evaluating it against popularity.

Every training interaction ``(user, item)`` is one example: the user tower
sees the user's id, features and training history (minus the target item),
and the loss is a softmax of the target against the catalog
(:class:`pipeline.recs.config.TrainConfig` ``loss``):

- ``full``: all items are negatives except the user's other training items
  (they are positives too, and scoring excludes them anyway, so pushing
  them down would only waste capacity). Exact, and cheap for catalogs up to
  ~100k items since the item tower is one small MLP over the catalog;
- ``in_batch``: the batch's other targets are the negatives, with the logQ
  correction (subtract log item frequency) so popular items are not
  over-penalised; for catalogs too big to score per step.

Deterministic for a given seed on CPU: seeded init and shuffling, and a
fixed thread count while training (restored afterwards).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from pipeline.recs.config import TrainConfig
from pipeline.recs.data import RecsData, read_recs_tables
from pipeline.recs.evaluate import Holdout, popularity_top_k, ranking_metrics, seen_lists, split_holdout, summarize
from pipeline.recs.features import FeatureSpec, IdIndex, infer_feature_spec
from pipeline.recs.model import TwoTower, TwoTowerSpec, UserInputs, encode_users
from pipeline.recs.registry import save_two_tower
from pipeline.recs.scoring import item_matrix, recommend_users, seen_coordinates

__all__ = ["TrainResult", "build_two_tower", "evaluate_two_tower", "train_and_save", "train_two_tower", "user_features"]

DEFAULT_FEATURES = ("age", "gender", "occupation")


@dataclass
class TrainResult:
    """The fitted model, its hold-out split, per-epoch mean loss and wall time."""

    model: TwoTower
    holdout: Holdout
    epoch_losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    examples: int = 0


def user_features(users: pd.DataFrame, user_ids: np.ndarray, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """The feature columns of ``users`` aligned to ``user_ids`` (missing users get nulls)."""
    missing = [c for c in columns if c not in users.columns]
    if missing:
        raise KeyError(f"users table has no column(s) {missing}; it has {list(users.columns)}")
    aligned = users.drop_duplicates("user_id").set_index("user_id").reindex(user_ids)
    return {c: aligned[c].to_numpy(dtype=object) for c in columns}


def build_two_tower(data: RecsData, train: pd.DataFrame, config: TrainConfig,
                    feature_columns: Sequence[str] = DEFAULT_FEATURES) -> TwoTower:
    """A freshly initialised model whose vocabularies are fitted on ``data`` and ``train``.

    The catalog is every item in the items table (items nobody has rated yet
    can still be recommended on genres and year); users are the users table
    plus anyone in the interactions.
    """
    items = data.items.sort_values("item_id")
    item_ids = IdIndex.from_values(items["item_id"].to_numpy())
    user_ids = IdIndex.from_values(np.concatenate([data.users["user_id"].to_numpy(), train["user_id"].to_numpy()]))
    genres = sorted({g for gs in items["genres"] for g in (gs if gs is not None else [])})
    genre_pos = {g: i for i, g in enumerate(genres)}
    multi_hot = np.zeros((len(item_ids), len(genres)), dtype=np.float32)
    for row, gs in enumerate(items["genres"]):
        for g in (gs if gs is not None else []):
            multi_hot[row, genre_pos[g]] = 1.0
    year = infer_feature_spec("year", items["year"].astype("float64"), buckets=12)
    specs: list[FeatureSpec] = [infer_feature_spec(c, data.users[c]) for c in feature_columns]
    spec = TwoTowerSpec(
        user_ids=user_ids, item_ids=item_ids, user_features=tuple(specs), genres=tuple(genres), year=year,
        dim=config.dim, temperature=config.temperature, extra={"train": config.model_dump()},
    )
    torch.manual_seed(config.seed)
    return TwoTower(spec, item_genres=multi_hot, item_years=year.encode(items["year"].to_numpy(dtype=object)))


def _encode(model: TwoTower, data: RecsData, interactions: pd.DataFrame, user_ids: np.ndarray,
            max_history: int) -> UserInputs:
    names = [f.name for f in model.spec.user_features]
    return encode_users(model.spec, user_ids, user_features(data.users, user_ids, names),
                        seen_lists(interactions, user_ids), max_history=max_history)


def train_two_tower(
    data: RecsData,
    config: TrainConfig = TrainConfig(),
    *,
    feature_columns: Sequence[str] = DEFAULT_FEATURES,
    log: Callable[[str], None] | None = print,
) -> TrainResult:
    """Split off each user's latest ``holdout_per_user`` interactions and fit a model on the rest."""
    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        holdout = split_holdout(data.interactions, config.holdout_per_user)
        model = build_two_tower(data, holdout.train, config, feature_columns)
        losses = _fit(model, data, holdout.train, config, log)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return TrainResult(model, holdout, losses, time.perf_counter() - started, len(holdout.train))


def _fit(model: TwoTower, data: RecsData, train: pd.DataFrame, config: TrainConfig,
         log: Callable[[str], None] | None) -> list[float]:
    spec = model.spec
    user_ids = np.sort(train["user_id"].unique())
    inputs = _encode(model, data, train, user_ids, config.max_history)
    # One example per training interaction, in the (user, time) order of seen_lists.
    lengths = np.diff(inputs.seen_offsets)
    ex_user = np.repeat(np.arange(user_ids.size), lengths)
    ex_item = inputs.seen
    from_end = np.concatenate([np.arange(n)[::-1] for n in lengths]) if lengths.size else np.empty(0, np.int64)
    # The target is in the user's history only if it is among the latest max_history items.
    ex_exclude = np.where(from_end < config.max_history, ex_item, -1)
    log_q = torch.from_numpy(np.log(np.bincount(ex_item, minlength=len(spec.item_ids)) + 1.0).astype(np.float32))

    rng = np.random.default_rng(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    steps = -(-ex_item.size // config.batch_size) * config.epochs
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=config.lr, total_steps=max(steps, 1),
                                                   pct_start=0.1)
    model.train()
    epoch_losses: list[float] = []
    for epoch in range(config.epochs):
        order = rng.permutation(ex_item.size)
        total, batches = 0.0, 0
        for start in range(0, order.size, config.batch_size):
            batch = order[start : start + config.batch_size]
            rows = ex_user[batch]
            users = model.user_vectors(*inputs.tensors(rows, "cpu"), exclude=torch.from_numpy(ex_exclude[batch]))
            users = users / config.temperature  # scale [B, dim], not the [B, n_items] logits
            target = torch.from_numpy(ex_item[batch])
            items = model.item_vectors()
            if config.loss == "full":
                logits = users @ items.T
                other_positives = torch.zeros(logits.shape, dtype=torch.bool)
                row_of, cols = seen_coordinates(inputs.seen, inputs.seen_offsets, rows)
                other_positives[torch.from_numpy(row_of), torch.from_numpy(cols)] = True
                other_positives[torch.arange(batch.size), target] = False
                logits = logits.masked_fill(other_positives, float("-inf"))
                labels = target
            else:
                logits = users @ items[target].T - log_q[target].unsqueeze(0)
                same = target.unsqueeze(0) == target.unsqueeze(1)
                logits = logits.masked_fill(same & ~torch.eye(batch.size, dtype=torch.bool), float("-inf"))
                labels = torch.arange(batch.size)
            loss = torch.nn.functional.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total, batches = total + loss.item(), batches + 1
        epoch_losses.append(total / max(batches, 1))
        if log is not None:
            log(f"epoch {epoch + 1}/{config.epochs}: loss {epoch_losses[-1]:.4f}")
    return epoch_losses


def evaluate_two_tower(model: TwoTower, data: RecsData, holdout: Holdout, *, k: int = 10,
                       batch_size: int = 256, max_history: int = 200) -> dict[str, Any]:
    """HitRate@k / Recall@k of the model and of popularity on the held-out interactions.

    Both rank the full catalog for each user with a hold-out, excluding the
    items the user interacted with in the training part.
    """
    users = holdout.users
    if users.size == 0:
        raise ValueError("nothing is held out (holdout_per_user is 0); evaluation needs a hold-out")
    relevant_by_user = {u: g.to_numpy(dtype=np.int64) for u, g in holdout.test.groupby("user_id")["item_id"]}
    relevant = [relevant_by_user[int(u)] for u in users]
    inputs = _encode(model, data, holdout.train, users, max_history)
    model.eval()
    positions, _ = recommend_users(model, item_matrix(model), inputs, k=k, batch_size=batch_size)
    recommended = np.where(positions >= 0, model.spec.item_ids.ids[np.maximum(positions, 0)], -1)
    baseline = popularity_top_k(holdout.train, model.spec.item_ids, users, k=k)
    return summarize(ranking_metrics(recommended, relevant, k=k), ranking_metrics(baseline, relevant, k=k), k=k)


def train_and_save(
    warehouse: str | Path,
    model_root: str | Path,
    config: TrainConfig = TrainConfig(),
    *,
    refit_full: bool = False,
    feature_columns: Sequence[str] = DEFAULT_FEATURES,
    log: Callable[[str], None] | None = print,
) -> dict[str, Any]:
    """Read the recs tables, train, evaluate against popularity, save a model revision; returns a summary.

    With ``refit_full`` the saved model is refitted on all interactions after
    the evaluated fit (what a nightly refresh should serve); the recorded
    metrics are those of the held-out fit.
    """
    data = read_recs_tables(warehouse)
    result = train_two_tower(data, config, feature_columns=feature_columns, log=log)
    metrics: dict[str, Any] = {"train_seconds": round(result.seconds, 2), "examples": result.examples,
                               "epoch_losses": [round(x, 4) for x in result.epoch_losses]}
    if config.holdout_per_user > 0:
        metrics["holdout"] = evaluate_two_tower(result.model, data, result.holdout, max_history=config.max_history)
    model = result.model
    if refit_full:
        full = train_two_tower(data, config.model_copy(update={"holdout_per_user": 0}),
                               feature_columns=feature_columns, log=log)
        model = full.model
        metrics.update(refit_full=True, refit_seconds=round(full.seconds, 2))
    folder, revision = save_two_tower(model, model_root, metrics=metrics)
    return {"model_path": str(folder), "revision": revision, **metrics}
