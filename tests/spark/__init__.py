"""The Spark glue: sessions, jars, reachability, planning, progress, worker metrics, scheduling, threads, clusters."""
