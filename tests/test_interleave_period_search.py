"""The interleave schedule's period search (skewtrace.controller.policies.interleave
.period_search), one transition at a time: rows of (state, steps seen) -> (next state, action).

The settings are the defaults: a 5% margin (steps outgrow a period by more than 2.5% of it), a
4% step, 6 s settle times; steps within 2% over the period kept up with it."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from skewtrace.controller.policies.interleave import InterleaveParams
from skewtrace.controller.policies.interleave.period_search import (
    TRANSITIONS,
    Action,
    PeriodSearch,
    State,
    Steps,
    advance,
    end_holds,
    judged,
    on_back_from_failure,
    on_holding,
    on_outgrown,
    on_trial,
    state_of,
)

PARAMS = InterleaveParams(interleave_effect_pairs=0)

# Set at 0 s to 200 ms, searched down toward 150 ms (the steps without the collision).
HOLDING = PeriodSearch(0.2, since=0.0, floor_s=0.15, natural_s=0.15)
# Kept up with at 200 ms: 192 ms on trial since 6 s.
TRIAL = replace(HOLDING, period_s=0.192, since=6.0, kept_up_s=0.2, best_s=0.2)
# That trial failed at 12 s: back at 200 ms, the floor raised to it for 2 settle times, the
# next trial's step halved.
BACK = replace(
    HOLDING,
    since=12.0,
    floor_s=0.2,
    floor_until=24.0,
    failed_trials=1,
    halvings=1,
    best_s=0.2,
    failed_s=0.192,
)
# Steps seen outgrowing 200 ms, which they had kept up with, at 6 s.
OUTGROWN = replace(HOLDING, outgrown_at=6.0)

KEPT_UP, NEITHER, OUTGROWING = 0.2, 0.2045, 0.22
"""Steps of a 200 ms period: kept up with (at most 204 ms), neither, outgrown (above 205 ms)."""


def same(actual: PeriodSearch, expected: PeriodSearch) -> None:
    assert asdict(actual) == pytest.approx(asdict(expected)), (actual, expected)


@pytest.mark.parametrize(
    ("search", "now", "state"),
    [
        pytest.param(HOLDING, 6.0, State.HOLDING, id="placed"),
        pytest.param(TRIAL, 12.0, State.ON_TRIAL, id="trial"),
        pytest.param(BACK, 18.0, State.BACK_FROM_FAILURE, id="back within the trial's hold"),
        pytest.param(BACK, 24.0, State.HOLDING, id="back after the trial's hold"),
        pytest.param(
            replace(BACK, failed_trials=3),
            59.0,
            State.BACK_FROM_FAILURE,
            id="back after a third failure, within its 8 settle times",
        ),
        pytest.param(
            replace(BACK, failed_trials=3),
            60.0,
            State.HOLDING,
            id="back after a third failure, after them",
        ),
        pytest.param(OUTGROWN, 9.0, State.OUTGROWN, id="outgrown"),
        pytest.param(replace(TRIAL, failed_trials=1), 7.0, State.ON_TRIAL, id="a trial first"),
    ],
)
def test_the_state(search: PeriodSearch, now: float, state: State) -> None:
    assert state_of(search, Steps(now, KEPT_UP), PARAMS) is state


def test_every_state_has_its_transition() -> None:
    assert set(TRANSITIONS) == set(State)


@pytest.mark.parametrize(
    ("search", "now", "expected"),
    [
        pytest.param(
            replace(HOLDING, floor_s=0.2, floor_until=60.0),
            59.0,
            replace(HOLDING, floor_s=0.2, floor_until=60.0),
            id="a raised floor holds",
        ),
        pytest.param(
            replace(HOLDING, floor_s=0.2, floor_until=60.0),
            60.0,
            replace(HOLDING, floor_s=0.15, floor_until=60.0),
            id="a raised floor falls back to the estimate",
        ),
        pytest.param(
            replace(BACK, halvings=3, floor_until=300.0, failed_trials=2),
            300.0,
            replace(
                BACK,
                halvings=0,
                floor_s=0.15,
                floor_until=300.0,
                failed_trials=0,
                best_s=0.0,
                failed_s=0.0,
            ),
            id="a done search starts again from the full step",
        ),
        pytest.param(
            replace(BACK, halvings=2, floor_until=300.0, failed_trials=2),
            300.0,
            replace(BACK, halvings=2, floor_s=0.15, floor_until=300.0, failed_trials=2),
            id="a narrowed search goes on",
        ),
    ],
)
def test_the_end_of_a_hold(search: PeriodSearch, now: float, expected: PeriodSearch) -> None:
    same(end_holds(search, now, PARAMS), expected)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        pytest.param(Steps(6.0, KEPT_UP), True, id="a settle time on"),
        pytest.param(Steps(5.9, KEPT_UP), False, id="settling"),
        pytest.param(Steps(6.0, KEPT_UP, scheduled=0.98), False, id="partly unscheduled"),
        pytest.param(Steps(6.0, 0.0), False, id="no step time"),
    ],
)
def test_what_the_window_can_judge(steps: Steps, expected: bool) -> None:
    assert judged(HOLDING, steps, PARAMS) is expected


TRANSITION_ROWS = [
    # HOLDING: a period kept up with, or not judged yet.
    pytest.param(
        on_holding,
        HOLDING,
        Steps(6.0, KEPT_UP),
        replace(TRIAL, since=6.0),
        Action.TRY_SHORTER,
        id="holding, kept up: 4% shorter on trial",
    ),
    pytest.param(
        on_holding,
        HOLDING,
        Steps(6.0, NEITHER),
        HOLDING,
        Action.KEEP,
        id="holding, neither: kept",
    ),
    pytest.param(
        on_holding,
        HOLDING,
        Steps(6.0, OUTGROWING),
        OUTGROWN,
        Action.WATCH,
        id="holding, outgrown: watched",
    ),
    pytest.param(
        on_holding,
        replace(HOLDING, floor_s=0.195),
        Steps(6.0, KEPT_UP),
        replace(HOLDING, floor_s=0.195, best_s=0.2),
        Action.PASS,
        id="holding at the floor, kept up: passed",
    ),
    pytest.param(
        on_holding,
        replace(HOLDING, halvings=3, best_s=0.2),
        Steps(6.0, KEPT_UP),
        replace(HOLDING, halvings=3, best_s=0.2),
        Action.PASS,
        id="holding, the search done: nothing shorter",
    ),
    pytest.param(
        on_holding,
        replace(HOLDING, best_s=0.16),
        Steps(6.0, KEPT_UP),
        replace(HOLDING, period_s=0.18, since=6.0, kept_up_s=0.2, best_s=0.16),
        Action.COME_BACK,
        id="holding above the shortest kept up with: halfway back",
    ),
    pytest.param(
        on_holding,
        replace(HOLDING, best_s=0.195),
        Steps(6.0, KEPT_UP),
        replace(HOLDING, period_s=0.195, since=6.0, kept_up_s=0.2, best_s=0.195),
        Action.COME_BACK,
        id="holding just above the shortest kept up with: no further than it",
    ),
    pytest.param(
        on_holding,
        replace(HOLDING, best_s=0.16, halvings=3),
        Steps(6.0, KEPT_UP),
        replace(HOLDING, period_s=0.18, since=6.0, kept_up_s=0.2, best_s=0.16, halvings=3),
        Action.COME_BACK,
        id="holding, the search done: still comes back",
    ),
    pytest.param(
        on_holding,
        replace(HOLDING, failed_trials=2, halvings=2, best_s=0.2),
        Steps(30.0, KEPT_UP),
        replace(
            HOLDING,
            period_s=0.198,
            since=30.0,
            kept_up_s=0.2,
            failed_trials=2,
            halvings=2,
            best_s=0.2,
        ),
        Action.TRY_SHORTER,
        id="holding after failed trials: 1% shorter, the failures still counted",
    ),
    # ON_TRIAL: a shorter period on trial.
    pytest.param(
        on_trial,
        TRIAL,
        Steps(12.0, 0.192),
        replace(TRIAL, period_s=0.184, since=12.0, kept_up_s=0.192, best_s=0.192),
        Action.TRY_SHORTER,
        id="trial, kept up: passed, the next one on trial",
    ),
    pytest.param(
        on_trial,
        replace(TRIAL, failed_trials=2),
        Steps(12.0, 0.192),
        replace(TRIAL, period_s=0.184, since=12.0, kept_up_s=0.192, best_s=0.192),
        Action.TRY_SHORTER,
        id="trial, kept up: the failures' count ends",
    ),
    pytest.param(
        on_trial,
        replace(TRIAL, floor_s=0.19),
        Steps(12.0, 0.192),
        replace(TRIAL, floor_s=0.19, kept_up_s=0.0, best_s=0.192),
        Action.PASS,
        id="trial at the floor, kept up: passed, no trial",
    ),
    pytest.param(
        on_trial,
        TRIAL,
        Steps(12.0, 0.1965),
        TRIAL,
        Action.KEEP,
        id="trial, neither: kept",
    ),
    pytest.param(
        on_trial,
        TRIAL,
        Steps(12.0, OUTGROWING),
        BACK,
        Action.GO_BACK,
        id="trial, outgrown: back to the period kept up with, narrowed",
    ),
    pytest.param(
        on_trial,
        replace(TRIAL, period_s=0.19, since=30.0, halvings=1, failed_s=0.192, failed_trials=1),
        Steps(36.0, 0.19),
        replace(TRIAL, period_s=0.182, since=36.0, kept_up_s=0.19, best_s=0.19),
        Action.TRY_SHORTER,
        id="trial below one that failed, kept up: the full step again",
    ),
    pytest.param(
        on_trial,
        replace(
            BACK,
            since=50.0,
            halvings=2,
            failed_trials=2,
            floor_until=0.0,
            kept_up_s=0.2,
            period_s=0.196,
        ),
        Steps(56.0, OUTGROWING),
        replace(
            BACK,
            since=56.0,
            halvings=3,
            failed_trials=3,
            failed_s=0.192,
            floor_until=56.0 + 50 * 6.0,
        ),
        Action.GO_BACK,
        id="trial fails at a 1% step: back, the search done for 50 settle times",
    ),
    pytest.param(
        on_trial,
        replace(HOLDING, period_s=0.205, since=60.0, kept_up_s=0.22, best_s=0.2, halvings=1),
        Steps(66.0, 0.23),
        replace(
            HOLDING,
            period_s=0.22,
            since=66.0,
            floor_s=0.22,
            floor_until=78.0,
            failed_trials=1,
            halvings=2,
            best_s=0.22,
        ),
        Action.GO_BACK,
        id="a step back that fails within a full step of the shortest: that one given up",
    ),
    pytest.param(
        on_trial,
        replace(HOLDING, period_s=0.21, since=60.0, kept_up_s=0.22, best_s=0.2, halvings=1),
        Steps(66.0, 0.23),
        replace(
            HOLDING,
            period_s=0.22,
            since=66.0,
            floor_s=0.22,
            floor_until=78.0,
            failed_trials=1,
            halvings=1,
            best_s=0.2,
        ),
        Action.GO_BACK,
        id="a step back that fails further up: no narrowing",
    ),
    # BACK_FROM_FAILURE: back at the period kept up with while the failed trial's floor holds.
    pytest.param(
        on_back_from_failure,
        BACK,
        Steps(18.0, OUTGROWING),
        BACK,
        Action.KEEP,
        id="back, outgrown: not judged (the trial's collision)",
    ),
    pytest.param(
        on_back_from_failure,
        BACK,
        Steps(18.0, KEPT_UP),
        BACK,
        Action.PASS,
        id="back, kept up: nothing below the raised floor",
    ),
    pytest.param(
        on_back_from_failure,
        replace(BACK, floor_s=0.15),
        Steps(18.0, KEPT_UP),
        replace(BACK, floor_s=0.15, period_s=0.196, since=18.0, kept_up_s=0.2),
        Action.TRY_SHORTER,
        id="back, kept up, the floor lower: a half step shorter on trial",
    ),
    # OUTGROWN: steps seen to outgrow a period they had kept up with.
    pytest.param(
        on_outgrown,
        OUTGROWN,
        Steps(11.9, OUTGROWING),
        OUTGROWN,
        Action.WATCH,
        id="outgrown, still, within a settle time: watched on",
    ),
    pytest.param(
        on_outgrown,
        OUTGROWN,
        Steps(12.0, OUTGROWING),
        replace(HOLDING, period_s=0.231, since=12.0, floor_s=0.201, floor_until=72.0),
        Action.LENGTHEN,
        id="outgrown a settle time: to the steps plus the margin",
    ),
    pytest.param(
        on_outgrown,
        OUTGROWN,
        Steps(12.0, 0.207),
        replace(HOLDING, period_s=0.208, since=12.0, floor_s=0.201, floor_until=72.0),
        Action.LENGTHEN,
        id="outgrown a little for a settle time: one step longer",
    ),
    pytest.param(
        on_outgrown,
        replace(OUTGROWN, halvings=2, best_s=0.19, failed_s=0.185),
        Steps(12.0, OUTGROWING),
        replace(HOLDING, period_s=0.231, since=12.0, floor_s=0.201, floor_until=72.0),
        Action.LENGTHEN,
        id="outgrown long after any failure: a new search",
    ),
    pytest.param(
        on_outgrown,
        replace(OUTGROWN, outgrown_at=13.0, failed_trials=1, halvings=1, best_s=0.18),
        Steps(19.0, OUTGROWING),
        replace(
            HOLDING,
            period_s=0.231,
            since=19.0,
            floor_s=0.18,
            floor_until=79.0,
            failed_trials=1,
            halvings=1,
            best_s=0.18,
        ),
        Action.LENGTHEN,
        id="a failed trial's collision outlasts its hold: back from the steps to the shortest",
    ),
    pytest.param(
        on_outgrown,
        OUTGROWN,
        Steps(9.0, KEPT_UP),
        replace(TRIAL, since=9.0),
        Action.TRY_SHORTER,
        id="outgrown, kept up again: the watch ends, shorter on trial",
    ),
    pytest.param(
        on_outgrown,
        OUTGROWN,
        Steps(9.0, NEITHER),
        HOLDING,
        Action.KEEP,
        id="outgrown, neither: the watch ends",
    ),
]


@pytest.mark.parametrize(("transition", "search", "steps", "expected", "action"), TRANSITION_ROWS)
def test_a_transition(transition, search, steps, expected, action) -> None:
    after, did = transition(search, steps, PARAMS)
    assert did is action
    same(after, expected)


@pytest.mark.parametrize(
    ("search", "steps", "expected", "action"),
    [
        pytest.param(HOLDING, Steps(5.0, KEPT_UP), HOLDING, Action.WAIT, id="settling"),
        pytest.param(
            HOLDING, Steps(6.0, OUTGROWING, scheduled=0.5), HOLDING, Action.WAIT, id="unscheduled"
        ),
        pytest.param(
            replace(HOLDING, floor_s=0.19, floor_until=5.0),
            Steps(5.0, KEPT_UP),
            replace(HOLDING, floor_until=5.0),
            Action.WAIT,
            id="settling, a hold ended",
        ),
        pytest.param(
            HOLDING,
            Steps(6.0, KEPT_UP),
            replace(TRIAL, since=6.0),
            Action.TRY_SHORTER,
            id="holding",
        ),
        pytest.param(TRIAL, Steps(12.0, OUTGROWING), BACK, Action.GO_BACK, id="on trial"),
        pytest.param(BACK, Steps(18.0, OUTGROWING), BACK, Action.KEEP, id="back from a failure"),
        pytest.param(
            OUTGROWN,
            Steps(12.0, OUTGROWING),
            replace(HOLDING, period_s=0.231, since=12.0, floor_s=0.201, floor_until=72.0),
            Action.LENGTHEN,
            id="outgrown",
        ),
        pytest.param(
            replace(HOLDING, halvings=3, failed_trials=1, best_s=0.2, floor_until=6.0),
            Steps(6.0, KEPT_UP),
            replace(TRIAL, since=6.0, floor_until=6.0),
            Action.TRY_SHORTER,
            id="a done search's hold over: the full step again",
        ),
    ],
)
def test_a_step_of_the_search(
    search: PeriodSearch, steps: Steps, expected: PeriodSearch, action: Action
) -> None:
    after, did = advance(search, steps, PARAMS)
    assert did is action
    same(after, expected)


def test_a_schedule_goes_through_the_search_as_one() -> None:
    """The schedule extends the search: what goes in comes out, turns and all."""
    from skewtrace.controller.policies.interleave import Schedule

    turns = {("A", "0"): (0.0, 0.1), ("B", "0"): (0.5, 0.1)}
    schedule = Schedule(0.2, turns, floor_s=0.15, natural_s=0.15, busy_s=0.1)
    after, did = advance(schedule, Steps(6.0, KEPT_UP), PARAMS)
    assert did is Action.TRY_SHORTER
    assert isinstance(after, Schedule) and after.turns == turns and after.busy_s == 0.1
    assert after.period_s == 0.192 and after.kept_up_s == 0.2
