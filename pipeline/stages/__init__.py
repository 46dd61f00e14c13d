"""The stages of one run, each a module that takes the run's frozen values and returns a typed outcome.

``pipeline.runner.run_job`` calls them in order (docs/architecture.md, "One row, from the source table
to its Delta commit"):

1. :mod:`~pipeline.stages.prepare`: the checks that fail in seconds, the session (:class:`~pipeline.stages.outcomes.Prepared`);
2. :mod:`~pipeline.stages.identify`: the run's identity, with :class:`~pipeline.stages.outcomes.AlreadyCommitted` for a retry whose commit landed;
3. :mod:`~pipeline.stages.planning`: the rows to score and the frozen :class:`~pipeline.stages.outcomes.RunPlan`
   (effective sink, commit keys, versions read, tasks, staging), with :mod:`~pipeline.stages.inputs` and
   :mod:`~pipeline.stages.scoring`;
4. :mod:`~pipeline.stages.commit`: inference, the checks before any commit, the quarantine and output
   commits (:class:`~pipeline.stages.outcomes.Committed` or :class:`~pipeline.stages.outcomes.AlreadyCommitted`);
5. :mod:`~pipeline.stages.verify`: both tables read back at the versions committed;
6. :mod:`~pipeline.stages.summary`: the run's summary.
"""
