"""Recommendations: MovieLens data, the model, scoring, the task and the nightly refresh."""
