"""Delta tables: what a write does (its target, plan and options), doing it (the connector or the
deltalake-backed data source), reading a table's history, and the markers and sweep a crashed write leaves."""
