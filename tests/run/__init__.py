"""Whole runs: the runner end to end, the runs table, commits, overwrites, failures, retries, resume, guarantees."""
