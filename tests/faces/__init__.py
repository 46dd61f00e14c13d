"""What users touch: the demos, notebooks, the install, the benchmarks' own checks."""
