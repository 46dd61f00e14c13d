"""The news-length corpus shipped in the gensim wheel's test data (pipeline/demo/news.py)."""

from __future__ import annotations

import pytest

from pipeline.demo import news
from pipeline.errors import DemoDataError


def test_news_articles_are_the_350_lee_corpus_articles():
    articles = news.news_articles()
    assert len(articles) == 350 and articles["doc_id"].is_unique
    assert set(articles["source"]) == {"news"} and articles["label"].isna().all()
    lengths = articles["text"].str.len()
    assert lengths.min() >= 250 and lengths.median() > 800 and lengths.max() > 3000
    assert articles["text"].iloc[0].startswith("Hundreds of people have been forced to vacate their homes")


def test_news_and_reviews_mixes_repeated_articles_with_distinct_reviews(monkeypatch):
    import pandas as pd

    from pipeline.demo import text

    fake = pd.DataFrame({"category": ["fresh", "rotten", "plot"] * 400, "text": [f"review {i}" for i in range(1200)]})
    monkeypatch.setattr(text, "rotten_tomatoes_reviews", lambda wheel_dir: fake)
    rows = news.news_and_reviews(1000, news_share=0.5)
    assert len(rows) == 1000 and rows["doc_id"].is_unique
    assert rows["source"].value_counts().to_dict() == {"news": 500, "rotten_tomatoes": 500}
    assert rows[rows["source"] == "news"]["doc_id"].str.contains("#1").sum() == 150  # 350 + 150 repeated
    assert set(rows[rows["source"] == "rotten_tomatoes"]["label"]) == {"fresh", "rotten"}
    assert rows["doc_id"].tolist() == news.news_and_reviews(1000, news_share=0.5)["doc_id"].tolist()
    with pytest.raises(DemoDataError, match="review rows asked for"):
        news.news_and_reviews(2000, news_share=0.1)


def test_a_missing_gensim_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(news.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DemoDataError, match="pip install --no-deps gensim==4.3.3"):
        news.news_articles()


def test_long_documents_are_news_articles_and_convention_speeches():
    speeches = news.convention_speeches()
    assert len(speeches) == 249 and speeches["doc_id"].is_unique and set(speeches["source"]) == {"speech"}
    assert set(speeches["label"]) >= {"democrat", "republican"}
    assert speeches["text"].str.len().median() > 3000, "several kB each"
    docs = news.long_documents(1500)
    assert len(docs) == 1500 and docs["doc_id"].is_unique
    assert docs["source"].value_counts().to_dict().keys() == {"news", "speech"}
    assert (docs["text"].str.len() > 3000).mean() > 0.15
    assert docs["doc_id"].tolist() == news.long_documents(1500)["doc_id"].tolist(), "the same rows every time"
