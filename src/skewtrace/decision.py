"""The decision body: what ``GET /v1/pacing?job=ID`` answers, typed, for the server and the ranks.

::

    {"job": "run-42", "version": 17, "active": true, "delays": {"0": 0.0101, "2": 0.0102},
     "spread": 0.231, "reason": "active", "ranks": 4, "policy": "pacing",
     "updated_unix": 1764424000.1, "body_version": 1}

The service (:mod:`skewtrace.controller.service`) builds a :class:`DecisionBody` per job from
its policy's outcome and serves :meth:`DecisionBody.to_json`; the rank client
(:mod:`skewtrace.rank.pacing_client`) reads an answer with :meth:`DecisionBody.from_json`.

The interleave policy (``--policy interleave``) adds ``offsets`` (``{pg: seconds}``: a rank
holds the largest of its groups' before every forward) or, for groups of several jobs, a
``schedule`` (``{"period_s": P, "slots": {pg: seconds}, "late_s": L}``: a rank of a listed
group holds until the controller's clock reaches its slot modulo ``P``, and a step more than
``L`` past its slot waits for the next one; :meth:`DecisionBody.hold_for`).
``served_unix`` is the pacer's wall clock when it served the answer, from which a rank
estimates its clock's offset to the pacer's (half the round trip is the error bound). A
malformed ``offsets`` or ``schedule`` costs the hold only, never the delay.

Compatibility. Fields are only ever added. A rank client reads ``version``, ``active`` and
``delays`` (and ``shares`` / ``shares_version`` for rebalancing) and ignores the rest, so a
client of any release reads the body of any other. ``body_version`` (:data:`BODY_VERSION`)
says which fields a body may have; a body without it (a pacer from before it) is version 1,
the same fields. ``version`` is the decision's own counter (it changes with ``active``, the
delays or the shares), not the format's.

Reading is tolerant the way the rank has always read: unknown fields are ignored; an
informational field that is missing or of the wrong type is left at its default (None); a
malformed ``shares`` costs the shares only (equal shares), never the delay. What a rank needs
to apply a delay must be right: ``version`` an integer, ``active`` a boolean, ``delays`` an
object, ``body_version`` (when present) an integer, and, while active, the rank's own delay a
finite number. Otherwise :class:`DecisionError`: the client counts and logs the poll as failed
and applies no delay (fail open).

Standard library only: the training process imports this module through the rank client, and
must not import grpc, protobuf, the OTel SDK or the controller's servers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

BODY_VERSION = 4
"""The format of the bodies this release serves: the fields below. Absent on a body: 1.
2 added ``offsets``, ``schedule`` and ``served_unix``; 3 the schedule's ``late_s``; 4
``balance`` and ``balance_version``."""

BALANCE_WORK = "work"
"""The body's ``balance`` when each global batch is to be split by work."""
BALANCE_COUNT = "count"
"""... and when by count (as ``DistributedSampler``): before any imbalance, and withheld."""
BALANCE_MODES = (BALANCE_WORK, BALANCE_COUNT)
"""The body's ``balance``: each global batch split by work, or by count."""

STEP_AGE_PARAM = "step_age"
"""The poll's optional query parameter: seconds since the rank's current step started (the
pacer places the step on its own clock from it; pacers that do not read it ignore it)."""


class DecisionError(ValueError):
    """An answer that is not a usable decision: no delay (the client counts a failed poll)."""


def _number(value: Any) -> float | None:
    """A finite JSON number as a float, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return None
    return number if math.isfinite(number) else None


def _integer(value: Any) -> int | None:
    return None if isinstance(value, bool) or not isinstance(value, int) else value


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _rank_key(key: Any) -> int | None:
    """A rank written as JSON object keys are: decimal digits (``"0"``, ``"12"``), else None."""
    if isinstance(key, str) and key.isascii() and key.isdigit():
        return int(key)
    return None


def read_shares(raw: Any) -> dict[int, float] | None:
    """A body's ``shares`` as {rank: share}, as sent; None when absent or not usable.

    Usable: an object of non-negative rank numbers to finite non-negative numbers with a
    positive sum. Whether they cover the ranks of the job is the rank side's check
    (:mod:`skewtrace.rank.rebalance_sampler`), which knows the world size.
    """
    if not isinstance(raw, dict) or not raw:
        return None
    shares: dict[int, float] = {}
    for key, value in raw.items():
        rank, share = _rank_key(key), _number(value)
        if rank is None or share is None or share < 0:
            return None
        shares[rank] = share
    if not sum(shares.values()) > 0:
        return None
    return dict(sorted(shares.items()))


def read_balance(raw: Any) -> str | None:
    """A body's ``balance``: ``work`` or ``count``; None when absent or anything else (a rank
    then splits by count)."""
    return raw if isinstance(raw, str) and raw in BALANCE_MODES else None


def read_shares_version(value: Any) -> int:
    """A body's ``shares_version``: 0 when absent or not an integer."""
    found = _integer(value)
    return 0 if found is None else found


