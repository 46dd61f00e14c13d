"""Tasks: encoders' batches, tokenising, extraction and served endpoints."""
