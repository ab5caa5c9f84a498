"""The search for a schedule's period, as a small state machine: pure, one function per state.

A schedule's period ``P`` starts at the slowest job's step time as observed times
``1 + interleave_period_margin`` (a job loses at most the margin before the schedule pays) and
is searched down toward the floor: the slowest job's step time without the collision as
estimated (observed step minus what sharing the uplink added to its phases). Every decision
made while the schedule is in force is one step of the machine, :func:`advance`: the search's
state (:class:`PeriodSearch`, which the schedule carries) and what the decision saw of the
jobs' steps (:class:`Steps`) in; the next state and what it did (:class:`Action`) out.

First, whatever the state, a hold that ended ends (:func:`end_holds`): a raised floor falls
back to the estimate, and a done search starts again from the full step. A window that cannot
judge the period (set less than ``interleave_settle_s`` ago, partly without the schedule, no
step time) changes nothing else (``WAIT``). Otherwise the steps either kept up with the period
(within 2% of it: each waited for its slot), outgrew it (by more than half the margin) or
neither, and the state (:func:`state_of`) says what that means:

- ``HOLDING`` (:func:`on_holding`), a period kept up with or not judged yet: kept up, a
  shorter period goes on trial (``TRY_SHORTER``, ``interleave_period_step`` below; or
  ``COME_BACK``, halfway back toward the shortest period kept up with, which a collision that
  outlasted a failed trial left above) unless it would be below the floor or the search is
  done (``PASS``); outgrown, the steps are watched for a settle time (``WATCH``);
- ``ON_TRIAL`` (:func:`on_trial`), a shorter period on trial: kept up, the trial passed and
  the next one goes on (as from ``HOLDING``); outgrown, the jobs fell out of their turns and
  collided, and their steps measure the collision, not the period they need: back to the
  period kept up with, the floor raised to it (``GO_BACK``);
- ``BACK_FROM_FAILURE`` (:func:`on_back_from_failure`), back at that period while the floor a
  failed trial raised holds: the window still shows the trial's collision, so outgrowing is
  not judged; kept up, as from ``HOLDING``;
- ``OUTGROWN`` (:func:`on_outgrown`), steps seen to outgrow a period they had kept up with:
  still outgrown a settle time after (a stall of the machine that made a few steps skip their
  slots is out of the window by then), one step longer (to the steps plus the margin when
  they outgrew it by more), the floor raised above it (``LENGTHEN``); kept up again, as from
  ``HOLDING``; neither, the watch ends (``KEEP``).

In every state, steps that neither kept up nor outgrew the period leave it as it is (``KEEP``).

How the search narrows: each failed trial halves the next one's step, so the search closes in
on the shortest period kept up with, until a trial passes below the shortest one that failed
(that failure was the jobs still moving into their turns: the full step again); when the step
would be under ``_MIN_TRIAL_STEP`` the search is done and the period holds
``_SEARCH_DONE_SETTLES`` settle times. A floor raised by a failed trial holds 2, 4, 8, then
``_FLOOR_SETTLES`` settle times as trials fail in a row (the count starts again when one
passes); one raised above an outgrown period holds ``_FLOOR_SETTLES``. A failed trial's
collision that outlasts its hold (steps longer than the period never fall back into their
turns) lengthens the period to the collided steps plus the margin, from where it comes back
halfway each settle time; a step back that fails within a full step of the shortest period
kept up with gives that period up (the one kept up with now is the shortest known).

Why each rule, and what showed it: docs/pacing.md, "Interleaving: why the schedule is built
this way".
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, replace
from enum import Enum
from typing import TypeVar

from skewtrace.controller.policies.interleave.params import (
    RESOLUTION_S,
    InterleaveParams,
    round_period,
)

# A window this much under a schedule shows steps of the schedule only.
_WHOLE_WINDOW = 0.99
# Steps within this fraction over the period wait for their slots (they keep up with it).
_LOCKED = 0.02
# A floor raised above a period the steps outgrew holds this many settle times (a busy spell
# of the machine is not the period's fault for ever); after a failed trial, 2, 4, 8 and then
# this many, as trials keep failing.
_FLOOR_SETTLES = 10
# A search whose next trial would be shorter by less than this (of the period) is done.
_MIN_TRIAL_STEP = 0.01
# A done search holds the period this many settle times, then searches again from the full
# step (the jobs or the machine may have changed).
_SEARCH_DONE_SETTLES = 50


@dataclass(frozen=True)
class PeriodSearch:
    """Where the search for the period stands (a :class:`~.schedule.Schedule` is one, with
    the turns): the period and the search's memory."""

    period_s: float
    _: KW_ONLY
    since: float = 0.0
    """When the period was last set (the window's time)."""
    floor_s: float = 0.0
    """The period is not searched below this: the slowest job's step without the collision
    as estimated, raised to a period its steps were seen to outgrow."""
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
    failed_s: float = 0.0
    """The shortest period whose trial failed and narrowed this search (0: none). A trial
    that passes below it shows that failure was the jobs still moving into their turns, not
    the period: the search's step is the full one again."""
    outgrown_at: float = 0.0
    """When the steps were first seen to outgrow this period, which they had kept up with (0:
    they do not now; always 0 on trial and back from one). It is lengthened only if they
    still do a settle time later: a burst of skipped slots (a stall of the machine) is out of
    the window by then."""

    def rescaled(self: S, period_s: float, now: float) -> S:
        """The search at another period, set now: no trial, nothing watched yet (a
        schedule's units keep their turns, their shares of the period)."""
        return replace(self, period_s=period_s, since=now, kept_up_s=0.0, outgrown_at=0.0)


