"""The controller's measurement of its own effect (skewtrace.controller.policies.effect):
pacing is kept only while alternating paced and unpaced phases show a real gain in the job's
step time.

Synthetic jobs whose true effect is known: the step time in a phase is ``base * (1 - effect)``
while delays are published and ``base`` while they are withheld, with noise; the window at a
phase's end sees only that phase's steps.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from skewtrace.controller.policies.base import Outcome
from skewtrace.controller.policies.effect import (
    REASON_MEASURING,
    REASON_NO_GAIN,
    EffectGuard,
    estimate,
)
from skewtrace.controller.policies.pacing import PolicyParams
from skewtrace.controller.window import JobWindow, RankWindow

TICK_S = 0.5
BASE_STEP_S = 0.100


class AlwaysPacing:
    """A stand-in for the pacing policy that always wants rank 0 delayed by 10 ms."""

    name = "pacing"

    def initial_state(self) -> int:
        return 0

    def decide(self, window: JobWindow, previous: int) -> Outcome:
        return Outcome(reason="active", state=previous + 1, active=True, delays={0: 0.010})


def run(effect: float, seconds: float, params: PolicyParams, noise: float = 0.01) -> list[Any]:
    """(time, outcome) of every tick; the job's steps follow what was published."""
    rng = random.Random(7)
    guard = EffectGuard(AlwaysPacing(), params)
    state = guard.initial_state()
    published = True
    out = []
    t = 0.0
    while t < seconds:
        step = BASE_STEP_S * ((1 - effect) if published else 1.0) * (1 + rng.gauss(0, noise))
        ranks = {r: RankWindow(40, 40 * step, 0.0, 0.0) for r in range(4)}
        outcome = guard.decide(JobWindow(now=t, ranks=ranks), state)
        state = outcome.state
        published = outcome.active and any(outcome.delays.values())
        out.append((t, outcome))
        t += TICK_S
    return out


PARAMS = PolicyParams(effect_pairs=3, effect_phase_s=5.0, effect_backoff_s=60.0)


@pytest.mark.parametrize(
    ("effect", "kept"),
    [(0.10, True), (0.0, False), (-0.05, False)],
    ids=["gain", "none", "harm"],
)
def test_pacing_is_kept_only_with_a_real_gain(effect: float, kept: bool) -> None:
    ticks = run(effect, 40.0, PARAMS)
    # Three pairs of 5 s phases: judged at 30 s.
    judged = [o for t, o in ticks if t >= 30.0]
    last = judged[-1]
    found = last.info["effect"]
    assert found["pairs"] == 3
    assert found["gain"] == pytest.approx(effect, abs=0.02)
    if kept:
        assert found["state"] == "kept" and found["low"] > 0
        assert last.active and last.delays[0] > 0 and last.reason == "active"
    else:
        assert found["state"] == "no_gain" and found["low"] <= 0
        assert not last.active and not any(last.delays.values())
        assert last.reason == REASON_NO_GAIN
    # During the experiment, the unpaced phases publish nothing and say why.
    measuring = [o for t, o in ticks if t < 30.0 and o.reason == REASON_MEASURING]
    assert measuring and all(not o.active and not any(o.delays.values()) for o in measuring)
    assert len(measuring) == pytest.approx(len([t for t, _ in ticks if t < 30.0]) / 2, abs=3)


def test_after_the_back_off_pacing_is_measured_again() -> None:
    ticks = run(0.0, 130.0, PARAMS)
    reasons = [(t, o.reason) for t, o in ticks]
    off = [t for t, r in reasons if r == REASON_NO_GAIN]
    assert off[0] == pytest.approx(30.0) and max(t for t in off if t < 100.0) < 90.0
    # After 60 s of back-off, a new experiment: pacing withheld for a phase, then published.
    assert [r for t, r in reasons if 90.0 <= t < 95.0] == [REASON_MEASURING] * 10
    again = [t for t, r in reasons if t > 90.5 and r == "active"]
    assert again and again[0] == pytest.approx(95.0, abs=1.0)


def test_a_kept_policy_is_measured_again_after_the_recheck() -> None:
    params = PolicyParams(effect_pairs=2, effect_phase_s=5.0, effect_recheck_s=20.0)
    ticks = run(0.10, 60.0, params)
    measuring = [t for t, o in ticks if o.reason == REASON_MEASURING]
    # Judged kept at 20 s; measured again from 40 s.
    assert [t for t in measuring if 20.0 <= t < 40.0] == []
    assert any(t >= 40.0 for t in measuring)


class Transient:
    """A stand-in for a policy that wants rank 0 delayed only from ``start`` for
    ``seconds`` (a fault's onset before the diagnosis names it)."""

    name = "pacing"

    def __init__(self, start: float, seconds: float) -> None:
        self.start, self.end = start, start + seconds

    def initial_state(self) -> int:
        return 0

    def decide(self, window: JobWindow, previous: int) -> Outcome:
        if self.start <= window.now < self.end:
            return Outcome(reason="active", state=previous, active=True, delays={0: 0.010})
        return Outcome(reason="below_threshold", state=previous)


def test_a_cause_shorter_than_a_phase_publishes_nothing() -> None:
    """The experiment withholds first: the policy acts only on a cause that lasted a whole
    phase (``make demo`` measured pacing publishing delays in 2 s and 3.5 s transients when
    the experiment published first)."""
    ranks = {r: RankWindow(40, 40 * BASE_STEP_S, 0.0, 0.0) for r in range(4)}
    for seconds in (2.0, 3.5, 4.5):
        guard = EffectGuard(Transient(10.0, seconds), PARAMS)
        state = guard.initial_state()
        outcomes = []
        for tick in range(80):
            out = guard.decide(JobWindow(now=tick * TICK_S, ranks=ranks), state)
            state = out.state
            outcomes.append(out)
        assert not any(o.active or any(o.delays.values()) for o in outcomes)
        assert sum(o.reason == REASON_MEASURING for o in outcomes) == seconds / TICK_S
    # A cause that outlasts the withheld phase is acted on once it ends.
    guard = EffectGuard(Transient(10.0, 20.0), PARAMS)
    state, first = guard.initial_state(), None
    for tick in range(80):
        out = guard.decide(JobWindow(now=tick * TICK_S, ranks=ranks), state)
        state = out.state
        if first is None and out.active:
            first = tick * TICK_S
    assert first == 15.0


def test_no_measurement_when_disabled() -> None:
    ticks = run(-0.05, 40.0, PolicyParams(effect_pairs=0))
    assert all(o.active and o.reason == "active" and "effect" not in o.info for _, o in ticks)


def test_estimate_bounds() -> None:
    one = estimate((0.1,))
    assert one.gain == 0.1 and one.as_dict("measuring")["low"] is None
    tight = estimate((0.10, 0.11, 0.09))
    assert 0.05 < tight.low < 0.10 < tight.high
    noisy = estimate((0.3, -0.2, 0.05))
    assert noisy.low < 0 < noisy.high
