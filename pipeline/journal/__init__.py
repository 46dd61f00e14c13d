"""The run's journal on disk (its staging folder): each finished task's rows, and each answer a served model gave,
kept as they happen, so a rerun of a killed run resumes. (Not :mod:`pipeline.stages`: those are the steps of a run.)

A nightly run commits once, at the end. Without staging a driver killed at 90%
throws away every finished task. With it, each inference task writes its
output rows to ``<root>/<plan key>/`` as it ends, and a rerun of the same run
reuses them instead of scoring those rows again; the commit is still one, at
the end, keyed on the rows. The root is ``<sink path>_staging`` beside the
output table (like its ``_quarantine`` and ``_runs`` tables), so the table's
folder holds nothing but the table. A row a served model answered costs money
the moment it arrives, so the endpoint backend also journals each answer in
the plan folder as it comes, and no retry or rerun pays for it twice.

The modules, ground up (plain values in: paths, keys, ids; no Spark):

- :mod:`~pipeline.journal.layout`: where a run's root is and the names of what staging writes;
- :mod:`~pipeline.journal.plans`: a plan folder (:class:`~pipeline.journal.plans.StagePlan`, named by its
  plan key), which tasks it holds, and why an earlier try's is not reused;
- :mod:`~pipeline.journal.tasks`: the worker side, one task's staged rows and the digest of its input;
- :mod:`~pipeline.journal.request_log`: the endpoint backend's journal of answers and its token ledger;
- :mod:`~pipeline.journal.sweep`: what in a root is ours (the pre-flight's refusal of one that is not), and
  removing only that, after the commit or when stale.
"""
