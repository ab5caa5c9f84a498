"""The interleave policy (``--policy interleave``): offsets for process groups whose
communication phases collide on a shared uplink, so that the phases interleave.

Why: two groups whose transfers run at the same time over an uplink that carries one of them
at full rate each take twice as long (processor sharing); shifted by one phase's length they
each take it once. A group that starts its step later pays the offset on its own path, so an
offset pays only where the phase it takes out of the collision is exposed (not hidden behind
compute) and more than the offset itself, e.g. a group with a gather before forward and an
all-reduce after backward. Whether it pays is measured: the registry wraps the policy in the
effect guard (:mod:`~skewtrace.controller.policies.effect`), which keeps offsets only while the
job's step time shows a real gain.

The model, pure (no I/O, no clock, no randomness), from the window's
:class:`~skewtrace.controller.window.GroupPhases`:

- **units**: groups that share a host are tied (a delay before one rank's forward holds the
  host's other ranks at their tensor-parallel collective) and get one offset; a unit's phases
  are its groups' phases, its switches theirs. Units whose members sit behind one switch
  cross no uplink and are left alone. A group over every host of its job (the world's loss
  or gradient-norm all-reduce that keeps a job's halves in one step) ties nothing where the
  job's other groups form two or more units that cross the spine without it: every rank
  waits for it whatever the offsets, so no offset moves it, and tying through it would make
  the halves one unit with nothing to interleave (``examples/train_ddp.py --sets 2``: two
  sets' gathers and all-reduces on one uplink every step). It is left out of the placement
  then; a job whose only crossing group is its world (plain DDP) keeps it. Where such a
  group's phase starts before a unit's (a loss all-reduce after the optimizer, at the next
  step's start), the job's ranks wait there for the most held unit: every unit's phases then
  start as late after its own step start whatever its offset, and they are read on the
  time line after that wait (earlier by the most held unit's offset less its own);
- **alone**: a phase's duration without the collision, estimated as its observed duration over
  the number of units whose observed phases overlap it on a shared switch (itself included):
  exact for equal units that overlap entirely on an uplink that carries one unit at full rate;
- **placement**: units in order of their first phase as it starts now (its natural start,
  the observed start minus the offset it was given, plus that offset: units that start
  together but for noise keep their order, the one holding its offset), the first at 0;
  each next one at the offset in ``[0, max_offset]``, among 0 and the ends of placed
  phases, that leaves the least overlap (alone durations, natural starts) with the placed
  units on a shared switch, the smallest within ``interleave_min_overlap_s`` of the least
  (the unit pays its offset on its own path), and 0 unless it takes at least
  ``interleave_min_overlap_s`` of overlap away. The placement is made anew at every
  decision: offsets kept while about as good locked in a bad one (2026-12-07, --layout sets:
  116 ms for 107 s, placed from a window that mixed two placements, the steps 8% slower).

Its decision, on the body:

- groups of this job only: ``offsets``, ``{pg: seconds}``. A rank holds the largest offset of
  its groups before every step's forward, where it applies its delay; the job's own step
  keeps its groups in lockstep, so a shift made this way holds from step to step;
- groups of several jobs (the window's ``fabric``): the jobs do not step together, and a
  one-time shift drifts away within tens of steps (``benchmarks/collision.py``), so the
  policy publishes a **schedule**: ``{"period_s": P, "slots": {pg: seconds}, "late_s": L}``.
  A rank of a listed group holds before its forward until the controller's clock reaches its
  slot modulo ``P`` (its clock offset to the controller estimated from its polls), and not at
  all when the slot passed at most ``L`` ago: the least slack of a turn (its share of the
  period less its unit's longest phase alone), at least 10% of the period (``_LATE_FLOOR``:
  a step's own jitter), at most half. A step later than that waits for its next slot: run
  at once, its phase would overlap the next unit's turn, that job's next step would start
  late too, and the collision would carry on from step to step (seen with ranks of body
  version 2, which run a step late by up to half a period at once). Every job's decision is
  computed from the same units, in one order (natural start, then job id), so they agree on
  ``P`` and the slots. ``P`` starts at the slowest job's step time as observed times
  ``1 + interleave_period_margin`` (a job loses at most the margin before the schedule
  pays) and is searched down: while every job's steps keep up with it (their step time
  within 2% of ``P``: each waits for its slot) it is shortened by
  ``interleave_period_step`` once per ``interleave_settle_s``, never below the floor (the
  slowest job's step time without the collision as estimated: observed step minus what
  sharing the uplink added to its phases). When a job's steps outgrow a
  shorter period on trial, the jobs fell out of their turns and collided, and their steps
  measure the collision, not the period they need: the period goes back to the last one they
  kept up with, and the floor to that one. When they outgrow a period they had kept up with
  (the jobs or the machine slowed) and still do a settle time later (a stall of the machine
  that made a few steps skip their slots is out of the window by then), it is lengthened one
  step (to the steps plus the margin when they outgrew it by more), and the floor rises
  above it for ten settle times; a floor raised by a failed trial holds 2, 4, 8, then 10
  settle times as trials fail in a row (the count starts again when one passes), and the
  period gone back to is not judged outgrown while it holds (the window still shows the
  collision). Each failed trial halves the next one's step, so the search narrows on the
  shortest period kept up with, until a trial passes below the shortest one that failed
  (that failure was the jobs still moving into their turns: the full step again); when the
  step would be under ``_MIN_TRIAL_STEP`` the search is done and the period holds
  ``_SEARCH_DONE_SETTLES`` settle times, then the search starts again. A failed trial's
  collision that outlasts its hold (steps longer than the period never fall back into
  their turns) lengthens the period to the collided steps plus the margin, from where it
  comes back halfway each settle time to the shortest period kept up with; a step back that
  fails within a full step of that one gives it up (the one kept up with now is the
  shortest known, and the search narrows as after a failed trial). The units take
  turns around the period (:func:`spread`): each a share in proportion to its longest phase
  alone, a group's slot its unit's turn minus that phase's natural start, so the phases
  keep their spacing at any period. While a schedule is in force the observed phases
  include the holds, so the turns are placed again only from a window without one (the
  effect guard's phases without it), at the period the search had got to.

Each job's phases are measured from its own step start. Where the ranks report when their
steps start (``step_age`` with each poll, placed on the controller's clock) and the jobs'
step times are within 5% of each other, :func:`aligned_overlap` lays the phases on that one
time line, and no schedule is placed unless they overlap there by at least
``interleave_min_overlap_s`` (free-running jobs that took turns by themselves are left
alone); otherwise the phases are placed as if the jobs' steps started together. Phases that
span compute (a DDP all-reduce through backward) overlap there whether or not their transfers
do, so once a schedule has held the jobs in their turns for a whole window (``turn_busy``: how
long each unit's phases lasted then), a window without it is a collision only where some
unit's phases last at least ``interleave_collision_dilation`` longer (``no_collision`` with
``dilation`` otherwise): jobs that stay in their turns are left alone, and the effect guard's
experiment ends without a verdict when its withheld phase ends so. Before any schedule has
held them, the step times tell instead: jobs whose steps fell by that much below the steps
that asked for the schedule, while it was not in force, left the collision by themselves
(``no_collision`` with ``asked_step_s`` and ``free_step_s``), and from then on a collision is
steps that much longer than the shortest seen since.

Only the units that share an uplink with this job's, directly or through other units, are
placed together; jobs behind other uplinks are left out of its schedule. ``active`` while any
offset above 0 is set, or a schedule (a slot at 0 holds its ranks too). Reasons:
``no_phases``, ``no_collision``, ``interleaving``, ``regrouping`` (the groups under a schedule
changed: none for a window, then placed again). The effect guard runs per job: two jobs'
guards may withhold their schedules at different times (their phases start when each job's
decision first publishes one), which the measurement then includes. A schedule's outcome is
``searching`` until the period's search is done: the guard judges the period found, not the
way down to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from skewtrace.controller.policies import effect
from skewtrace.controller.policies.base import Outcome
from skewtrace.controller.policies.interleave.collision import aligned_overlap, busy, dilation
from skewtrace.controller.policies.interleave.params import (
    RESOLUTION_S,
    InterleaveParams,
    round_period,
)
from skewtrace.controller.policies.interleave.placement import (
    alone_durations,
    natural_step,
    place,
    spread,
)
from skewtrace.controller.policies.interleave.units import (
    Unit,
    colliding_with,
    units,
)
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
"""The body's field for a schedule (:class:`Schedule`)."""


