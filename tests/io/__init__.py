"""Sources and Delta sinks: reading, write plans, both writers, object stores, what a run may delete, shared tables."""
