"""The interleave policy's decision: offsets for groups of one job, a schedule for groups of
several, or a reason for neither.

Its decision, on the body:

- groups of this job only: ``offsets``, ``{pg: seconds}`` (:func:`~.placement.place`). A rank
  holds the largest offset of its groups before every step's forward, where it applies its
  delay; the job's own step keeps its groups in lockstep, so a shift made this way holds
  from step to step. Offsets are placed anew at every decision, and kept unchanged only
  while the window still holds steps from before they were published (its phases mix two
  placements);
- groups of several jobs (the window's ``fabric``): a **schedule**
  (:mod:`~.schedule`), its turns placed by :func:`~.placement.spread` and its period
  searched by :mod:`~.period_search`, one step of the search per decision while the
  schedule is in force. While it is, the observed phases include the holds, so the turns are
  placed again only from a window without one (the effect guard's phases without it), at the
  period the search had got to.

No schedule is placed where the units do not collide now (:mod:`~.collision`): on the
controller's clock their phases overlap by less than ``interleave_min_overlap_s``
(``no_collision`` with ``aligned_overlap_s``); once a schedule has held the jobs in their
turns, no unit's phases last ``interleave_collision_dilation`` longer than they did then
(``no_collision`` with ``dilation``: the effect guard's experiment then ends without a
verdict); before any schedule has held them, the jobs' steps fell by that much below the
steps that asked for it while it was not in force (``no_collision`` with ``asked_step_s`` and
``free_step_s``), and from then on a collision is steps that much longer than the shortest
seen since.

Only the units that share an uplink with this job's, directly or through other units, are
placed together; jobs behind other uplinks are left out of its schedule. ``active`` while any
offset above 0 is set, or a schedule (a slot at 0 holds its ranks too). Reasons:
``no_phases``, ``no_collision``, ``interleaving``, ``regrouping`` (the groups under a schedule
changed: none for a window, then placed again). The effect guard runs per job: two jobs'
guards may withhold their schedules at different times (their phases start when each job's
decision first publishes one), which the measurement then includes. A schedule's outcome is
``searching`` until the period's search is done: the guard judges the period found, not the
way down to it.

Why each rule, and what showed it: docs/pacing.md, "Interleaving: why the schedule is built
this way".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from skewtrace.controller.policies import effect
from skewtrace.controller.policies.base import Outcome
from skewtrace.controller.policies.interleave.collision import aligned_overlap, busy, dilation
from skewtrace.controller.policies.interleave.params import (
    RESOLUTION_S,
    InterleaveParams,
    round_period,
)
from skewtrace.controller.policies.interleave.period_search import (
    Action,
    Steps,
    advance,
    kept_up,
    search_done,
)
from skewtrace.controller.policies.interleave.placement import (
    alone_durations,
    natural_step,
    place,
    spread,
)
from skewtrace.controller.policies.interleave.schedule import InterleaveState, Schedule
from skewtrace.controller.policies.interleave.units import Unit, colliding_with, units
from skewtrace.controller.window import JobWindow

REASON_NO_PHASES = "no_phases"
"""No group with phases on the spine is known (the Collector sends none yet)."""
REASON_NO_COLLISION = "no_collision"
"""Groups' phases do not overlap on a shared uplink, or no offset within the bound helps."""
REASON_REGROUPING = "regrouping"
"""The groups a schedule in force concerns changed (a job came or went): no schedule for a
window, then placed again from phases without holds."""
REASON_INTERLEAVING = "interleaving"
"""Offsets or a schedule published."""

SCHEDULE = effect.SCHEDULE
"""The body's field for a schedule (:class:`~.schedule.Schedule`)."""