@dataclass(frozen=True)
class Schedule:
    """A schedule for groups of several jobs: see the module docstring."""

    period_s: float
    turns: Mapping[tuple[str, str], tuple[float, float]]
    """By (job, group name), every scheduled group of every job: (where its unit's turn
    starts, as a fraction of the period; the natural start of the unit's longest phase)."""
    floor_s: float = 0.0
    """The period is not searched below this: the slowest job's step without the collision
    as estimated, raised to a period its steps were seen to outgrow."""
    since: float = 0.0
    """When the period was last set (the window's time)."""
    natural_s: float = 0.0
    """The slowest job's step time without the collision, as estimated when placed."""
    floor_until: float = 0.0
    """A floor raised above a period the steps outgrew holds until then."""
    kept_up_s: float = 0.0
    """While this period is a trial of a shorter one: the period before it, which the steps
    kept up with (0: the period is not a trial)."""
    failed_trials: int = 0
    """Trials of a shorter period that failed since one last passed: the floor after a
    failure holds 2, 4, 8, then ``_FLOOR_SETTLES`` settle times."""
    halvings: int = 0
    """Failed trials since the search began: each halves the step of the next trial (the
    search narrows on the shortest period the steps keep up with instead of trying the same
    failing one again); once the step is below ``_MIN_TRIAL_STEP`` the search is done and the
    floor holds ``_SEARCH_DONE_SETTLES`` settle times, after which it starts again."""
    best_s: float = 0.0
    """The shortest period the steps were seen to keep up with in this search (0: none yet).
    Above it (a collision that outlasted a failed trial's hold lengthened the period), the
    period comes back toward it fast, halfway each settle time; trials below it narrow."""
    busy_s: float = 0.0
    """The units' longest phases alone, summed: what their turns share of the period."""
    failed_s: float = 0.0
    """The shortest period whose trial failed and narrowed this search (0: none). A trial
    that passes below it shows that failure was the jobs still moving into their turns, not
    the period: the search's step is the full one again."""
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
    outgrown_at: float = 0.0
    """When the steps were first seen to outgrow this period, which they had kept up with (0:
    they do not now). It is lengthened only if they still do a settle time later: a burst of
    skipped slots (a stall of the machine) is out of the window by then."""

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

    def rescaled(self, period_s: float, now: float) -> Schedule:
        """The schedule with another period: every unit keeps its turn (its share of the
        period), so the phases keep taking turns."""
        return replace(self, period_s=period_s, since=now, kept_up_s=0.0)

    def for_job(self, job: str) -> dict[str, float]:
        return {pg: slot for (owner, pg), slot in sorted(self.slots.items()) if owner == job}


