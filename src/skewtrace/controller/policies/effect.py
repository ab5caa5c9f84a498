"""Do no harm, measured: the controller's estimate of what pacing does to a job's throughput.

A delay on an early rank is meant to cost nothing (the rank would have waited anyway) and to
gain something (traffic that no longer collides). Whether it does depends on the job and the
fabric, and every measurement before this module found pacing costing throughput. So while the
pacing policy would pace a job, :class:`EffectGuard` runs an experiment on it:

- phases of ``effect_phase_s`` (plus the job's window stretch), alternately with the policy's
  delays withheld (``off``: no delays, ``active`` false, reason ``measuring``) and published
  (``on``), withheld first: the policy acts only on a cause that lasted a whole phase, so a
  transient (a fault's onset before the diagnosis names it, a burst that ends by itself)
  publishes nothing. At the end of each phase the job's mean step time over the window (the
  phase's last steps: the phase outlasts the window and the ranks' lag) is read;
- an ``off`` phase runs its whole length even where the policy stops asking in it: without
  its decision the job may look fine for a while (two jobs a schedule kept in turns stay in
  them for tens of steps before they collide again), and that is the experiment's baseline,
  not the cause's end. The policy's own outcome is served meanwhile; the experiment ends
  only if the policy still asks nothing when the phase is over, and keeps the pairs it
  measured: the next experiment, begun within ``effect_recheck_s`` of the oldest, counts
  on from them (a cause that comes and goes for a pair at a time is judged too);
- an ``on`` phase runs on while the policy says it is still ``searching`` for its setting
  (the interleave policy's period, which comes down from the collided step time over a few
  minutes), judged a phase after the search is done, at most ``effect_recheck_s`` after it
  began: the gain measured is the setting's, not the search's;
- each off/on pair gives a gain ``g = (T_off - T_on) / T_off`` (a fraction of the step time:
  positive when pacing shortens the step, i.e. raises throughput);
- after ``effect_pairs`` pairs, the mean gain and its one-sided 90% lower confidence bound
  (Student's t over the pairs) decide. Above ``effect_min_gain``, pacing stays on (``kept``)
  and is measured again after ``effect_recheck_s``. Otherwise pacing is off for
  ``effect_backoff_s`` with reason ``no_gain``: the policy's decisions are not published.

The measured effect is on the decision body (``effect``: state, gain, low, high, pairs) and is
the ``skewtrace.controller.effect`` gauge (job, policy). Pure, like the policies: no I/O, no
clock reads.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Protocol

from skewtrace.controller.policies.base import ControllerPolicy, Outcome
from skewtrace.controller.window import JobWindow
from skewtrace.decision import BALANCE_COUNT, BALANCE_WORK

REASON_MEASURING = "measuring"
"""Pacing withheld for one phase of the experiment (its delays are not published)."""
REASON_NO_GAIN = "no_gain"
"""Pacing off: the last experiment found no real gain (see ``effect`` on the body)."""

STATE_MEASURING = "measuring"
STATE_KEPT = "kept"
STATE_NO_GAIN = "no_gain"

# One-sided 90% Student's t quantiles by degrees of freedom (pairs - 1); beyond: the normal.
_T90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383}
_Z90 = 1.282


class EffectSettings(Protocol):
    """The guard's settings: pacing's ``effect_*`` parameters
    (:class:`~skewtrace.controller.policies.pacing.PolicyParams`), or another policy's."""

    @property
    def effect_pairs(self) -> int: ...
    @property
    def effect_phase_s(self) -> float: ...
    @property
    def effect_min_gain(self) -> float: ...
    @property
    def effect_backoff_s(self) -> float: ...
    @property
    def effect_recheck_s(self) -> float: ...


OFFSETS = "offsets"
"""The body's per-group offsets (the interleave policy's): withheld with the delays."""
SCHEDULE = "schedule"
"""The body's schedule (the interleave policy's, for groups of several jobs): withheld too."""


def _publishes(out: Outcome) -> bool:
    """The outcome delays someone: a rank's delay, a group's offset, or a schedule (a slot
    at 0 holds its ranks too); or it splits the batches by work (the work-balance policy's)."""
    if out.balance == BALANCE_WORK:
        return True
    offsets = out.info.get(OFFSETS) or {}
    return out.active and (
        any(d > 0 for d in out.delays.values())
        or any(o > 0 for o in offsets.values())
        or bool(out.info.get(SCHEDULE))
    )


@dataclass(frozen=True)
class EffectEstimate:
    """What the experiment measured: the mean gain in step time and its 90% bounds."""

    gain: float
    low: float
    high: float
    pairs: int

    def as_dict(self, state: str) -> dict[str, Any]:
        """The body's ``effect`` (bounds null until two pairs are measured)."""

        def bound(value: float) -> float | None:
            return round(value, 4) if math.isfinite(value) else None

        return {
            "state": state,
            "gain": round(self.gain, 4),
            "low": bound(self.low),
            "high": bound(self.high),
            "pairs": self.pairs,
        }


def estimate(gains: tuple[float, ...]) -> EffectEstimate:
    """The mean of the pairs' gains with its one-sided 90% bounds (none below two pairs:
    the bounds are then infinite)."""
    n = len(gains)
    mean = statistics.fmean(gains) if gains else 0.0
    if n < 2:
        return EffectEstimate(mean, -math.inf, math.inf, n)
    half = _T90.get(n - 1, _Z90) * statistics.stdev(gains) / math.sqrt(n)
    return EffectEstimate(mean, mean - half, mean + half, n)