S = TypeVar("S", bound=PeriodSearch)
"""A :class:`PeriodSearch`, or a schedule that is one: what goes in comes out."""


@dataclass(frozen=True)
class Steps:
    """What one decision saw of the jobs' steps while the schedule was in force."""

    now: float
    """The decision's time (the window's)."""
    slowest_s: float
    """The slowest job's mean step time over the window (0: not known)."""
    scheduled: float = 1.0
    """The fraction of the window during which the schedule was published."""


class State(Enum):
    """Where the search stands, for what the steps say: see the module docstring."""

    HOLDING = "holding"
    ON_TRIAL = "on_trial"
    BACK_FROM_FAILURE = "back_from_failure"
    OUTGROWN = "outgrown"


class Action(Enum):
    """What one step of the search did to the period: see the module docstring."""

    WAIT = "wait"
    """The window cannot judge the period: nothing changed (but a hold that ended)."""
    KEEP = "keep"
    """The period stays."""
    PASS = "pass"
    """The steps kept up, and no shorter period is tried (the floor, or the search done)."""
    TRY_SHORTER = "try_shorter"
    """The steps kept up: a shorter period on trial, one (narrowed) step below."""
    COME_BACK = "come_back"
    """The steps kept up: halfway back toward the shortest period kept up with, on trial."""
    WATCH = "watch"
    """The steps outgrew a period they had kept up with: watched for a settle time."""
    GO_BACK = "go_back"
    """A trial failed: back to the period kept up with, the floor raised to it."""
    LENGTHEN = "lengthen"
    """The steps outgrew a period they had kept up with for a settle time: longer."""


def trial_step(params: InterleaveParams, halvings: int) -> float:
    """The next trial's step, as a fraction of the period: the full step halved at each
    failed trial of the search."""
    return float(params.interleave_period_step) / (2 ** min(halvings, 30))


def search_done(params: InterleaveParams, halvings: int) -> bool:
    """The next trial would be too close to be worth a collision: the search is done."""
    return trial_step(params, halvings) < _MIN_TRIAL_STEP


def trial_hold(failed_trials: int) -> int:
    """Settle times the floor holds after the ``failed_trials``-th failed trial in a row: a
    trial judged while the jobs still moved into their turns fails once and is tried again
    soon; a period the jobs really cannot keep up with is tried ever less often."""
    return min(2**failed_trials, _FLOOR_SETTLES)


def kept_up(period_s: float, slowest_s: float) -> bool:
    """Every job's steps waited for their slots: within 2% over the period."""
    return slowest_s <= period_s * (1 + _LOCKED)


def _outgrown(search: PeriodSearch, steps: Steps, params: InterleaveParams) -> bool:
    return steps.slowest_s > search.period_s * (1.0 + params.interleave_period_margin / 2)


def end_holds(search: S, now: float, params: InterleaveParams) -> S:
    """The search once the floor's hold is over (at ``floor_until``): a raised floor back to
    the estimate without the collision, and a done search started again from the full step."""
    if now < search.floor_until:
        return search
    if search.floor_s > search.natural_s:
        search = replace(search, floor_s=search.natural_s)
    if search_done(params, search.halvings):
        search = replace(search, halvings=0, failed_trials=0, best_s=0.0, failed_s=0.0)
    return search