@dataclass(frozen=True)
class InterleaveState:
    """What one decision hands to the next: the offsets published, and the schedule."""

    offsets: Mapping[str, float] = field(default_factory=dict)
    schedule: Schedule | None = None


# A window this much under a schedule shows steps of the schedule only.
_WHOLE_WINDOW = 0.99
# Steps within this fraction over the period wait for their slots (they keep up with it).
_LOCKED = 0.02
# A step this late for its slot (a fraction of the period) runs at once whatever its turn's
# slack: steps that keep up with a period vary by a few percent of it (168-180 ms at 173 ms
# in benchmarks/collision.py, whose DDP all-reduce spans backward, so a turn's slack there
# is 0), where collided steps outgrow it by 15-25%. With 2% instead, a step in 40 to 80
# waited a whole period, and every trial of a shorter period failed (its steps averaged
# above it).
_LATE_FLOOR = 0.1
# A floor raised above a period the steps outgrew holds this many settle times (a busy spell
# of the machine is not the period's fault for ever); after a failed trial, 2, 4, 8 and then
# this many, as trials keep failing.
_FLOOR_SETTLES = 10


# A search whose next trial would be shorter by less than this (of the period) is done.
_MIN_TRIAL_STEP = 0.01
# A done search holds the period this many settle times, then searches again from the full
# step (the jobs or the machine may have changed).
_SEARCH_DONE_SETTLES = 50


