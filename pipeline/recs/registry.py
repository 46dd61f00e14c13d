"""The versioned two-tower model folder: save, find (``LATEST``), fingerprint, load.

Layout::

    <root>/LATEST                      # the newest revision's name
    <root>/<revision>/model.safetensors  # weights and item feature buffers
    <root>/<revision>/config.json      # dimensions, feature specs, training options
    <root>/<revision>/id_maps.json     # raw user and item ids, sorted (position = id order)
    <root>/<revision>/metrics.json     # evaluation and timings (not part of the revision)

The revision is a sha256 over the first three files, so identical weights get
the same revision wherever they are saved. Finding and fingerprinting a folder
imports nothing heavy (the Spark driver does it before any work); torch is
imported only to save or load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.recs.model import TwoTower

__all__ = ["LATEST_FILE", "load_two_tower", "resolve_two_tower_path", "save_two_tower", "two_tower_revision"]

LATEST_FILE = "LATEST"
_HASHED = ("config.json", "id_maps.json", "model.safetensors")


def two_tower_revision(folder: str | Path) -> str:
    """sha256 (16 hex digits) over the weights, config and id maps: what scored a row, for lineage."""
    digest = hashlib.sha256()
    for name in _HASHED:
        digest.update(name.encode())
        digest.update((Path(folder) / name).read_bytes())
    return digest.hexdigest()[:16]


def save_two_tower(model: "TwoTower", root: str | Path, *, metrics: dict[str, Any] | None = None) -> tuple[Path, str]:
    """Save into ``root/<revision>/`` and point ``root/LATEST`` at it; returns ``(folder, revision)``.

    The folder is written to a temporary sibling and renamed, so a reader
    never sees a half-written model; saving identical weights again reuses
    the existing folder. ``metrics`` go to ``metrics.json``, outside the
    revision hash (they may carry timings).
    """
    from safetensors.torch import save_file

    from pipeline.recs.model import FORMAT

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": FORMAT})
        (tmp / "config.json").write_text(json.dumps(model.spec.config_dict(), indent=1, sort_keys=True))
        ids = {"user_ids": model.spec.user_ids.ids.tolist(), "item_ids": model.spec.item_ids.ids.tolist()}
        (tmp / "id_maps.json").write_text(json.dumps(ids))
        (tmp / "metrics.json").write_text(json.dumps(metrics or {}, indent=1, sort_keys=True, default=str))
        revision = two_tower_revision(tmp)
        folder = root / revision
        if folder.exists():
            shutil.copyfile(tmp / "metrics.json", folder / "metrics.json")
        else:
            os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pointer = root / f".{LATEST_FILE}.tmp"
    pointer.write_text(revision + "\n")
    os.replace(pointer, root / LATEST_FILE)
    return folder, revision


def resolve_two_tower_path(path: str | Path) -> Path:
    """A model folder: ``path`` itself, or ``path/<revision in path/LATEST>`` for a model root."""
    path = Path(path).expanduser()
    if (path / LATEST_FILE).is_file():
        path = path / (path / LATEST_FILE).read_text().strip()
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{path} is not a two-tower model folder (config.json + model.safetensors) nor a model root with a "
            f"{LATEST_FILE} file; train one first: python jobs/train_recommender.py"
        )
    return path.resolve()


def load_two_tower(path: str | Path, *, device: str = "cpu") -> tuple["TwoTower", str]:
    """``(model in eval mode on device, revision)`` from a model folder or model root."""
    import numpy as np
    from safetensors.torch import load_file

    from pipeline.recs.features import FeatureSpec, IdIndex
    from pipeline.recs.model import FORMAT, TwoTower, TwoTowerSpec

    folder = resolve_two_tower_path(path)
    config = json.loads((folder / "config.json").read_text())
    if config.get("format") != FORMAT:
        raise ValueError(f"{folder}/config.json has format {config.get('format')!r}; this code reads {FORMAT!r}")
    ids = json.loads((folder / "id_maps.json").read_text())
    known = {"format", "dim", "temperature", "n_users", "n_items", "user_features", "genres", "year"}
    spec = TwoTowerSpec(
        user_ids=IdIndex(np.asarray(ids["user_ids"], dtype=np.int64)),
        item_ids=IdIndex(np.asarray(ids["item_ids"], dtype=np.int64)),
        user_features=tuple(FeatureSpec.from_dict(f) for f in config["user_features"]),
        genres=tuple(config["genres"]), year=FeatureSpec.from_dict(config["year"]),
        dim=int(config["dim"]), temperature=float(config["temperature"]),
        extra={k: v for k, v in config.items() if k not in known},
    )
    state = load_file(str(folder / "model.safetensors"))
    model = TwoTower(spec, item_genres=np.zeros((len(spec.item_ids), len(spec.genres)), np.float32),
                     item_years=np.zeros(len(spec.item_ids), np.int64))
    model.load_state_dict(state)
    model.eval().to(device)
    return model, two_tower_revision(folder)
