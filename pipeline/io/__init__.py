"""Table I/O: the only package that reads sources and writes sinks."""
