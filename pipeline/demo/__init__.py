"""Demo data: the corpus, pages and photos ``make demo`` and ``make demo-images`` score (a face: it may import
anything below it, and nothing in the pipeline imports it)."""
