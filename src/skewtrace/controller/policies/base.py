"""What a controller policy is to the service: a job's window in, an :class:`Outcome` out.

Every policy (``pacing`` in :mod:`~skewtrace.controller.policies.pacing`, ``rebalance`` in
:mod:`~skewtrace.controller.policies.rebalance`, and their composition in
:mod:`~skewtrace.controller.policies.compose`) is an object with a ``name``, an
``initial_state()`` and a pure ``decide(window, previous)``: no I/O, no clock reads, no
randomness; the state it returns is handed back on the next tick and is opaque to the
service. The service turns an :class:`Outcome` into the decision body served at
``GET /v1/pacing?job=ID`` (:mod:`skewtrace.decision`), so a new policy is a new
module in this package and one entry in :data:`skewtrace.controller.policies.POLICIES`; the
service, the HTTP API and the rank client keep their shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from skewtrace.controller.window import JobWindow


@dataclass(frozen=True)
class Outcome:
    """One policy decision for one job, in the terms of the decision body."""

    reason: str
    """Why the decision is what it is (the body's ``reason``)."""

    state: Any
    """Handed back to the same policy's next ``decide``."""

    active: bool = False
    """Pacing is on (the body's ``active``, which every rank client reads)."""

    delays: Mapping[int, float] = field(default_factory=dict)
    """Delay per rank in seconds (0 or absent: none)."""

    shares: Mapping[int, float] | None = None
    """Each rank's fraction of the global batch, summing to 1. ``None``: the policy does not
    decide shares (the body has no ``shares``); empty: equal shares, nothing published yet."""

    balance: str | None = None
    """How each global batch is split over the ranks (the work-balance policy's): ``work`` or
    ``count``; None: the policy does not decide it (the body has no ``balance``)."""

    spread: float | None = None
    """Pacing's natural arrival spread over mean step time (informational)."""

    ranks: int = 0
    """Ranks the decision judged."""

    info: Mapping[str, Any] = field(default_factory=dict)
    """Further informational fields for the body, JSON-serialisable, keyed by field name."""

    searching: bool = False
    """The policy is still searching for its setting (the interleave policy's period coming
    down from the collided step time): the effect guard runs its phase with the decision
    published on until the search is done (at most ``effect_recheck_s``), so that the gain it
    measures is the setting's, not the search's. Not on the body."""

    hold: str | None = None
    """Set while what this decision changed for the ranks is still settling (rebalancing's
    new shares): in a composition the other policies are held off this tick (no delays,
    their state reset), with this as their reason; their windows mix steps from before and
    after the change. Not on the body."""


class ServiceSettings(Protocol):
    """What a policy's parameters may be checked against (:attr:`PolicySpec.check
    <skewtrace.controller.policies.PolicySpec.check>`): the service's settings
    (:class:`~skewtrace.controller.config.PacerConfig`)."""

    @property
    def window_s(self) -> float:
        """How far back each decision looks at the metrics received."""


class ControllerPolicy(Protocol):
    """A controller policy; see the module docstring."""

    name: str

    def initial_state(self) -> Any:
        """The state a job starts from (no decision yet)."""

    def decide(self, window: JobWindow, previous: Any) -> Outcome:
        """The next decision for one job from its window and the previous state."""
