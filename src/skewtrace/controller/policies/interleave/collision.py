"""Whether units of several jobs collide now, as opposed to phases that only look like it.

Each job's phases are measured from its own step start. Where the ranks report when their
steps start (``step_age`` with each poll, placed on the controller's clock) and the jobs'
step times are within 5% of each other, :func:`aligned_overlap` lays the phases on that one
time line: free-running jobs that took turns by themselves do not overlap there. Phases that
span compute (a DDP all-reduce through backward) overlap there whether or not their transfers
do, so once a schedule has held the jobs in their turns for a whole window (how long each
unit's phases lasted then: :func:`busy`), :func:`dilation` says how much longer they last
now: jobs that stay in their turns are not a collision.

Why, and what showed it: docs/pacing.md, "Interleaving: why the schedule is built this way".
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from skewtrace.controller.policies.interleave.placement import total_overlap
from skewtrace.controller.policies.interleave.units import Unit, share_uplink

# Jobs whose step times differ by more than this fraction drift through each other's phases:
# where their phases lie relative to each other now says nothing about the next steps.
_SAME_STEP = 0.05


def aligned_overlap(crossing: Sequence[Unit]) -> float | None:
    """The phase overlap per step, in seconds, of units of different jobs that share an
    uplink, with each job's phases placed on the controller's clock by its reported step
    start (its steps repeating every step time): what collides now, as opposed to what would
    if the jobs' steps started together (:func:`~.placement.place`). None when it cannot be
    told: a job that has not reported a step start or a step time, or jobs whose step times
    differ by more than 5% (their phases drift through each other)."""
    if len({u.job for u in crossing}) < 2:
        return None
    if any(u.step_start <= 0 or u.step_s <= 0 for u in crossing):
        return None
    steps = [u.step_s for u in crossing]
    if max(steps) > min(steps) * (1 + _SAME_STEP):
        return None
    period = statistics.median(steps)
    reference = max(u.step_start for u in crossing)
    # Each unit's step start as an offset into the common period.
    at = [(u.step_start - reference) % period for u in crossing]
    total = 0.0
    for i, a in enumerate(crossing):
        for j in range(i):
            b = crossing[j]
            if a.job == b.job or not share_uplink(a, b):
                continue
            theirs = [(start + at[j], duration) for start, duration in b.observed]
            total += total_overlap(a.observed, at[i], theirs, period)
    return total


def busy(unit: Unit) -> float:
    """The unit's phases as observed, summed."""
    return sum(duration for _, duration in unit.observed)


def dilation(
    crossing: Sequence[Unit], turn_busy: Mapping[tuple[str, tuple[str, ...]], float]
) -> float | None:
    """How much longer the units' phases last now than in their turns under a schedule (the
    largest ratio over the units); None when a unit's phases in its turns were not seen."""
    ratios = []
    for unit in crossing:
        reference = turn_busy.get((unit.job, unit.pgs), 0.0)
        if reference <= 0:
            return None
        ratios.append(busy(unit) / reference)
    return max(ratios, default=None)