def _trial_step(params: InterleaveParams, halvings: int) -> float:
    """The next trial's step, as a fraction of the period: the full step halved at each
    failed trial of the search."""
    return float(params.interleave_period_step) / (2 ** min(halvings, 30))


def _search_done(params: InterleaveParams, halvings: int) -> bool:
    """The next trial would be too close to be worth a collision: the search is done."""
    return _trial_step(params, halvings) < _MIN_TRIAL_STEP


def _trial_hold(failed_trials: int) -> int:
    """Settle times the floor holds after the ``failed_trials``-th failed trial in a row: a
    trial judged while the jobs still moved into their turns fails once and is tried again
    soon; a period the jobs really cannot keep up with is tried ever less often."""
    return min(2**failed_trials, _FLOOR_SETTLES)


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
        params = self.params
        margin = 1.0 + params.interleave_period_margin
        kept = previous.schedule
        slowest = max(u.step_s for u in crossing)
        if kept is not None and window.scheduled > 0 and set(kept.turns) != keys:
            # The groups changed under a schedule in force (a job came or went): no schedule
            # for a window, so that the next one is placed from phases without holds.
            return _unscheduled(REASON_REGROUPING, InterleaveState(schedule=kept), crossing)
        if kept is not None and window.scheduled > 0:
            if window.now >= kept.floor_until:
                if kept.floor_s > kept.natural_s:
                    kept = replace(kept, floor_s=kept.natural_s)  # a raised floor expires
                if _search_done(params, kept.halvings):
                    # A done search: again, from the full step.
                    kept = replace(kept, halvings=0, failed_trials=0, best_s=0.0, failed_s=0.0)
            schedule = kept
            settled = window.now - kept.since >= params.interleave_settle_s
            if window.scheduled >= _WHOLE_WINDOW and settled and slowest > 0:
                outgrown_at = kept.outgrown_at
                schedule = kept = replace(kept, outgrown_at=0.0)
                floor = kept.floor_s
                # Back from a failed trial (no trial now), the steps move into their turns
                # again while the floor holds: the window still shows the collision, not this
                # period's steps, so it is not judged outgrown then.
                # (For the hold of a failed trial's count, not the long hold of a done search:
                # a slowdown then is the jobs', and lengthens the period as below.)
                returning = (
                    kept.failed_trials > 0
                    and kept.kept_up_s == 0
                    and window.now
                    < kept.since + _trial_hold(kept.failed_trials) * params.interleave_settle_s
                )
                outgrown = slowest > kept.period_s * (1.0 + params.interleave_period_margin / 2)
                lasting = (
                    kept.kept_up_s > 0  # a trial's failure is not waited for
                    or (outgrown_at > 0 and window.now - outgrown_at >= params.interleave_settle_s)
                )
                if outgrown and not returning and not lasting:
                    # Outgrown a period kept up with: lengthened if it lasts a settle time.
                    schedule = replace(kept, outgrown_at=outgrown_at or window.now)
                elif outgrown and not returning:
                    failed, hold = kept.failed_trials, _FLOOR_SETTLES
                    halvings, best, failed_s = kept.halvings, kept.best_s, kept.failed_s
                    if kept.kept_up_s > 0:
                        # A trial of a shorter period failed: the jobs fell out of their turns
                        # and collided, so their steps say how long a collision takes, not
                        # how long a period they keep up with is. Back to the period they kept
                        # up with, and none shorter for a while, longer at each failure in a
                        # row (should that one fail later, the rule below lengthens it).
                        # The next trial below the shortest period kept up with is half as
                        # far below it; when that is too close to be worth a collision, the
                        # search is done for a long while. (A step back toward that period
                        # that fails is no narrowing, unless it failed within a full step of
                        # it: then that period no longer holds.)
                        longer = kept.kept_up_s
                        raised = kept.kept_up_s
                        failed += 1
                        if not (best and kept.period_s >= best):
                            halvings += 1
                            failed_s = min(failed_s or math.inf, kept.period_s)
                        elif kept.period_s <= best * (1 + params.interleave_period_step):
                            # Back at the shortest period kept up with (within the step that
                            # reaches it), and it fails: the jobs or the machine slowed since
                            # it was kept up with. Left as the target, it would be tried
                            # again after every hold, a collision each time, and the search
                            # (and the effect guard's judgment, which waits for it) would
                            # never be done. The period kept up with now is the shortest
                            # known, and the search narrows as after any failed trial.
                            best = kept.kept_up_s
                            halvings += 1
                        hold = _trial_hold(failed)
                        if _search_done(params, halvings):
                            hold = _SEARCH_DONE_SETTLES
                    else:
                        # Steps outgrow a period they kept up with (the jobs or the machine
                        # slowed): one full step longer, as far as the steps when they outgrew
                        # it by more, and not this short again for a while.
                        longer = max(
                            kept.period_s / (1 - params.interleave_period_step),
                            slowest * margin if slowest > kept.period_s * margin else 0.0,
                        )
                        raised = kept.period_s + RESOLUTION_S
                        # Just after a failed trial's hold, it is the trial's collision that
                        # outlasted it: the period comes back fast to the shortest one kept up
                        # with. Otherwise the jobs or the machine slowed: a new search.
                        just_failed = failed > 0 and outgrown_at - kept.since <= (
                            (_trial_hold(failed) + 1) * params.interleave_settle_s
                        )
                        if not just_failed:
                            halvings, best, failed_s = 0, 0.0, 0.0
                        elif best:
                            raised = best
                    until = window.now + hold * params.interleave_settle_s
                    if halvings and _search_done(params, halvings):
                        until = max(until, kept.floor_until)  # a done search's hold stays
                    schedule = replace(
                        kept.rescaled(round_period(longer), window.now),
                        floor_s=raised,
                        floor_until=until,
                        failed_trials=failed,
                        halvings=halvings,
                        best_s=best,
                        failed_s=failed_s,
                    )
                elif slowest <= kept.period_s * (1 + _LOCKED):
                    # Every step waits for its slot: try a shorter period, down to the floor.
                    # A period on trial that the steps kept up with ends the failures' count.
                    failed = 0 if kept.kept_up_s > 0 else kept.failed_trials
                    if kept.kept_up_s > 0 and 0 < kept.period_s < kept.failed_s:
                        # Kept up with below a period that failed: that failure was not the
                        # period's. The full step again (the next failure narrows anew).
                        kept = replace(kept, halvings=0, failed_s=0.0)
                    best = min(kept.best_s, kept.period_s) if kept.best_s else kept.period_s
                    kept = replace(kept, best_s=best)
                    returning_to_best = kept.period_s > best
                    if returning_to_best:
                        # Back toward the shortest period kept up with, halfway (at least a
                        # full step) each settle time: a collision that outlasted a failed
                        # trial's hold had the period lengthened to the collided steps.
                        shorter = round_period(
                            max(
                                best,
                                min(
                                    kept.period_s * (1 - params.interleave_period_step),
                                    (kept.period_s + best) / 2,
                                ),
                            )
                        )
                    else:
                        shorter = round_period(
                            kept.period_s * (1 - _trial_step(params, kept.halvings))
                        )
                    # A done search tries nothing below the shortest period kept up with, but
                    # still comes back to it.
                    if (
                        (not _search_done(params, kept.halvings) or returning_to_best)
                        and shorter >= floor
                        and shorter < kept.period_s
                    ):
                        schedule = replace(
                            kept.rescaled(shorter, window.now),
                            floor_s=floor,
                            kept_up_s=kept.period_s,
                            failed_trials=failed,
                        )
                    else:  # at the floor, or the search done: the period on trial passed
                        schedule = replace(kept, kept_up_s=0.0, failed_trials=failed)
                if slowest <= kept.period_s * (1 + _LOCKED):
                    # A whole window of steps that kept up with the period: the phases as
                    # long as they last in their turns.
                    schedule = replace(
                        schedule, turn_busy={(u.job, u.pgs): busy(u) for u in crossing}
                    )
            return self._scheduled(window, schedule, len(crossing), None, slowest)
        if min(u.step_s for u in crossing) <= 0:
            # A job whose step time is not known yet: no period to agree on.
            return _unscheduled(REASON_NO_COLLISION, InterleaveState(), crossing)
        aligned = aligned_overlap(crossing)
        if aligned is not None and aligned < params.interleave_min_overlap_s:
            # On the controller's clock the jobs' phases do not meet now (they took turns by
            # themselves): a schedule would only hold them.
            return _unscheduled(
                REASON_NO_COLLISION,
                InterleaveState(schedule=kept),
                crossing,
                aligned_overlap_s=round(aligned, 4),
            )
        dilated = dilation(crossing, kept.turn_busy) if kept is not None else None
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
            # fabric do within seconds), and a schedule would only hold them and search.
            # (2026-12-06, 18:25: on a fairly shared uplink, jobs that collided at their
            # start, 183 ms, took turns at 146 ms within the guard's withheld phase, and the
            # schedule then published ran 96 s of its search, 5% slower than free.)
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
        alone = alone_durations(crossing)
        natural = max(natural_step(u, a) for u, a in zip(crossing, alone, strict=True))
        # Start from the steps as they are (a job loses at most the margin while the period
        # comes down) and search down toward the estimate without the collision.
        period = round_period(slowest * margin)
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
            # Placed again after a spell without it (the effect guard's phase without the
            # schedule): the turns anew, the period where its search had got to, or, where
            # the steps are shorter now, the margin above them (not below the floor): jobs
            # that moved into their turns by themselves while it was withheld (free-running
            # jobs on the emulated fabric do within seconds) are not slowed to the collided
            # steps that first asked for it, only kept from drifting back. (2026-12-06: a
            # 145 ms step in its turns was held at a 193 ms period set 10 s earlier, then
            # searched down for two minutes.)
            # The search's state carries over; what is new is the turns, their start and
            # busy time, and no failure or outgrowing measured yet.
            current = round_period(max(period, kept.floor_s))
            restart = current < kept.period_s
            schedule = replace(
                kept,
                turns=schedule.turns,
                since=schedule.since,
                busy_s=schedule.busy_s,
                failed_s=0.0,
                outgrown_at=0.0,
                period_s=current if restart else kept.period_s,
                kept_up_s=0.0 if restart else kept.kept_up_s,
            )
        figures = {"overlap_s": before, "overlap_after_s": after}
        if aligned is not None:
            figures["aligned_overlap_s"] = aligned
        if dilated is not None:
            figures["dilation"] = dilated
        return self._scheduled(window, schedule, len(crossing), figures, slowest)

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
            searching=not _search_done(self.params, schedule.halvings),
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
