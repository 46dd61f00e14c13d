"""Spark glue: the session, and the Arrow UDF that runs a task on the executors."""
