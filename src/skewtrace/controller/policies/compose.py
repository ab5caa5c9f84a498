"""Several policies on one job (``--policy pacing,rebalance``): :class:`ComposedPolicy`.

The registry (:func:`skewtrace.controller.policies.build_policy`) composes the chosen
policies in registry order. Each decides on the same window with its own state, and neither
reads the other's effect as its own signal:

- a policy whose decision is still settling for the ranks (:attr:`Outcome.hold
  <skewtrace.controller.policies.base.Outcome.hold>`: rebalancing's new shares) holds the
  others off: no delays, their state reset, its ``hold`` as their reason. Their windows
  would mix steps from before and after the change, and the earliness pacing paced may be
  gone. Once it is settled (balanced, or at its floor) the others decide as they do alone;
- the window already separates the policies' effects: a rank's ``applied_delay_s`` is what
  pacing asked of it, which rebalancing takes out of its compute
  (:func:`~skewtrace.controller.policies.rebalance.compute_per_step`), so a paced rank does
  not look slower and lose share.

  Not yet for interleave's offsets: a group held by its offset arrives that much later at a
  collective shared with unheld ranks (one job's halves at their world all-reduce), and
  pacing, which adds back only its own delays, reads the others as early and delays them
  until its effect guard judges ``no_gain`` (docs/evaluation.md, "A gather that fills the
  link": one minute of a 3-minute run, the composition still +16.7%).

One outcome comes out: the first policy's reason (the others say theirs in their own blocks,
e.g. ``rebalance.reason``), ``active`` when any is, every policy's delays (the largest where
two delay one rank), the first shares and spread decided, the most ranks judged, and every
policy's informational blocks (pacing's ``effect``, rebalancing's ``rebalance``: before the
restructure the first policy's were dropped, so a composed job published no effect gauge;
a block two policies both add, the guarded pacing's and interleave's ``effect``, is the
later one's under its name, ``interleave.effect``).
"""

from __future__ import annotations

from typing import Any

from skewtrace.controller.policies.base import ControllerPolicy, Outcome
from skewtrace.controller.window import JobWindow


class ComposedPolicy:
    """The given policies, in the given (registry) order, on one job; see the module
    docstring."""

    def __init__(self, *policies: ControllerPolicy) -> None:
        if len(policies) < 2:
            raise ValueError("a composition needs two policies or more")
        self.policies = policies
        self.name = ",".join(policy.name for policy in policies)

    def initial_state(self) -> tuple[Any, ...]:
        return tuple(policy.initial_state() for policy in self.policies)

    def decide(self, window: JobWindow, previous: tuple[Any, ...]) -> Outcome:
        outcomes = [
            policy.decide(window, state)
            for policy, state in zip(self.policies, previous, strict=True)
        ]
        hold = next((o.hold for o in outcomes if o.hold is not None), None)
        if hold is not None:
            # Pure policies: deciding a held one and dropping its outcome changes nothing.
            outcomes = [
                o if o.hold is not None else Outcome(reason=hold, state=policy.initial_state())
                for policy, o in zip(self.policies, outcomes, strict=True)
            ]
        delays: dict[int, float] = {}
        for outcome in outcomes:
            for rank, delay in outcome.delays.items():
                delays[rank] = max(delays.get(rank, delay), delay)
        info: dict[str, Any] = {}
        for policy, outcome in zip(self.policies, outcomes, strict=True):
            for key, value in outcome.info.items():
                # Two guarded policies both say ``effect``: the later one's under its name.
                info[f"{policy.name}.{key}" if key in info else key] = value
        return Outcome(
            reason=outcomes[0].reason,
            state=tuple(o.state for o in outcomes),
            active=any(o.active for o in outcomes),
            delays=delays,
            shares=next((o.shares for o in outcomes if o.shares is not None), None),
            balance=next((o.balance for o in outcomes if o.balance is not None), None),
            spread=next((o.spread for o in outcomes if o.spread is not None), None),
            ranks=max(o.ranks for o in outcomes),
            info=info,
            searching=any(o.searching for o in outcomes),
        )
