"""A policy's outcome published as the decision body the ranks are served
(:class:`~skewtrace.decision.DecisionBody`): delays and shares rounded to what is
sent, versions that change only when a rank would act differently, and the policies' blocks
(``effect``, ``rebalance``, ``offsets``, ``schedule``) typed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from skewtrace.controller.policies.base import Outcome
from skewtrace.decision import (
    DecisionBody,
    Effect,
    RebalanceStatus,
    Schedule,
    read_offsets,
)

DELAY_RESOLUTION_S = 1e-4
"""Two decisions whose delays differ by less than this are the same decision (no new
version)."""

SHARE_RESOLUTION = 1e-6
"""Shares are published with 6 decimals; smaller moves are not changes."""


@dataclass
class PublishedDecision:
    """A job's decision as published: the policy's state for its next decision, and the
    body its ranks are served."""

    state: Any
    version: int
    body: DecisionBody
    json: dict[str, Any]
    """``body.to_json()``, made once per decision: what every poll is served."""
    shares_version: int = 0
    balance_version: int = 0


def publish(
    job_id: str,
    policy_name: str,
    decision: Outcome,
    previous: PublishedDecision | None,
    wall_clock: Callable[[], float],
) -> PublishedDecision:
    """What the job's ranks are served for ``decision``, the policy's outcome, after
    ``previous`` (None: the job's first): the body, with a new ``version`` when a rank would
    act differently (pacing turned on or off, a delay moved by :data:`DELAY_RESOLUTION_S` or
    more, new shares, offsets, schedule or split) and the previous delays kept otherwise, a new
    ``shares_version`` when the shares moved by :data:`SHARE_RESOLUTION` or more, and a new
    ``balance_version`` when the split (``balance``) changed.
    ``wall_clock`` stamps it (``updated_unix``)."""
    delays = {r: round(d, 6) for r, d in sorted(decision.delays.items()) if d > 0}
    shares = (
        None
        if decision.shares is None
        else {r: round(s, 6) for r, s in sorted(decision.shares.items())}
    )
    version = previous.version if previous else 0
    changed = previous is None or previous.body.active != decision.active
    if previous is not None and not changed:
        old = previous.body.delays
        changed = old.keys() != delays.keys() or any(
            abs(old[k] - delays[k]) >= DELAY_RESOLUTION_S for k in delays
        )
    shares_version = previous.shares_version if previous else 0
    old_shares = previous.body.shares if previous else None
    if shares and (
        old_shares is None
        or old_shares.keys() != shares.keys()
        or any(abs(old_shares[k] - shares[k]) >= SHARE_RESOLUTION for k in shares)
    ):
        shares_version += 1
    elif not shares and old_shares:
        shares_version += 1  # back to equal shares
    changed = changed or shares_version != (previous.shares_version if previous else 0)
    balance_version = previous.balance_version if previous else 0
    if decision.balance != (previous.body.balance if previous else None):
        if decision.balance is not None:
            balance_version += 1
        changed = True
    info = dict(decision.info)
    offsets = read_offsets(info.pop("offsets", None))
    schedule = Schedule.from_json(info.pop("schedule", None))
    if previous is not None and (
        previous.body.offsets != offsets or previous.body.schedule != schedule
    ):
        changed = True
    if changed:
        version += 1
    effect = info.pop("effect", None)
    rebalance = info.pop("rebalance", None)
    body = DecisionBody(
        job=job_id,
        version=version,
        active=decision.active,
        delays=delays if changed or previous is None else previous.body.delays,
        spread=None if decision.spread is None else round(decision.spread, 6),
        reason=decision.reason,
        ranks=decision.ranks,
        policy=policy_name,
        updated_unix=wall_clock(),
        # Absent while every rank has an equal share (nothing decided yet, or back to
        # equal): a rank that reads no shares uses equal ones.
        shares=shares or None,
        shares_version=None if shares is None else shares_version,
        effect=None if effect is None else Effect(**effect),
        rebalance=None if rebalance is None else RebalanceStatus(**rebalance),
        offsets=offsets,
        schedule=schedule,
        balance=decision.balance,
        balance_version=None if decision.balance is None else balance_version,
        extra=info,
    )
    return PublishedDecision(
        decision.state, version, body, body.to_json(), shares_version, balance_version
    )
