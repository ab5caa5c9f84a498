"""A schedule for groups of several jobs, and what one decision hands to the next.

Jobs do not step together, and a one-time shift drifts away within tens of steps, so for
groups of several jobs the policy publishes a schedule,
``{"period_s": P, "slots": {pg: seconds}, "late_s": L}``: a rank of a listed group holds
before its forward until the controller's clock reaches its slot modulo ``P`` (its clock
offset to the controller estimated from its polls), and not at all when the slot passed at
most ``L`` ago (:attr:`Schedule.late_s`). A step later than that waits for its next slot: run
at once, its phase would overlap the next unit's turn, that job's next step would start late
too, and the collision would carry on from step to step. Every job's decision is computed from
the same units, in one order (natural start, then job id), so they agree on ``P`` and the
slots.

A :class:`Schedule` is the period's search (:class:`~.period_search.PeriodSearch`, which it
extends, so that the search's transitions take and give back schedules) with the units' turns
around the period (``turns``, ``busy_s``) and what was seen of the collision that asked for it
(``turn_busy``, ``asked_s``, ``free_s``).

Why each rule, and what showed it: docs/pacing.md, "Interleaving: why the schedule is built
this way".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field

from skewtrace.controller.policies.interleave.period_search import PeriodSearch

# A step this late for its slot (a fraction of the period) runs at once whatever its turn's
# slack: steps that keep up with a period vary by a few percent of it, where collided steps
# outgrow it by 15-25%; with less, steps that kept up skipped slots for their own jitter.
_LATE_FLOOR = 0.1


@dataclass(frozen=True)
class Schedule(PeriodSearch):
    """A schedule for groups of several jobs: its period and the period's search
    (:class:`~.period_search.PeriodSearch`), the turns, and the collision seen; see the
    module docstring."""

    # The turns.
    turns: Mapping[tuple[str, str], tuple[float, float]]
    """By (job, group name), every scheduled group of every job: (where its unit's turn
    starts, as a fraction of the period; the natural start of the unit's longest phase)."""
    _: KW_ONLY
    busy_s: float = 0.0
    """The units' longest phases alone, summed: what their turns share of the period."""

    # The collision seen.
    turn_busy: Mapping[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)
    """By (job, the unit's groups): how long each unit's phases lasted in their turns, summed,
    over the last whole window of steps that kept up with the period (empty: not seen yet).
    Without the schedule, phases no longer than that (``interleave_collision_dilation``) are
    jobs that stayed in their turns, not a collision."""
    asked_s: float = 0.0
    """The slowest job's step time when the collision first asked for this schedule."""
    free_s: float = 0.0
    """Before the turns are known (``turn_busy`` empty): the shortest step seen since the jobs
    left that collision by themselves without the schedule, their steps at least
    ``interleave_collision_dilation`` below ``asked_s`` (0: not seen). A collision is then
    steps that much longer than these."""

    @property
    def late_s(self) -> float:
        """How late after its slot a step still runs at once (the body's ``late_s``): the
        least slack of a turn, its share of the period less its phase (the phase of a step
        that late still ends within its turn), at least ``_LATE_FLOOR`` of the period (a
        step's own jitter), at most half of it. A later step waits for its next slot: run
        at once, its phase would overlap the next unit's and both jobs' next steps would
        start late."""
        starts = sorted({turn for turn, _ in self.turns.values()})
        shares = [end - start for start, end in zip(starts, [*starts[1:], 1.0], strict=True)]
        slack = min(shares, default=0.0) * (self.period_s - self.busy_s)
        return round(min(max(slack, _LATE_FLOOR * self.period_s), self.period_s / 2), 6)

    @property
    def slots(self) -> dict[tuple[str, str], float]:
        """Each group's slot for this period: its unit's longest phase starts at its turn,
        the first turn's slot at 0."""
        period = self.period_s
        raw = {key: (turn * period - start) % period for key, (turn, start) in self.turns.items()}
        first = raw[min(self.turns, key=lambda key: (self.turns[key][0], key))]
        return {key: round((slot - first) % period, 6) % period for key, slot in raw.items()}

    def for_job(self, job: str) -> dict[str, float]:
        return {pg: slot for (owner, pg), slot in sorted(self.slots.items()) if owner == job}


@dataclass(frozen=True)
class InterleaveState:
    """What one decision hands to the next: the offsets published, and the schedule."""

    offsets: Mapping[str, float] = field(default_factory=dict)
    schedule: Schedule | None = None
