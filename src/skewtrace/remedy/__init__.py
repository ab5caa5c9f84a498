"""Remedies for the imbalances the Collector's verdicts name, as pure functions (no torch, no I/O).

- :mod:`~skewtrace.remedy.work_split`: a ``data_imbalance`` (work that varies with each
  sample's length): the cost of a sample from its tokens, fitted online, and a deterministic
  split of a global batch into parts of equal work.
- :mod:`~skewtrace.remedy.partition`: a ``stage_imbalance`` (a pipeline stage that holds more
  layers' work than the others): the partition of the layers into contiguous stages that
  minimizes the slowest stage, and a 1F1B replay that prices it.

The rank side (:mod:`skewtrace.rank.work_balance`), the CLI (``skewtrace advise``) and the
benchmarks use the same functions, so every rank computes the same split and the advice is the
one the simulator measured. See ``docs/rebalancing.md``.
"""