@dataclass(frozen=True)
class Effect:
    """The body's ``effect``: what the controller measured its pacing does to the step time
    (:mod:`skewtrace.controller.policies.effect`)."""

    state: str
    """``measuring``, ``kept`` or ``no_gain``."""

    gain: float
    """Mean gain in step time over the measured pairs, a fraction (positive: faster)."""

    low: float | None = None
    """One-sided 90% lower bound of the gain; None below two pairs."""

    high: float | None = None
    """One-sided 90% upper bound; None below two pairs."""

    pairs: int = 0
    """Paced/unpaced pairs measured."""

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "gain": self.gain,
            "low": self.low,
            "high": self.high,
            "pairs": self.pairs,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Effect | None:
        """None when absent or malformed (it is informational)."""
        if not isinstance(raw, dict):
            return None
        state, gain, pairs = (
            _text(raw.get("state")),
            _number(raw.get("gain")),
            _integer(raw.get("pairs")),
        )
        if state is None or gain is None or pairs is None:
            return None
        return cls(state, gain, _number(raw.get("low")), _number(raw.get("high")), pairs)


@dataclass(frozen=True)
class RebalanceStatus:
    """The body's ``rebalance``: the rebalancing policy's own view (``--policy rebalance``)."""

    reason: str
    """Rebalancing's reason (``balanced``, ``rebalanced``, ``settling``, ...); with
    ``pacing,rebalance`` the body's top-level ``reason`` is pacing's."""

    gain: float | None = None
    """Predicted fraction of the step's compute the target shares would save."""

    changes: int = 0
    """How many times the shares changed."""

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "gain": self.gain, "changes": self.changes}

    @classmethod
    def from_json(cls, raw: Any) -> RebalanceStatus | None:
        """None when absent or malformed (it is informational)."""
        if not isinstance(raw, dict):
            return None
        reason, changes = _text(raw.get("reason")), _integer(raw.get("changes"))
        if reason is None or changes is None:
            return None
        return cls(reason, _number(raw.get("gain")), changes)


def read_offsets(raw: Any) -> dict[str, float] | None:
    """A body's ``offsets`` (or a schedule's ``slots``) as {pg: seconds}; None when absent or
    not usable (not an object of names to finite numbers of at least 0)."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, float] = {}
    for key, value in raw.items():
        seconds = _number(value)
        if not isinstance(key, str) or not key or seconds is None or seconds < 0:
            return None
        out[key] = seconds
    return out


@dataclass(frozen=True)
class Schedule:
    """The body's ``schedule``: slots within a period shared by the jobs on one fabric."""

    period_s: float
    slots: Mapping[str, float]
    late_s: float | None = None
    """How late after its slot a step still runs at once (body version 3); a step later than
    that waits for its next slot. None (absent, a pacer of before, or malformed): half the
    period, the rule of body version 2."""

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"period_s": self.period_s, "slots": dict(self.slots)}
        if self.late_s is not None:
            body["late_s"] = self.late_s
        return body

    @classmethod
    def from_json(cls, raw: Any) -> Schedule | None:
        """None when absent or malformed (a positive period, slots in [0, period)); a
        malformed ``late_s`` (not a number in [0, period)) is read as absent."""
        if not isinstance(raw, dict):
            return None
        period, slots = _number(raw.get("period_s")), read_offsets(raw.get("slots"))
        if period is None or not period > 0 or slots is None:
            return None
        if any(slot >= period for slot in slots.values()):
            return None
        late = _number(raw.get("late_s"))
        if late is not None and not 0 <= late < period:
            late = None
        return cls(period, slots, late)

    def run_late_within(self) -> float:
        """How late after its slot a step runs at once: ``late_s``, or half the period."""
        return self.period_s / 2 if self.late_s is None else self.late_s


