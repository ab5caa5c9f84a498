"""The pacing policy (``--policy pacing``): a window of per-rank barrier observations in,
per-rank delays out.

Pure: no I/O, no clock reads, no randomness. The service builds a
:class:`~skewtrace.controller.window.JobWindow` from the
Collector's ``training.rank.wait`` / ``training.rank.lateness`` / ``training.step.duration``
histograms (sums and counts over the last ``window_s`` seconds) and calls :func:`decide` with
the previous :class:`PolicyState`; the returned :class:`Decision` carries the next state.

Why it is built on per-step sums rather than per-collective quantiles: a step has many
collectives (DDP gradient buckets, a loss all-reduce) and not all of them see a rank's
lateness, so a p95 over collectives can miss a straggler entirely. The service hands the
policy each rank's barrier wait per step, with collectives that waited at the same time
(overlapping asynchronous buckets) counted once (see ``window_stats._once_per_step``); sums and
counts survive the cumulative-to-delta conversion exactly, without bucket interpolation.

The counterfactual: pacing changes what it measures. A delayed rank waits less, so the
observed spread shrinks while pacing is on, and a controller that looked only at the observed
spread would switch itself off and flap. The policy therefore adds back the delay each rank
was asked to apply during the window (``applied_delay``) and works on the *natural* arrival
spread, the one the job would show without pacing. See ``docs/pacing.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from skewtrace._options import (
    FieldError,
    at_least,
    check_fields,
    fraction,
    integer,
    non_negative,
    option,
    positive,
)
from skewtrace.controller.policies.base import Outcome
from skewtrace.controller.window import JobWindow, RankWindow, declined

# Delays below this are noise next to a sleep's own jitter; they are published as 0.
_MIN_USEFUL_DELAY_S = 1e-4

REASON_INSUFFICIENT_RANKS = "insufficient_ranks"
REASON_NO_STEP_TIME = "no_step_time"
REASON_BELOW_THRESHOLD = "below_threshold"
REASON_ACTIVATING = "activating"
REASON_DEACTIVATING = "deactivating"
REASON_ACTIVE = "active"
REASON_INEFFECTIVE = "ineffective"
# The reasons it declines a job with are the window's (skewtrace.controller.window.declined).


@dataclass(frozen=True)
class PolicyParams:
    """How the policy reacts; the defaults are the ``skewtrace pacer`` defaults.

    Every field is a ``skewtrace pacer`` flag (``skewtrace.cli``); the docstrings are its help.
    """

    activate_threshold: float = option(0.10, check=positive)
    """Natural arrival spread per step, as a fraction of the mean step time, that turns pacing
    on once sustained for ``activate_hold_s``."""

    deactivate_threshold: float = option(0.05, check=non_negative)
    """Spread fraction below which pacing turns off once sustained for ``deactivate_hold_s``;
    lower than ``activate_threshold`` (hysteresis)."""

    activate_hold_s: float = option(
        1.5, check=non_negative, seconds=True, deprecated=["activate_hold_s"]
    )
    """How long the spread must stay above ``activate_threshold`` before pacing turns on."""

    deactivate_hold_s: float = option(
        4.0, check=non_negative, seconds=True, deprecated=["deactivate_hold_s"]
    )
    """How long the spread must stay below ``deactivate_threshold`` before pacing turns off."""

    max_delay_s: float = option(0.05, check=non_negative, seconds=True, deprecated=["max_delay"])
    """Upper bound on any delay the controller publishes (ranks also cap on their side)."""

    wait_fraction: float = option(0.5, check=fraction)
    """A delay is at most this fraction of the rank's observed wait per step (and of its
    natural wait). Applied delays shrink the observed wait, so in steady state a rank whose
    natural earliness is e settles at e * f / (1 + f) (a third of e at 0.5)."""

    margin_s: float = option(0.002, check=non_negative, seconds=True, deprecated=["margin_s"])
    """A delay stays at least this far below the rank's observed wait per step, so the paced
    rank still arrives before the latest one on average."""

    gain: float = option(0.5, check=fraction)
    """Each decision moves a delay this fraction of the way to its target (smoothing)."""

    min_steps: int = option(3, parse=integer, check=at_least(1))
    """A rank with fewer steps in the window is left out (too little data to judge)."""

    min_ranks: int = option(2, parse=integer, check=at_least(2))
    """Fewer judged ranks than this and pacing is off (nothing to compare)."""

    ineffective_hold_s: float = option(
        4.0, check=non_negative, seconds=True, deprecated=["ineffective_hold_s"]
    )
    """A paced rank whose observed wait has not dropped by at least half its applied delay
    (below its largest wait since pacing turned on) for this long gets no more delay until pacing
    turns off: its delay is being absorbed (applied where it cannot move the rank's arrival)
    and only costs every rank time."""

    effect_pairs: int = option(3, parse=integer, check=at_least(0))
    """Do no harm, measured: while pacing would be on, alternate phases with its delays
    withheld (first) and published, and keep pacing only when this many paced/unpaced pairs show a
    real gain in step time (docs/pacing.md, 'Its own effect'); 0: no measurement."""

    effect_phase_s: float = option(10.0, check=positive, seconds=True)
    """Length of each paced or unpaced phase (a job's stretched window adds to it): it must
    hold the window and the ranks' lag (a poll, a flush), so keep it above window_s + 3 s."""

    effect_min_gain: float = option(0.0, check=non_negative)
    """Pacing stays on only when the lower confidence bound (one-sided 90%) of its measured
    gain in step time, as a fraction, is above this."""

    effect_backoff_s: float = option(600.0, check=positive, seconds=True)
    """After a measurement without a real gain, pacing stays off this long (reason no_gain)."""

    effect_recheck_s: float = option(300.0, check=positive, seconds=True)
    """After a measurement with a real gain, pacing is measured again this long later."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.deactivate_threshold >= self.activate_threshold:
            raise FieldError(
                "deactivate_threshold", "must be lower than {0} (hysteresis)", "activate_threshold"
            )


@dataclass(frozen=True)
class PolicyState:
    """What one decision hands to the next."""

    active: bool = False
    crossing_since: float | None = None
    """When the spread first crossed the threshold that would flip ``active`` (None: it has
    not, or it went back)."""

    delays: Mapping[int, float] = field(default_factory=dict)

    active_since: float | None = None
    """When pacing last turned on."""

    baseline_wait: Mapping[int, float] = field(default_factory=dict)
    """Each rank's largest observed wait per step in the first ``ineffective_hold_s`` after
    pacing turned on."""

    ineffective_since: Mapping[int, float] = field(default_factory=dict)
    """Since when a paced rank's delay has not shown in its wait."""

    suppressed: frozenset[int] = frozenset()
    """Ranks whose delays proved ineffective; unpaced until pacing turns off."""


@dataclass(frozen=True)
class Decision:
    active: bool
    delays: Mapping[int, float]
    """Delay per reporting rank in seconds (0 for unpaced ranks); empty when too few ranks."""

    spread_fraction: float | None
    """Natural arrival spread per step over mean step time; None without enough data."""

    reason: str
    state: PolicyState


def _natural_waits(
    ranks: Mapping[int, RankWindow], waits: Mapping[int, float] | None = None
) -> dict[int, float]:
    """Per-step wait each rank would show without pacing, relative to the latest rank.

    A rank delayed by ``d`` arrives ``d`` later than it naturally would, so its natural
    earliness is its observed wait plus ``d``. Waits are measured against each collective's
    latest arrival, which pacing itself can move; subtracting the smallest natural wait
    re-bases every rank on the naturally latest one and makes the estimate independent of
    who happened to be last while pacing was on. ``waits``: each rank's observed wait per
    step (default: the window's mean).
    """
    observed = waits if waits is not None else {r: w.wait_per_step_s for r, w in ranks.items()}
    raw = {r: observed[r] + w.applied_delay_s for r, w in ranks.items()}
    floor = min(raw.values())
    return {r: value - floor for r, value in raw.items()}


def _typical_natural_waits(ranks: Mapping[int, RankWindow]) -> dict[int, float] | None:
    """:func:`_natural_waits` from each rank's typical wait per step (None unless every rank
    has one)."""
    typical = {r: w.wait_typical_s for r, w in ranks.items()}
    if any(t is None for t in typical.values()):
        return None
    return _natural_waits(ranks, {r: t or 0.0 for r, t in typical.items()})


def decide(window: JobWindow, previous: PolicyState, params: PolicyParams) -> Decision:
    """The next decision for one job; see the module docstring and ``docs/pacing.md``."""
    reason = declined(window)
    if reason is not None:
        return _off(reason, None)
    ranks = {r: w for r, w in window.ranks.items() if w.steps >= params.min_steps}
    if len(ranks) < params.min_ranks:
        return _off(REASON_INSUFFICIENT_RANKS, None)
    total_steps = sum(w.steps for w in ranks.values())
    step_time = sum(w.step_time_sum_s for w in ranks.values()) / total_steps
    if not (math.isfinite(step_time) and step_time > 0):
        return _off(REASON_NO_STEP_TIME, None)

    natural_wait = _natural_waits(ranks)
    spread = max(natural_wait.values()) / step_time
    active, crossing_since, reason = _hysteresis(spread, window.now, previous, params)
    if not active:
        delays = dict.fromkeys(ranks, 0.0)
        state = PolicyState(active=False, crossing_since=crossing_since, delays=delays)
        return Decision(False, delays, spread, reason, state)

    if previous.active:
        active_since = previous.active_since if previous.active_since is not None else window.now
        baseline = dict(previous.baseline_wait)
        if window.now - active_since < params.ineffective_hold_s:
            # The running maximum over the episode's first seconds: when pacing turns on while
            # instability is still ramping up, the first window understates the unpaced wait,
            # which keeps rising until the first delays show in the metrics (a poll and a
            # flush later). Later maxima would only collect noise.
            for rank, observed in ranks.items():
                baseline[rank] = max(baseline.get(rank, 0.0), observed.wait_per_step_s)
        ineffective_since, suppressed = _effectiveness(ranks, previous, window.now, params)
    else:
        # Pacing turns on now: this window is unpaced, the reference for effectiveness.
        active_since = window.now
        baseline = {r: w.wait_per_step_s for r, w in ranks.items()}
        ineffective_since, suppressed = {}, frozenset()
    delays = _delays(ranks, natural_wait, previous.delays if previous.active else {}, params)
    for rank in suppressed:
        if rank in delays:
            delays[rank] = 0.0
    if suppressed and not any(delays.values()):
        reason = REASON_INEFFECTIVE
    state = PolicyState(
        active=True,
        crossing_since=crossing_since,
        delays=delays,
        active_since=active_since,
        baseline_wait=baseline,
        ineffective_since=ineffective_since,
        suppressed=suppressed,
    )
    return Decision(True, delays, spread, reason, state)


# An applied delay below this is too small to judge against the noise in the waits.
_MIN_JUDGED_DELAY_S = 0.002


def _effectiveness(
    ranks: Mapping[int, RankWindow], previous: PolicyState, now: float, params: PolicyParams
) -> tuple[dict[int, float], frozenset[int]]:
    """Which paced ranks' delays have shown in their waits (see ``ineffective_hold_s``).

    An applied delay ``d`` should lower the rank's observed wait by about ``d``; a delay
    that lands on a collective right after a synchronisation (a loss all-reduce issued after
    the optimizer step, say) is absorbed there: the rank's wait at the barrier it was meant
    for stays the same and every other rank waits ``d`` longer instead.
    """
    since = dict(previous.ineffective_since)
    suppressed = set(previous.suppressed)
    for rank, observed in ranks.items():
        baseline = previous.baseline_wait.get(rank)
        applied = observed.applied_delay_s
        if rank in suppressed or baseline is None or applied < _MIN_JUDGED_DELAY_S:
            since.pop(rank, None)
            continue
        drop = baseline - observed.wait_per_step_s
        if drop >= 0.75 * applied:
            since.pop(rank, None)
            continue
        if drop >= 0.5 * applied:
            # In between: noise in a window's mean wait can lift one tick over the line;
            # neither start nor clear the clock on it.
            continue
        started = since.setdefault(rank, now)
        if now - started >= params.ineffective_hold_s:
            suppressed.add(rank)
            since.pop(rank, None)
    return since, frozenset(suppressed)


def _off(reason: str, spread: float | None) -> Decision:
    return Decision(False, {}, spread, reason, PolicyState())


def _hysteresis(
    spread: float, now: float, previous: PolicyState, params: PolicyParams
) -> tuple[bool, float | None, str]:
    """(active, crossing_since, reason): a flip needs the crossing sustained for its hold."""
    if previous.active:
        if spread >= params.deactivate_threshold:
            return True, None, REASON_ACTIVE
        since = previous.crossing_since if previous.crossing_since is not None else now
        if now - since >= params.deactivate_hold_s:
            return False, None, REASON_BELOW_THRESHOLD
        return True, since, REASON_DEACTIVATING
    if spread < params.activate_threshold:
        return False, None, REASON_BELOW_THRESHOLD
    since = previous.crossing_since if previous.crossing_since is not None else now
    if now - since >= params.activate_hold_s:
        return True, None, REASON_ACTIVE
    return False, since, REASON_ACTIVATING


def _delays(
    ranks: Mapping[int, RankWindow],
    natural_wait: Mapping[int, float],
    previous_delays: Mapping[int, float],
    params: PolicyParams,
) -> dict[int, float]:
    # The latest rank is never delayed: both the observed one (max lateness now) and the
    # natural one (smallest natural wait) get 0.
    latest_observed = max(ranks, key=lambda r: (ranks[r].lateness_per_step_s, -r))
    latest_natural = min(natural_wait, key=lambda r: (natural_wait[r], r))
    # A rank is early when it waits in most of the window, not once for another rank's stall
    # (which makes every rank wait, the slow ones too): the typical wait caps the mean.
    typical = _typical_natural_waits(ranks)
    delays: dict[int, float] = {}
    for rank, observed in ranks.items():
        wait = natural_wait[rank]
        observed_wait = observed.wait_per_step_s
        if typical is not None and observed.wait_typical_s is not None:
            wait = min(wait, typical[rank])
            observed_wait = min(observed_wait, observed.wait_typical_s)
        natural_lateness = max(0.0, observed.lateness_per_step_s - observed.applied_delay_s)
        persistently_early = wait > params.margin_s and wait > natural_lateness
        if rank in (latest_observed, latest_natural) or not persistently_early:
            delays[rank] = 0.0
            continue
        # The bounds use the *observed* barrier wait as well as the natural one: the pacer
        # cannot see whether a rank applied its delay (it may have capped it or failed open),
        # and a bound on the natural wait alone would then ratchet the delay up to the whole
        # wait. Against the observed wait a delay that is applied shrinks its own bound, so the
        # loop settles with the rank still early: d = f * (e - d), i.e. d = e * f / (1 + f).
        bound = min(
            params.max_delay_s,
            params.wait_fraction * wait,
            params.wait_fraction * observed_wait,
            observed_wait - params.margin_s,
        )
        before = previous_delays.get(rank, 0.0)
        smoothed = before + params.gain * (bound - before)
        # Smoothing moves toward the bound from either side; clamp again so a bound that
        # dropped (the rank stopped being early) takes effect at once.
        delay = min(max(smoothed, 0.0), bound)
        delays[rank] = delay if delay >= _MIN_USEFUL_DELAY_S else 0.0
    return delays


class PacingPolicy:
    """The pacing policy behind the service's policy interface (``--policy pacing``)."""

    name = "pacing"

    def __init__(self, params: PolicyParams) -> None:
        self.params = params

    def initial_state(self) -> PolicyState:
        return PolicyState()

    def decide(self, window: JobWindow, previous: PolicyState) -> Outcome:
        decision = decide(window, previous, self.params)
        return Outcome(
            reason=decision.reason,
            state=decision.state,
            active=decision.active,
            delays=decision.delays,
            spread=decision.spread_fraction,
            ranks=len(decision.delays),
        )
