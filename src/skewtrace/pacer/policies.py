"""The controller policies a job can be given (``skewtrace pacer --policy NAME[,NAME]``).

- ``pacing`` (:mod:`skewtrace.pacer.policy`): delays ranks that persistently arrive early,
  kept only while its measured effect on the step time is a real gain
  (:mod:`skewtrace.pacer.effect`).
- ``rebalance`` (:mod:`skewtrace.pacer.rebalance`): each rank's share of the global batch.
- ``pacing,rebalance``: both, composed by :class:`ComposedPolicy`.

A new policy is a module with a class that follows
:class:`~skewtrace.pacer.controller.ControllerPolicy` and one entry in :data:`POLICIES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skewtrace.pacer.controller import ControllerPolicy, Outcome
from skewtrace.pacer.effect import EffectGuard
from skewtrace.pacer.policy import JobWindow, PacingPolicy, PolicyParams
from skewtrace.pacer.rebalance import (
    REASON_RANKS_CHANGED,
    REASON_REBALANCED,
    REASON_SETTLING,
    RebalanceParams,
    RebalancePolicy,
)

PACING = "pacing"
REBALANCE = "rebalance"

REASON_REBALANCING = "rebalancing"
"""Pacing held off in a composed decision: the shares changed less than a settle time ago."""


@dataclass(frozen=True)
class PolicyConfig:
    """The parameters every policy may read."""

    pacing: PolicyParams
    rebalance: RebalanceParams


POLICIES: dict[str, Callable[[PolicyConfig], ControllerPolicy]] = {
    PACING: lambda config: EffectGuard(PacingPolicy(config.pacing), config.pacing),
    REBALANCE: lambda config: RebalancePolicy(config.rebalance),
}
"""Every policy by its ``--policy`` name."""

_ORDER = {name: index for index, name in enumerate(POLICIES)}


def policy_names(raw: str) -> str:
    """``--policy`` text -> its canonical form (known names, in registry order, no repeats)."""
    names = {name.strip().lower() for name in raw.split(",") if name.strip()}
    if not names:
        raise ValueError(f"expected one or more of {', '.join(POLICIES)}, comma-separated")
    unknown = sorted(names - set(POLICIES))
    if unknown:
        raise ValueError(f"unknown policy {', '.join(unknown)} (known: {', '.join(POLICIES)})")
    return ",".join(sorted(names, key=_ORDER.__getitem__))


def known_policies(value: object) -> str | None:
    """The ``check`` of ``--policy``: a canonical list of known names."""
    try:
        ok = isinstance(value, str) and policy_names(value) == value
    except ValueError as exc:
        return str(exc)
    return None if ok else "expected known policy names, comma-separated, e.g. pacing,rebalance"


def build_policy(names: str, config: PolicyConfig) -> ControllerPolicy:
    """The policy object for a canonical ``--policy`` value."""
    chosen = names.split(",")
    if len(chosen) == 1:
        return POLICIES[chosen[0]](config)
    if chosen == [PACING, REBALANCE]:
        return ComposedPolicy(
            EffectGuard(PacingPolicy(config.pacing), config.pacing),
            RebalancePolicy(config.rebalance),
        )
    raise ValueError(f"no composition of {names}")


class ComposedPolicy:
    """Pacing and rebalancing on one job: shares from rebalancing, delays from pacing.

    Rebalancing goes first, pacing acts on what is left, and neither reads the other's
    effect as its own signal:

    - rebalancing subtracts the delays pacing asked for from each rank's step time
      (:func:`~skewtrace.pacer.rebalance.compute_per_step`), so a paced rank does not look
      slower and lose share;
    - pacing is held off (no delays, its state reset) while new shares settle: its window
      would mix steps from before and after the change, and the earliness it paced may be
      gone. Once rebalancing is settled (balanced, or at its floor) pacing decides as it
      does alone, on the arrivals the shares leave.
    """

    name = f"{PACING},{REBALANCE}"

    def __init__(self, pacing: ControllerPolicy, rebalance: RebalancePolicy) -> None:
        self.pacing = pacing
        self.rebalance = rebalance

    def initial_state(self) -> tuple[Any, Any]:
        return self.pacing.initial_state(), self.rebalance.initial_state()

    def decide(self, window: JobWindow, previous: tuple[Any, Any]) -> Outcome:
        pacing_state, rebalance_state = previous
        shares = self.rebalance.decide(window, rebalance_state)
        if shares.reason in (REASON_REBALANCED, REASON_SETTLING, REASON_RANKS_CHANGED):
            paced = Outcome(reason=REASON_REBALANCING, state=self.pacing.initial_state())
        else:
            paced = self.pacing.decide(window, pacing_state)
        return Outcome(
            reason=paced.reason,
            state=(paced.state, shares.state),
            active=paced.active,
            delays=paced.delays,
            shares=shares.shares,
            spread=paced.spread,
            ranks=max(paced.ranks, shares.ranks),
            info=shares.info,
        )