def judged(search: PeriodSearch, steps: Steps, params: InterleaveParams) -> bool:
    """The window's steps say something of the period: a whole window under the schedule, a
    settle time after the period was set, the steps' time known."""
    settled = steps.now - search.since >= params.interleave_settle_s
    return steps.scheduled >= _WHOLE_WINDOW and settled and steps.slowest_s > 0


def state_of(search: PeriodSearch, steps: Steps, params: InterleaveParams) -> State:
    """Where the search stands at ``steps.now``: see the module docstring."""
    if search.kept_up_s > 0:
        return State.ON_TRIAL
    if search.failed_trials > 0 and steps.now < (
        search.since + trial_hold(search.failed_trials) * params.interleave_settle_s
    ):
        # (The hold of a failed trial's count, not the long hold of a done search: a
        # slowdown then is the jobs', and lengthens the period.)
        return State.BACK_FROM_FAILURE
    if search.outgrown_at > 0:
        return State.OUTGROWN
    return State.HOLDING


def on_holding(search: S, steps: Steps, params: InterleaveParams) -> tuple[S, Action]:
    """A period kept up with (or not judged yet): shorter while kept up, watched once
    outgrown."""
    if _outgrown(search, steps, params):
        return replace(search, outgrown_at=steps.now), Action.WATCH
    return _if_kept_up(search, steps, params)


def on_trial(search: S, steps: Steps, params: InterleaveParams) -> tuple[S, Action]:
    """A shorter period on trial: the next one while kept up; outgrown, back to the one kept
    up with."""
    if _outgrown(search, steps, params):
        return _gone_back(search, steps, params), Action.GO_BACK
    return _if_kept_up(search, steps, params)


def on_back_from_failure(search: S, steps: Steps, params: InterleaveParams) -> tuple[S, Action]:
    """Back from a failed trial while its floor holds: the steps move into their turns again
    and the window still shows the collision, so it is not judged outgrown."""
    return _if_kept_up(search, steps, params)


def on_outgrown(search: S, steps: Steps, params: InterleaveParams) -> tuple[S, Action]:
    """Steps seen to outgrow a period they had kept up with: lengthened if they still do a
    settle time later."""
    if _outgrown(search, steps, params):
        if steps.now - search.outgrown_at >= params.interleave_settle_s:
            return _lengthened(search, steps, params), Action.LENGTHEN
        return search, Action.WATCH
    return _if_kept_up(replace(search, outgrown_at=0.0), steps, params)


TRANSITIONS = {
    State.HOLDING: on_holding,
    State.ON_TRIAL: on_trial,
    State.BACK_FROM_FAILURE: on_back_from_failure,
    State.OUTGROWN: on_outgrown,
}
"""Each state's transition."""


def advance(search: S, steps: Steps, params: InterleaveParams) -> tuple[S, Action]:
    """One step of the search: see the module docstring."""
    search = end_holds(search, steps.now, params)
    if not judged(search, steps, params):
        return search, Action.WAIT
    transition = TRANSITIONS[state_of(search, steps, params)]
    return transition(search, steps, params)


def _if_kept_up(search: S, steps: Steps, params: InterleaveParams) -> tuple[S, Action]:
    """Every step waits for its slot: try a shorter period, down to the floor. A period on
    trial that the steps kept up with ends the failures' count."""
    if not kept_up(search.period_s, steps.slowest_s):
        return search, Action.KEEP
    on_trial = search.kept_up_s > 0
    failed = 0 if on_trial else search.failed_trials
    if on_trial and 0 < search.period_s < search.failed_s:
        # Kept up with below a period that failed: that failure was not the period's. The
        # full step again (the next failure narrows anew).
        search = replace(search, halvings=0, failed_s=0.0)
    best = min(search.best_s, search.period_s) if search.best_s else search.period_s
    search = replace(search, best_s=best)
    step = params.interleave_period_step
    coming_back = search.period_s > best
    if coming_back:
        # Back toward the shortest period kept up with, halfway (at least a full step) each
        # settle time: a collision that outlasted a failed trial's hold had the period
        # lengthened to the collided steps.
        shorter = round_period(
            max(best, min(search.period_s * (1 - step), (search.period_s + best) / 2))
        )
    else:
        shorter = round_period(search.period_s * (1 - trial_step(params, search.halvings)))
    # A done search tries nothing below the shortest period kept up with, but still comes
    # back to it.
    if (
        (not search_done(params, search.halvings) or coming_back)
        and shorter >= search.floor_s
        and shorter < search.period_s
    ):
        trial = replace(
            search.rescaled(shorter, steps.now), kept_up_s=search.period_s, failed_trials=failed
        )
        return trial, Action.COME_BACK if coming_back else Action.TRY_SHORTER
    # At the floor, or the search done: the period on trial passed.
    return replace(search, kept_up_s=0.0, failed_trials=failed), Action.PASS


