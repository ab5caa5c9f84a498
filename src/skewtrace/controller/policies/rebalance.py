"""The rebalancing policy (``--policy rebalance``): each rank's share of the global batch, in
proportion to its speed.

Pacing cannot help a rank that is persistently slower (an older GPU, a CPU-bound node, a
throttled part): in synchronous training everyone runs at its speed, and with one rank at
half speed the others idle half of every step. Giving each rank work in proportion to its
speed keeps synchronous semantics and lets the ranks finish together (LB-BSP, Cannikin).

Pure: no I/O, no clock reads. From the same :class:`~skewtrace.controller.window.JobWindow` the
pacing policy reads, a rank's own work per step is

    compute = step time - wait at barriers - pacing delay      (per step, over the window)

(``training.step.duration`` minus ``training.rank.wait`` counted once per step, minus the
delay the pacer asked of it, so that pacing never reads as slowness). With the share ``s`` the
rank ran with, its speed is ``s / compute`` (fractions of the global batch per second), and
the target shares are the speeds normalised to 1, none below ``rebalance_floor`` times the
equal share. Shares change only when the target would shorten the step (the largest compute,
under the model compute = share / speed) by ``rebalance_threshold`` or more, held for
``rebalance_hold_s``; a change moves every share the same fraction of the way, at most
``rebalance_max_step`` of the equal share for any rank, so the shares still sum to 1 and stay
above the floor; and after a change nothing moves for ``rebalance_settle_s``, until the
window holds only steps run with the new shares. A per-step cost that does not grow with the
batch (the optimizer, a fixed collective) makes a speed estimate err toward equal; the loop
then converges in more than one change, to shares where the computes are equal. The global
batch size is the rank side's business (:mod:`skewtrace.rank.rebalance_sampler`): it turns
shares into integer batch sizes summing to it. See ``docs/rebalancing.md``.
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
from skewtrace.controller.policies.base import Outcome, ServiceSettings
from skewtrace.controller.window import JobWindow, RankWindow, declined

REASON_INSUFFICIENT_RANKS = "insufficient_ranks"
REASON_INCOMPLETE = "incomplete"
REASON_NO_COMPUTE_TIME = "no_compute_time"
REASON_BALANCED = "balanced"
REASON_IMBALANCED = "imbalanced"
REASON_REBALANCED = "rebalanced"
REASON_SETTLING = "settling"
REASON_RANKS_CHANGED = "ranks_changed"

REASON_REBALANCING = "rebalancing"
"""What the other policies of a composition say while they are held off: the shares changed
less than a settle time ago (:attr:`~skewtrace.controller.policies.base.Outcome.hold`)."""

_UNSETTLED = (REASON_REBALANCED, REASON_SETTLING, REASON_RANKS_CHANGED)


@dataclass(frozen=True)
class RebalanceParams:
    """How the rebalancing policy reacts; the defaults are the ``skewtrace pacer`` defaults.

    Every field is a ``skewtrace pacer`` flag (``skewtrace.cli``); the docstrings are its help.
    """

    rebalance_floor: float = option(0.25, check=fraction)
    """A rank's share never falls below this fraction of the equal share (1 / ranks)."""

    rebalance_max_step: float = option(0.5, check=positive)
    """The most one decision moves any rank's share, as a fraction of the equal share."""

    rebalance_threshold: float = option(0.05, check=positive)
    """Shares change only when the new ones are predicted to shorten the step's compute by
    at least this fraction (a dead band: noise does not move them)."""

    rebalance_hold_s: float = option(2.0, check=non_negative, seconds=True)
    """The predicted gain must stay above ``rebalance_threshold`` this long before shares
    change."""

    rebalance_settle_s: float = option(10.0, check=positive, seconds=True)
    """After a change, shares stay as they are at least this long, so that the window holds
    only steps run with them; must exceed ``window_s`` plus the ranks' lag (a poll, a sync
    point, the span export and the Collector's metrics flush)."""

    rebalance_min_steps: int = option(3, parse=integer, check=at_least(1))
    """A rank with fewer steps in the window is not judged; shares hold until every rank that
    has a share is judged again (with long steps, lengthen ``window_s``)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.rebalance_threshold >= 1:
            raise FieldError("rebalance_threshold", "must be below 1")


def check_with_service(params: RebalanceParams, service: ServiceSettings) -> None:
    """With ``--policy rebalance``: the settle time must outlast the window (a window after a
    change must hold only steps run with the new shares)."""
    if not params.rebalance_settle_s > service.window_s:
        raise FieldError("rebalance_settle_s", "must exceed {0} (and the ranks' lag)", "window_s")


@dataclass(frozen=True)
class RebalanceState:
    """What one rebalancing decision hands to the next."""

    shares: Mapping[int, float] = field(default_factory=dict)
    """The published shares; empty: equal shares (nothing published yet)."""

    changed_at: float | None = None
    """When the shares last changed."""

    crossing_since: float | None = None
    """Since when the predicted gain has been above the threshold on settled windows."""

    changes: int = 0
    """How many times the shares changed (the body's ``shares_version``)."""


@dataclass(frozen=True)
class RebalanceDecision:
    shares: Mapping[int, float]
    """The shares in force after this decision; empty: equal shares."""

    target: Mapping[int, float]
    """The shares the speeds call for (empty without enough data)."""

    compute: Mapping[int, float]
    """Each judged rank's own work per step, seconds."""

    gain: float | None
    """Predicted fraction of the step's compute the target shares would save."""

    reason: str
    state: RebalanceState


def compute_per_step(window: RankWindow) -> float:
    """The rank's own work per step: step time minus barrier wait minus pacing delay.

    The wait is the sum of the window's ``steps`` largest waits when the histogram's buckets
    give it (``RankWindow.wait_top_sum_s``): with DDP's overlapping gradient buckets a step's
    waits happen at once, and after the step's one long wait the later collectives (a loss
    all-reduce) wait a moment each; pacing's once-per-step estimate averages those moments in
    and would halve the wait, making fast ranks look slow.
    """
    if window.steps <= 0:
        return math.nan
    step = window.step_time_sum_s / window.steps
    if window.wait_top_sum_s is not None:
        wait = window.wait_top_sum_s / window.steps
    else:
        wait = window.wait_per_step_s
    return step - wait - window.applied_delay_s


def floored_shares(weights: Mapping[int, float], floor: float) -> dict[int, float]:
    """Shares proportional to ``weights``, summing to 1, none below ``floor`` (water-filling:
    ranks that would fall below it get exactly ``floor`` and the rest share what is left)."""
    free = dict(weights)
    fixed: dict[int, float] = {}
    shares: dict[int, float] = {}
    while free:
        mass = 1.0 - floor * len(fixed)
        total = sum(free.values())
        shares = {r: mass * w / total for r, w in free.items()}
        low = [r for r, s in shares.items() if s < floor]
        if not low:
            break
        for rank in low:
            fixed[rank] = floor
            del free[rank]
        shares = {}
    return {**fixed, **shares}


def decide(
    window: JobWindow, previous: RebalanceState, params: RebalanceParams
) -> RebalanceDecision:
    """The next rebalancing decision for one job; see the module docstring."""
    now = window.now
    reason = declined(window)
    if reason is not None:
        # Shares are for ranks of stable, different speeds; a stage's partition or the data's
        # lengths are not fixed by them (and would read as speeds). Shares stay as they are.
        return _hold(previous, reason)
    judged = {r: w for r, w in window.ranks.items() if w.steps >= params.rebalance_min_steps}
    if len(judged) < 2:
        return _hold(previous, REASON_INSUFFICIENT_RANKS)
    if previous.shares and not set(judged) <= set(previous.shares):
        # A rank that never had a share: the job is not the one the shares were made for
        # (restarted with more ranks). Back to equal shares, as a change.
        state = RebalanceState({}, now, None, previous.changes + 1)
        return RebalanceDecision({}, {}, {}, None, REASON_RANKS_CHANGED, state)
    if previous.shares and set(judged) != set(previous.shares):
        # Some ranks are not judged in this window (their metrics are late): hold.
        return _hold(previous, REASON_INCOMPLETE)

    count = len(judged)
    current = {r: previous.shares.get(r, 1.0 / count) for r in judged}
    compute = {r: compute_per_step(w) for r, w in judged.items()}
    if not all(math.isfinite(c) and c > 0 for c in compute.values()):
        return _hold(previous, REASON_NO_COMPUTE_TIME, compute=compute)

    speed = {r: current[r] / compute[r] for r in judged}
    target = floored_shares(speed, params.rebalance_floor / count)
    step_now = max(compute.values())
    step_target = max(target[r] / speed[r] for r in judged)
    gain = 1.0 - step_target / step_now

    # A stretched window (long steps) must hold only steps run with the new shares too.
    settle_s = params.rebalance_settle_s + window.stretch_s
    if previous.changed_at is not None and now - previous.changed_at < settle_s:
        state = RebalanceState(previous.shares, previous.changed_at, None, previous.changes)
        return RebalanceDecision(previous.shares, target, compute, gain, REASON_SETTLING, state)
    if gain < params.rebalance_threshold:
        state = RebalanceState(previous.shares, previous.changed_at, None, previous.changes)
        return RebalanceDecision(previous.shares, target, compute, gain, REASON_BALANCED, state)
    since = previous.crossing_since if previous.crossing_since is not None else now
    if now - since < params.rebalance_hold_s:
        state = RebalanceState(previous.shares, previous.changed_at, since, previous.changes)
        return RebalanceDecision(previous.shares, target, compute, gain, REASON_IMBALANCED, state)

    shares = _step_toward(current, target, params.rebalance_max_step / count)
    state = RebalanceState(shares, now, None, previous.changes + 1)
    return RebalanceDecision(shares, target, compute, gain, REASON_REBALANCED, state)


def _step_toward(
    current: Mapping[int, float], target: Mapping[int, float], max_step: float
) -> dict[int, float]:
    """Move every share the same fraction of the way to its target, no share by more than
    ``max_step``. A convex combination of two share vectors sums to 1 and keeps the floor
    both respect."""
    largest = max(abs(target[r] - current[r]) for r in current)
    fraction_of_way = 1.0 if largest <= max_step else max_step / largest
    moved = {r: current[r] + fraction_of_way * (target[r] - current[r]) for r in current}
    total = sum(moved.values())
    return {r: s / total for r, s in sorted(moved.items())}


def _hold(
    previous: RebalanceState, reason: str, *, compute: Mapping[int, float] | None = None
) -> RebalanceDecision:
    state = RebalanceState(previous.shares, previous.changed_at, None, previous.changes)
    return RebalanceDecision(previous.shares, {}, compute or {}, None, reason, state)


class RebalancePolicy:
    """The rebalancing policy behind the service's policy interface (``--policy rebalance``)."""

    name = "rebalance"

    def __init__(self, params: RebalanceParams) -> None:
        self.params = params

    def initial_state(self) -> RebalanceState:
        return RebalanceState()

    def decide(self, window: JobWindow, previous: RebalanceState) -> Outcome:
        decision = decide(window, previous, self.params)
        return Outcome(
            reason=decision.reason,
            state=decision.state,
            shares=decision.shares,
            ranks=len(decision.compute),
            hold=REASON_REBALANCING if decision.reason in _UNSETTLED else None,
            info={
                "rebalance": {
                    "reason": decision.reason,
                    "gain": None if decision.gain is None else round(decision.gain, 4),
                    "changes": decision.state.changes,
                }
            },
        )
