"""Spark glue: the session (classic or Connect), the Arrow UDF that runs a task on the executors,
task planning, the driver's progress line and the run metrics gathered from the data."""