def step_time(window: JobWindow) -> float | None:
    """The job's mean step time over the window (None without steps)."""
    steps = sum(w.steps for w in window.ranks.values())
    if steps == 0:
        return None
    total = sum(w.step_time_sum_s for w in window.ranks.values()) / steps
    return total if math.isfinite(total) and total > 0 else None


@dataclass(frozen=True)
class EffectState:
    """The guard's state beside the policy's own (``inner``)."""

    inner: Any
    mode: str = "idle"
    """idle (nothing paced), off / on (the experiment's phases, in that order), kept,
    backoff."""
    since: float = 0.0
    """When the current mode or phase began."""
    until: float = 0.0
    """kept: when to measure again; backoff: when to let the policy decide again."""
    t_off: float | None = None
    """The step time read at the end of the current pair's off phase."""
    searched: float = 0.0
    """The last tick of the current on phase at which the policy was still searching."""
    gains: tuple[float, ...] = ()
    first_pair_at: float = 0.0
    """When the oldest of ``gains`` was measured (pairs outlive an experiment the policy
    interrupted by falling silent, for ``effect_recheck_s``)."""
    judged: EffectEstimate | None = None
    """The last experiment's estimate."""
    judged_state: str = ""


class EffectGuard:
    """Wraps the pacing, the interleave or the work-balance policy (alone, or inside the
    composition): see the module docstring."""

    def __init__(self, inner: ControllerPolicy, params: EffectSettings) -> None:
        self.inner = inner
        self.params = params
        self.name = inner.name

    def initial_state(self) -> EffectState:
        return EffectState(inner=self.inner.initial_state())

    def decide(self, window: JobWindow, previous: EffectState) -> Outcome:
        out = self.inner.decide(window, previous.inner)
        state = replace(previous, inner=out.state)
        if self.params.effect_pairs == 0:
            return replace(out, state=state)
        now = window.now
        paces = _publishes(out)
        if state.mode == "backoff":
            if now < state.until:
                return self._withheld(out, state, REASON_NO_GAIN)
            state = replace(state, mode="idle")
        phase = self.params.effect_phase_s + window.stretch_s
        if not paces:
            if state.mode == "off" and now - state.since < phase:
                # Without its decision the job may look fine for a while: the baseline.
                return self._with_effect(out, state)
            if state.mode in ("on", "off"):
                # Pacing stopped by itself mid-experiment: the phase under way is lost, the
                # pairs measured are kept for the next experiment (a cause that comes and
                # goes, as collisions that end in their turns do, would otherwise never be
                # judged, and each return would pay a withheld phase again).
                state = replace(state, mode="idle", t_off=None)
            return self._with_effect(out, state)
        if state.mode == "kept" and now < state.until:
            return self._with_effect(out, state)
        if state.mode in ("idle", "kept"):
            # Pairs left by an interrupted experiment (a verdict and a back-off clear them).
            recent = state.gains and now - state.first_pair_at <= self.params.effect_recheck_s
            gains = state.gains if recent else ()
            state = replace(state, mode="off", since=now, gains=gains, t_off=None)
        if state.mode == "off":
            if now - state.since < phase:
                return self._withheld(out, state, REASON_MEASURING)
            state = replace(state, mode="on", since=now, t_off=step_time(window), searched=0.0)
            return self._with_effect(out, state)
        # mode == "on"
        if out.searching and now - state.since < self.params.effect_recheck_s:
            state = replace(state, searched=now)
        if now - max(state.since, state.searched) < phase:
            return self._with_effect(out, state)
        t_on = step_time(window)
        gains, t_off = state.gains, state.t_off
        if t_off is not None and t_on is not None:
            if not gains:
                state = replace(state, first_pair_at=now)
            gains = (*gains, (t_off - t_on) / t_off)
        if len(gains) < self.params.effect_pairs:
            state = replace(state, mode="off", since=now, gains=gains, t_off=None)
            return self._withheld(out, state, REASON_MEASURING)
        judged = estimate(gains)
        if judged.low > self.params.effect_min_gain:
            state = replace(
                state,
                mode="kept",
                since=now,
                until=now + self.params.effect_recheck_s,
                gains=(),
                t_off=None,
                judged=judged,
                judged_state=STATE_KEPT,
            )
            return self._with_effect(out, state)
        state = replace(
            state,
            mode="backoff",
            since=now,
            until=now + self.params.effect_backoff_s,
            gains=(),
            t_off=None,
            judged=judged,
            judged_state=STATE_NO_GAIN,
        )
        return self._withheld(out, state, REASON_NO_GAIN)

    def _effect_info(self, state: EffectState) -> dict[str, Any]:
        if state.mode in ("on", "off"):
            return {"effect": estimate(state.gains).as_dict(STATE_MEASURING)}
        if state.judged is not None:
            return {"effect": state.judged.as_dict(state.judged_state)}
        return {}

    def _with_effect(self, out: Outcome, state: EffectState) -> Outcome:
        return replace(out, state=state, info={**out.info, **self._effect_info(state)})

    def _withheld(self, out: Outcome, state: EffectState, reason: str) -> Outcome:
        """The policy's outcome with its delays (and offsets) not published."""
        info = {**out.info, **self._effect_info(state)}
        if OFFSETS in info:
            info[OFFSETS] = {}
        info.pop(SCHEDULE, None)
        return replace(
            out,
            reason=reason,
            state=state,
            active=False,
            delays=dict.fromkeys(out.delays, 0.0),
            balance=BALANCE_COUNT if out.balance is not None else None,
            info=info,
        )