def _gone_back(search: S, steps: Steps, params: InterleaveParams) -> S:
    """A trial of a shorter period failed: the jobs fell out of their turns and collided, so
    their steps say how long a collision takes, not how long a period they keep up with is.
    Back to the period they kept up with, and none shorter for a while, longer at each
    failure in a row (should that one fail later, :func:`on_outgrown` lengthens it). The next
    trial below the shortest period kept up with is half as far below it; when that is too
    close to be worth a collision, the search is done for a long while. (A step back toward
    that period that fails is no narrowing, unless it failed within a full step of it: then
    that period no longer holds.)"""
    failed = search.failed_trials + 1
    halvings, best, failed_s = search.halvings, search.best_s, search.failed_s
    if not (best and search.period_s >= best):
        halvings += 1
        failed_s = min(failed_s or math.inf, search.period_s)
    elif search.period_s <= best * (1 + params.interleave_period_step):
        # Back at the shortest period kept up with (within the step that reaches it), and it
        # fails: the jobs or the machine slowed since it was kept up with. Left as the
        # target, it would be tried again after every hold, a collision each time, and the
        # search (and the effect guard's judgment, which waits for it) would never be done.
        # The period kept up with now is the shortest known, and the search narrows as after
        # any failed trial.
        best = search.kept_up_s
        halvings += 1
    hold = _SEARCH_DONE_SETTLES if search_done(params, halvings) else trial_hold(failed)
    return _moved(
        search,
        steps.now,
        params,
        period_s=search.kept_up_s,
        floor_s=search.kept_up_s,
        hold=hold,
        failed_trials=failed,
        halvings=halvings,
        best_s=best,
        failed_s=failed_s,
    )


def _lengthened(search: S, steps: Steps, params: InterleaveParams) -> S:
    """Steps outgrow a period they kept up with (the jobs or the machine slowed): one full
    step longer, as far as the steps when they outgrew it by more, and not this short again
    for a while."""
    margin = 1.0 + params.interleave_period_margin
    slowest = steps.slowest_s
    longer = max(
        search.period_s / (1 - params.interleave_period_step),
        slowest * margin if slowest > search.period_s * margin else 0.0,
    )
    floor = search.period_s + RESOLUTION_S
    failed = search.failed_trials
    halvings, best, failed_s = search.halvings, search.best_s, search.failed_s
    # Just after a failed trial's hold, it is the trial's collision that outlasted it: the
    # period comes back fast to the shortest one kept up with. Otherwise the jobs or the
    # machine slowed: a new search.
    just_failed = failed > 0 and search.outgrown_at - search.since <= (
        (trial_hold(failed) + 1) * params.interleave_settle_s
    )
    if not just_failed:
        halvings, best, failed_s = 0, 0.0, 0.0
    elif best:
        floor = best
    return _moved(
        search,
        steps.now,
        params,
        period_s=longer,
        floor_s=floor,
        hold=_FLOOR_SETTLES,
        failed_trials=failed,
        halvings=halvings,
        best_s=best,
        failed_s=failed_s,
    )


def _moved(
    search: S,
    now: float,
    params: InterleaveParams,
    *,
    period_s: float,
    floor_s: float,
    hold: int,
    failed_trials: int,
    halvings: int,
    best_s: float,
    failed_s: float,
) -> S:
    """The search at a longer period (gone back or lengthened), its floor raised for
    ``hold`` settle times (a done search's longer hold stays)."""
    until = now + hold * params.interleave_settle_s
    if halvings and search_done(params, halvings):
        until = max(until, search.floor_until)
    return replace(
        search.rescaled(round_period(period_s), now),
        floor_s=floor_s,
        floor_until=until,
        failed_trials=failed_trials,
        halvings=halvings,
        best_s=best_s,
        failed_s=failed_s,
    )
