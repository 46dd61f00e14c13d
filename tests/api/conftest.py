"""``run_job``'s rows that the ``score(df)`` tests compare against, built once for the whole run: the reference does
not depend on the session or the writer a test runs on, only on the documents, the model and the task."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.data import CONNECT_MODE
from tests.support.scoring import documents, run_job_rows


def _reference(spark: Any, root: Path, model: Path, n: int, **sections: Any) -> tuple[Path, dict[Any, dict]]:
    """The documents (``n`` of them, as Parquet) and ``run_job``'s rows over them, on the classic session."""
    mode = os.environ.pop(CONNECT_MODE, None)  # a Connect test may have asked first: classic columns here
    try:
        return documents(root, n=n), run_job_rows(spark, root, model, **sections)
    finally:
        if mode is not None:
            os.environ[CONNECT_MODE] = mode


@pytest.fixture(scope="session")
def embed_reference(spark, tiny_embed_model, tmp_path_factory) -> tuple[Path, dict[Any, dict]]:
    """The suite's 40 documents with a null id (:func:`tests.support.scoring.documents`) and the test job's rows."""
    return _reference(spark, tmp_path_factory.mktemp("embed-reference"), tiny_embed_model, 40)


@pytest.fixture(scope="session")
def classify_reference(spark, tiny_classify_model, tmp_path_factory) -> tuple[Path, dict[Any, dict]]:
    """24 of the documents and the classify job's rows."""
    return _reference(spark, tmp_path_factory.mktemp("classify-reference"), tiny_classify_model, 24,
                      task={"kind": "classify"})
