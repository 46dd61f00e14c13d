"""Small synthetic recs data with real structure, for tests, benchmarks and demos.

Users fall into taste groups; each group prefers its own block of items
(which share a genre), with some overlap on a few globally popular items.
A model that learns the groups beats popularity by a wide margin, so a test
on this data can fail when training is broken. Same schemas as
:mod:`pipeline.recs.data`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pipeline.recs.data import RecsData

__all__ = ["make_synthetic_recs"]

_OCCUPATIONS = ("artist", "engineer", "student", "writer", "doctor")


def make_synthetic_recs(
    n_users: int = 60,
    n_items: int = 80,
    *,
    groups: int = 4,
    per_user: int = 12,
    popular: int = 4,
    seed: int = 0,
) -> RecsData:
    """``n_users`` users each with ``per_user`` distinct interactions, ids starting at 1.

    About 80% of a user's items come from their group's block, the rest
    from the ``popular`` items every group likes. Timestamps are distinct
    within a user, so hold-out splits are unambiguous.
    """
    if n_items < groups * 2 or per_user < 2:
        raise ValueError(f"need n_items >= 2 * groups and per_user >= 2, got {n_items}, {groups}, {per_user}")
    rng = np.random.default_rng(seed)
    user_group = np.arange(n_users) % groups
    item_group = np.arange(n_items) % groups
    popular_items = np.arange(popular)
    genres = [f"g{g}" for g in range(groups)]

    rows = []
    base = pd.Timestamp("2026-01-01", tz="UTC")
    for u in range(n_users):
        own = np.flatnonzero((item_group == user_group[u]) & (np.arange(n_items) >= popular))
        n_pop = min(popular, max(1, per_user // 5))
        n_own = min(per_user - n_pop, own.size)
        picks = np.concatenate([rng.choice(own, n_own, replace=False),
                                rng.choice(popular_items, n_pop, replace=False)])
        rng.shuffle(picks)
        times = base + pd.to_timedelta(np.sort(rng.choice(10_000_000, picks.size, replace=False)), unit="s")
        for item, ts in zip(picks, times):
            rows.append((u + 1, int(item) + 1, float(rng.integers(1, 6)), ts))
    interactions = pd.DataFrame(rows, columns=["user_id", "item_id", "rating", "timestamp"])
    interactions = interactions.astype({"user_id": np.int64, "item_id": np.int64, "rating": np.float32})
    interactions["timestamp"] = interactions["timestamp"].astype("datetime64[us, UTC]")

    users = pd.DataFrame({
        "user_id": np.arange(1, n_users + 1, dtype=np.int64),
        "age": (18 + 10 * user_group + rng.integers(0, 8, n_users)).astype(np.int32),
        "gender": rng.choice(["F", "M"], n_users),
        "occupation": [_OCCUPATIONS[g % len(_OCCUPATIONS)] for g in user_group],
        "zip_code": [f"{10000 + u:05d}" for u in range(n_users)],
    })
    items = pd.DataFrame({
        "item_id": np.arange(1, n_items + 1, dtype=np.int64),
        "title": [f"Item {i + 1}" for i in range(n_items)],
        "year": pd.array(1980 + rng.integers(0, 40, n_items), dtype="Int32"),
        "genres": [[genres[g]] for g in item_group],
    })
    return RecsData(users=users, items=items, interactions=interactions)