class InterleavePolicy:
    """The interleave policy behind the service's policy interface; see the module docstring."""

    name = "interleave"

    def __init__(self, params: InterleaveParams) -> None:
        self.params = params

    def initial_state(self) -> InterleaveState:
        return InterleaveState()

    def decide(self, window: JobWindow, previous: InterleaveState) -> Outcome:
        found = units((*window.groups, *window.fabric))
        own = [u for u in found if u.crosses and u.job == window.job]
        if not own:
            return Outcome(reason=REASON_NO_PHASES, state=InterleaveState(), info={"offsets": {}})
        crossing = colliding_with(found, window.job)
        if any(u.job != window.job for u in crossing):
            return self._schedule(window, previous, crossing)
        return self._offsets(window, previous, crossing)

    def _offsets(
        self, window: JobWindow, previous: InterleaveState, crossing: Sequence[Unit]
    ) -> Outcome:
        """Groups of this job only collide: offsets (see the module docstring)."""
        settling = [
            u
            for u in crossing
            if u.job == window.job
            and any(
                abs(u.applied_offset_s - previous.offsets.get(pg, 0.0)) > RESOLUTION_S
                for pg in u.pgs
            )
        ]
        if settling and previous.offsets:
            # Part of the window is from before the offsets published: its phases mix two
            # placements. Keep them until the window holds only steps under them.
            return Outcome(
                reason=REASON_INTERLEAVING,
                state=previous,
                active=True,
                info={"offsets": dict(previous.offsets), "interleave": {"units": len(crossing)}},
            )
        offsets, before, after = place(crossing, self.params)
        published = {
            pg: offset
            for (job, pg), offset in sorted(offsets.items())
            if offset > 0 and job == window.job
        }
        info = {
            "offsets": published,
            "interleave": {
                "units": len(crossing),
                "overlap_s": round(before, 4),
                "overlap_after_s": round(after, 4),
            },
        }
        reason = REASON_INTERLEAVING if published else REASON_NO_COLLISION
        return Outcome(
            reason=reason,
            state=InterleaveState(published),
            active=bool(published),
            info=info,
        )

    def _schedule(
        self, window: JobWindow, previous: InterleaveState, crossing: Sequence[Unit]
    ) -> Outcome:
        """Groups of several jobs collide: a schedule (see the module docstring)."""
        keys = {(u.job, pg) for u in crossing for pg in u.pgs}
        kept = previous.schedule
        slowest = max(u.step_s for u in crossing)
        if kept is not None and window.scheduled > 0:
            if set(kept.turns) != keys:
                # The groups changed under a schedule in force (a job came or went): no
                # schedule for a window, so that the next one is placed from phases without
                # holds.
                return _unscheduled(REASON_REGROUPING, InterleaveState(schedule=kept), crossing)
            return self._searched(window, kept, crossing, slowest)
        if min(u.step_s for u in crossing) <= 0:
            # A job whose step time is not known yet: no period to agree on.
            return _unscheduled(REASON_NO_COLLISION, InterleaveState(), crossing)
        return self._placed(window, kept, crossing, keys, slowest)

    def _searched(
        self, window: JobWindow, kept: Schedule, crossing: Sequence[Unit], slowest: float
    ) -> Outcome:
        """The schedule in force, after one step of its period's search."""
        steps = Steps(now=window.now, slowest_s=slowest, scheduled=window.scheduled)
        schedule, action = advance(kept, steps, self.params)
        if action is not Action.WAIT and kept_up(kept.period_s, slowest):
            # A whole window of steps that kept up with the period: the phases as long as they
            # last in their turns.
            schedule = replace(schedule, turn_busy={(u.job, u.pgs): busy(u) for u in crossing})
        return self._scheduled(window, schedule, len(crossing), None, slowest)

    def _placed(
        self,
        window: JobWindow,
        kept: Schedule | None,
        crossing: Sequence[Unit],
        keys: set[tuple[str, str]],
        slowest: float,
    ) -> Outcome:
        """No schedule in force: one placed where the units collide now (at the period its
        search had got to, where one was placed for these groups before)."""
        params = self.params
        aligned = aligned_overlap(crossing)
        dilated = dilation(crossing, kept.turn_busy) if kept is not None else None
        apart = self._apart(kept, crossing, keys, slowest, aligned, dilated)
        if apart is not None:
            return apart
        alone = alone_durations(crossing)
        natural = max(natural_step(u, a) for u, a in zip(crossing, alone, strict=True))
        # Start from the steps as they are (a job loses at most the margin while the period
        # comes down) and search down toward the estimate without the collision.
        period = round_period(slowest * (1.0 + params.interleave_period_margin))
        _, before, after = place(crossing, params, period)
        if before - after < params.interleave_min_overlap_s:
            return _unscheduled(
                REASON_NO_COLLISION,
                InterleaveState(schedule=kept),
                crossing,
                overlap_s=round(before, 4),
                overlap_after_s=round(after, 4),
            )
        schedule = Schedule(
            period,
            spread(crossing, alone),
            floor_s=round_period(natural),
            since=window.now,
            natural_s=round_period(natural),
            busy_s=sum(max(duration for _, duration in phases) for phases in alone),
            asked_s=slowest,
        )
        if kept is not None and set(kept.turns) == keys:
            schedule = _placed_again(kept, schedule)
        figures = {"overlap_s": before, "overlap_after_s": after}
        if aligned is not None:
            figures["aligned_overlap_s"] = aligned
        if dilated is not None:
            figures["dilation"] = dilated
        return self._scheduled(window, schedule, len(crossing), figures, slowest)

    def _apart(
        self,
        kept: Schedule | None,
        crossing: Sequence[Unit],
        keys: set[tuple[str, str]],
        slowest: float,
        aligned: float | None,
        dilated: float | None,
    ) -> Outcome | None:
        """``no_collision``, with the figures that told, where the units do not collide now
        (see the module docstring); None where they may."""
        params = self.params
        if aligned is not None and aligned < params.interleave_min_overlap_s:
            # On the controller's clock the jobs' phases do not meet now (they took turns by
            # themselves): a schedule would only hold them.
            return _unscheduled(
                REASON_NO_COLLISION,
                InterleaveState(schedule=kept),
                crossing,
                aligned_overlap_s=round(aligned, 4),
            )
        if dilated is not None and dilated < 1 + params.interleave_collision_dilation:
            # The phases last as long as they did in their turns under the schedule: the jobs
            # are still in them (phases that span compute overlap whether or not their
            # transfers do), and a schedule would only hold them.
            return _unscheduled(
                REASON_NO_COLLISION,
                InterleaveState(schedule=kept),
                crossing,
                dilation=round(dilated, 4),
                **({"aligned_overlap_s": round(aligned, 4)} if aligned is not None else {}),
            )
        if kept is not None and not kept.turn_busy and set(kept.turns) == keys:
            # No turns seen yet, but a collision asked for this schedule, which is not in
            # force (the effect guard withholds it first): steps that fell by the collision's
            # dilation since then, or that stay within it of the shortest seen since, are the
            # jobs in turns they found by themselves (free-running jobs on the emulated
            # fabric do within seconds), and a schedule would only hold them and search
            # (docs/pacing.md, "Interleaving: why the schedule is built this way").
            bar = 1 + params.interleave_collision_dilation
            left = (
                slowest * bar <= kept.asked_s if kept.free_s <= 0 else slowest < kept.free_s * bar
            )
            if left:
                free = min(kept.free_s, slowest) if kept.free_s > 0 else slowest
                return _unscheduled(
                    REASON_NO_COLLISION,
                    InterleaveState(schedule=replace(kept, free_s=free)),
                    crossing,
                    asked_step_s=round(kept.asked_s, 6),
                    free_step_s=round(free, 6),
                    slowest_step_s=round(slowest, 6),
                )
        return None

    def _scheduled(
        self,
        window: JobWindow,
        schedule: Schedule,
        units_count: int,
        figures: Mapping[str, float] | None,
        slowest: float,
    ) -> Outcome:
        interleave: dict[str, object] = {
            "units": units_count,
            "jobs": sorted({job for job, _ in schedule.turns}),
            "floor_s": round(schedule.floor_s, 6),
            "slowest_step_s": round(slowest, 6),
        }
        if schedule.failed_trials:
            interleave["failed_trials"] = schedule.failed_trials
        if schedule.halvings:
            interleave["trial_step_halvings"] = schedule.halvings
        for name, seconds in (figures or {}).items():
            interleave[name] = round(seconds, 4)
        return Outcome(
            reason=REASON_INTERLEAVING,
            state=InterleaveState(schedule=schedule),
            active=True,
            # The period still comes down: the effect guard judges the period found.
            searching=not search_done(self.params, schedule.halvings),
            info={
                "offsets": {},
                SCHEDULE: {
                    "period_s": round(schedule.period_s, 6),
                    "slots": schedule.for_job(window.job),
                    "late_s": schedule.late_s,
                },
                "interleave": interleave,
            },
        )