@dataclass(frozen=True)
class DecisionBody:
    """One job's decision as served; see the module docstring.

    A job the pacer does not know (yet, or any more) is answered ``DecisionBody(job)``:
    version 0, inactive, no delays, nothing else but ``body_version``.
    """

    job: str
    version: int = 0
    """The decision's version: changes whenever ``active``, a delay (by 0.1 ms or more) or the
    shares change. Ranks put it on their ``pacing.delay`` spans."""

    active: bool = False
    """Pacing is on; while it is off no rank applies a delay."""

    delays: Mapping[int, float] = field(default_factory=dict)
    """Delay per rank in seconds, only ranks with one above 0 (a rank not listed gets none)."""

    spread: float | None = None
    """Pacing's natural arrival spread over the mean step time (null without an estimate).
    Served with ``reason``: absent from the answer for an unknown job."""

    reason: str | None = None
    """Why the decision is what it is (``active``, ``below_threshold``, ``measuring``, ...)."""

    ranks: int | None = None
    """Ranks the decision judged."""

    policy: str | None = None
    """The policies that decide for the job: the canonical ``--policy``, or its ``--job-policy``
    entry's."""

    updated_unix: float | None = None
    """When the decision was made (the pacer's wall clock, seconds since the epoch)."""

    shares: Mapping[int, float] | None = None
    """Each rank's fraction of the global batch (6 decimals as served; the rank side
    normalises); None: equal shares (absent from the body)."""

    shares_version: int | None = None
    """Changes exactly when the shares do; None: the policy does not decide shares (absent)."""

    effect: Effect | None = None
    rebalance: RebalanceStatus | None = None

    balance: str | None = None
    """How each global batch is split over the ranks: ``work`` or ``count`` (the work-balance
    policy's); None: the policy does not decide it (absent; a rank splits by count)."""

    balance_version: int | None = None
    """Changes exactly when ``balance`` does; None with it."""

    offsets: Mapping[str, float] | None = None
    """The interleave policy's per-group holds within one job (None: absent)."""

    schedule: Schedule | None = None
    """The interleave policy's schedule for groups of several jobs (None: absent)."""

    served_unix: float | None = None
    """The pacer's wall clock when it served the body (set at serving)."""

    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further informational blocks a policy adds (server side; :meth:`from_json` ignores
    fields it does not know)."""

    body_version: int = BODY_VERSION

    malformed_delays: Mapping[int, str] = field(default_factory=dict)
    """Client side: ranks whose delay was not a finite number, with the value's repr. Only the
    rank itself minds (:meth:`delay_for`), as a rank always has."""

    # ------------------------------------------------------------------ server side

    def to_json(self) -> dict[str, Any]:
        """The JSON object served (key order kept: the fields of before, then the new ones)."""
        body: dict[str, Any] = {
            "job": self.job,
            "version": self.version,
            "active": self.active,
            "delays": {str(rank): delay for rank, delay in self.delays.items()},
        }
        if self.reason is not None:
            body["spread"] = self.spread
            body["reason"] = self.reason
            body["ranks"] = self.ranks
            body["policy"] = self.policy
            body["updated_unix"] = self.updated_unix
        if self.shares_version is not None:
            if self.shares:
                body["shares"] = {str(rank): share for rank, share in self.shares.items()}
            body["shares_version"] = self.shares_version
        if self.balance is not None:
            body["balance"] = self.balance
            body["balance_version"] = self.balance_version or 0
        if self.effect is not None:
            body["effect"] = self.effect.to_json()
        if self.rebalance is not None:
            body["rebalance"] = self.rebalance.to_json()
        if self.offsets is not None:
            body["offsets"] = dict(self.offsets)
        if self.schedule is not None:
            body["schedule"] = self.schedule.to_json()
        body.update(self.extra)
        if self.served_unix is not None:
            body["served_unix"] = self.served_unix
        body["body_version"] = self.body_version
        return body

    # ------------------------------------------------------------------ client side

    @classmethod
    def from_json(cls, obj: Any) -> DecisionBody:
        """A parsed JSON answer as a body; :class:`DecisionError` when a rank cannot use it."""
        if not isinstance(obj, dict):
            raise DecisionError("pacer answer is not a JSON object")
        version, active, raw_delays = (
            _integer(obj.get("version")),
            obj.get("active"),
            obj.get("delays"),
        )
        if version is None:
            raise DecisionError("pacer answer has no integer 'version'")
        if not isinstance(active, bool):
            raise DecisionError("pacer answer has no boolean 'active'")
        if not isinstance(raw_delays, dict):
            raise DecisionError("pacer answer has no 'delays' object")
        raw_body_version = obj.get("body_version", 1)
        body_version = _integer(raw_body_version)
        if body_version is None:
            raise DecisionError(
                f"pacer answer's 'body_version' is not an integer: {raw_body_version!r}"
            )
        delays: dict[int, float] = {}
        malformed: dict[int, str] = {}
        for key, value in raw_delays.items():
            rank = _rank_key(key)
            if rank is None or str(rank) != key:
                continue  # no rank would look it up
            delay = _number(value)
            if delay is None:
                malformed[rank] = repr(value)
            else:
                delays[rank] = delay
        shares_version = obj.get("shares_version")
        balance = read_balance(obj.get("balance"))
        return cls(
            job=_text(obj.get("job")) or "",
            version=version,
            active=active,
            delays=delays,
            spread=_number(obj.get("spread")),
            reason=_text(obj.get("reason")),
            ranks=_integer(obj.get("ranks")),
            policy=_text(obj.get("policy")),
            updated_unix=_number(obj.get("updated_unix")),
            shares=read_shares(obj.get("shares")),
            shares_version=None if shares_version is None else read_shares_version(shares_version),
            effect=Effect.from_json(obj.get("effect")),
            rebalance=RebalanceStatus.from_json(obj.get("rebalance")),
            balance=balance,
            balance_version=None
            if balance is None
            else read_shares_version(obj.get("balance_version")),
            offsets=read_offsets(obj.get("offsets")),
            schedule=Schedule.from_json(obj.get("schedule")),
            served_unix=_number(obj.get("served_unix")),
            body_version=body_version,
            malformed_delays=malformed,
        )

    def delay_for(self, rank: int, max_delay_s: float) -> float:
        """This rank's delay in [0, max_delay_s] (0 while inactive); :class:`DecisionError`
        when its own delay is not a finite number."""
        if not self.active:
            return 0.0
        if rank in self.malformed_delays:
            raise DecisionError(
                f"pacer delay for rank {rank} is not a finite number: {self.malformed_delays[rank]}"
            )
        return min(max(self.delays.get(rank, 0.0), 0.0), max_delay_s)

    def hold_for(
        self, groups: Iterable[str], controller_now_unix: float, max_delay_s: float
    ) -> float:
        """How long a rank in ``groups`` holds before its forward, in [0, max_delay_s]: its
        groups' largest ``offsets`` entry, or, under a ``schedule``, the time until the
        controller's clock (``controller_now_unix``) reaches its groups' latest slot modulo
        the period; 0 when the slot passed at most the schedule's ``late_s`` ago (half a
        period when the pacer sends none): a step that late runs at once, a later one waits
        for its next slot (a collision then ends in one slot instead of carrying on) unless
        ``max_delay_s`` is too short to reach it (then at once too); 0 while inactive, or
        when none of its groups is listed."""
        if not self.active:
            return 0.0
        names = set(groups)
        if self.schedule is not None:
            slots = [slot for pg, slot in self.schedule.slots.items() if pg in names]
            if not slots or not math.isfinite(controller_now_unix):
                return 0.0
            period = self.schedule.period_s
            wait = (max(slots) - controller_now_unix) % period
            late = period - wait if wait > 0 else 0.0
            if late and late <= self.schedule.run_late_within():
                return 0.0
            if late and late < period / 2 and wait > max_delay_s:
                # Late, and the rank's own cap cannot hold it to its next slot: a part of
                # the wait would only make it later. At once, as body version 2 had it.
                return 0.0
            return min(wait, max_delay_s)
        if self.offsets:
            mine = [offset for pg, offset in self.offsets.items() if pg in names]
            return min(max(mine, default=0.0), max_delay_s)
        return 0.0

    def normalised_shares(self) -> dict[int, float] | None:
        """The shares scaled to sum to 1 (None: equal shares)."""
        return normalise_shares(self.shares)


def normalise_shares(shares: Mapping[int, float] | None) -> dict[int, float] | None:
    """Shares scaled to sum to 1, by rank; None for none (equal shares) or a sum of 0."""
    if not shares:
        return None
    total = sum(shares.values())
    if not total > 0:
        return None
    return {rank: share / total for rank, share in sorted(shares.items())}