def _placed_again(kept: Schedule, placed: Schedule) -> Schedule:
    """A schedule placed again after a spell without it (the effect guard's phase without the
    schedule): the turns anew, the period where its search had got to, or, where the steps
    are shorter now, the margin above them (not below the floor): jobs that moved into their
    turns by themselves while it was withheld are not slowed to the collided steps that first
    asked for it, only kept from drifting back. The search's state carries over; what is new
    is the turns, their start and busy time, and no failure or outgrowing measured yet
    (docs/pacing.md, "Interleaving: why the schedule is built this way")."""
    current = round_period(max(placed.period_s, kept.floor_s))
    restart = current < kept.period_s
    return replace(
        kept,
        turns=placed.turns,
        since=placed.since,
        busy_s=placed.busy_s,
        failed_s=0.0,
        outgrown_at=0.0,
        period_s=current if restart else kept.period_s,
        kept_up_s=0.0 if restart else kept.kept_up_s,
    )


def _unscheduled(
    reason: str, state: InterleaveState, crossing: Sequence[Unit], **figures: float
) -> Outcome:
    """A decision without a schedule or offsets for units of several jobs, saying why (with
    the overlap figures that told)."""
    return Outcome(
        reason=reason,
        state=state,
        info={"offsets": {}, "interleave": {"units": len(crossing), **figures}},
    )
