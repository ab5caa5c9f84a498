"""The interleave policy (``--policy interleave``): offsets for process groups whose
communication phases collide on a shared uplink, so that the phases interleave.

Why: two groups whose transfers run at the same time over an uplink that carries one of them
at full rate each take twice as long (processor sharing); shifted by one phase's length they
each take it once. A group that starts its step later pays the offset on its own path, so an
offset pays only where the phase it takes out of the collision is exposed (not hidden behind
compute) and more than the offset itself, e.g. a group with a gather before forward and an
all-reduce after backward. Whether it pays is measured: the registry wraps the policy in the
effect guard (:mod:`~skewtrace.controller.policies.effect`), which keeps offsets only while the
job's step time shows a real gain.

The model, pure (no I/O, no clock, no randomness), from the window's
:class:`~skewtrace.controller.window.GroupPhases`:

- **units**: groups that share a host are tied (a delay before one rank's forward holds the
  host's other ranks at their tensor-parallel collective) and get one offset; a unit's phases
  are its groups' phases, its switches theirs. Units whose members sit behind one switch
  cross no uplink and are left alone;
- **alone**: a phase's duration without the collision, estimated as its observed duration over
  the number of units whose observed phases overlap it on a shared switch (itself included):
  exact for equal units that overlap entirely on an uplink that carries one unit at full rate;
- **placement**: units in order of their natural first phase (observed start minus the offset
  they were given), the first at 0; each next one at the offset in ``[0, max_offset]``, among 0
  and the ends of placed phases, that leaves the least overlap (alone durations, natural
  starts) with the placed units on a shared switch, the smallest within
  ``interleave_min_overlap_s`` of the least (the unit pays its offset on its own path), and 0
  unless it takes at least ``interleave_min_overlap_s`` of overlap away.

Its decision: ``offsets`` on the body, ``{pg: seconds}`` (a rank applies the largest offset of
its groups, before forward, where it applies its delay), with ``active`` while any offset is
set. Reasons: ``no_phases``, ``no_collision``, ``interleaving``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from skewtrace._options import at_least, check_fields, integer, non_negative, option, positive
from skewtrace.controller.policies.base import Outcome
from skewtrace.controller.window import GroupPhases, JobWindow

REASON_NO_PHASES = "no_phases"
"""No group with phases on the spine is known (the Collector sends none yet)."""
REASON_NO_COLLISION = "no_collision"
"""Groups' phases do not overlap on a shared uplink, or no offset within the bound helps."""
REASON_INTERLEAVING = "interleaving"
"""Offsets published."""

# Offsets are published to the millisecond: a sleep's own jitter is about that.
_RESOLUTION_S = 0.001


@dataclass(frozen=True)
class InterleaveParams:
    """How the interleave policy places groups; the defaults are the ``skewtrace pacer``
    defaults. Every field is a ``skewtrace pacer`` flag; the docstrings are its help."""

    interleave_max_offset_s: float = option(0.15, check=non_negative, seconds=True)
    """Upper bound on a group's offset (ranks also cap it, with their own maximum delay)."""

    interleave_min_overlap_s: float = option(0.005, check=non_negative, seconds=True)
    """An offset is given only where it takes at least this much phase overlap per step away."""

    interleave_effect_pairs: int = option(3, parse=integer, check=at_least(0))
    """Offsets stay only when this many phases with and without them show a real gain in step
    time (the effect guard, as for pacing: docs/pacing.md, 'Its own effect'); 0: no
    measurement."""

    interleave_effect_phase_s: float = option(10.0, check=positive, seconds=True)
    """Length of each phase with or without the offsets (keep it above window_s + 3 s)."""

    interleave_effect_backoff_s: float = option(600.0, check=positive, seconds=True)
    """After a measurement without a real gain, no offsets for this long (reason no_gain)."""

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def effect_pairs(self) -> int:
        return self.interleave_effect_pairs

    @property
    def effect_phase_s(self) -> float:
        return self.interleave_effect_phase_s

    @property
    def effect_min_gain(self) -> float:
        return 0.0

    @property
    def effect_backoff_s(self) -> float:
        return self.interleave_effect_backoff_s

    @property
    def effect_recheck_s(self) -> float:
        return self.interleave_effect_backoff_s / 2


@dataclass(frozen=True)
class Unit:
    """Groups that get one offset."""

    pgs: tuple[str, ...]
    switches: frozenset[str]
    observed: tuple[tuple[float, float], ...]
    """(start, duration) of its phases as observed."""
    applied_offset_s: float

    @property
    def crosses(self) -> bool:
        return len(self.switches) >= 2 or "many" in self.switches


def units(groups: Iterable[GroupPhases]) -> list[Unit]:
    """The window's groups, tied by shared hosts, that have phases; in name order."""
    groups = [g for g in groups if g.phases]
    parent = list(range(len(groups)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    by_host: dict[str, int] = {}
    for i, group in enumerate(groups):
        for host in group.hosts:
            j = by_host.setdefault(host, i)
            parent[root(i)] = root(j)
    members: dict[int, list[GroupPhases]] = {}
    for i, group in enumerate(groups):
        members.setdefault(root(i), []).append(group)
    out = []
    for tied in members.values():
        out.append(
            Unit(
                pgs=tuple(sorted(g.pg for g in tied)),
                switches=frozenset(s for g in tied for s in g.switches),
                observed=_merged(tied),
                applied_offset_s=max(g.applied_offset_s for g in tied),
            )
        )
    return sorted(out, key=lambda u: u.pgs)


def _merged(tied: Sequence[GroupPhases]) -> tuple[tuple[float, float], ...]:
    """A unit's phases: the k-th phase of its groups, the median start and duration, when
    they all have as many (a set's rails, tied by their hosts, run their phases together);
    else every group's phases."""
    counts = {len(g.phases) for g in tied}
    if len(counts) != 1:
        return tuple(sorted(p for g in tied for p in g.phases))
    return tuple(
        (
            statistics.median(g.phases[k][0] for g in tied),
            statistics.median(g.phases[k][1] for g in tied),
        )
        for k in range(counts.pop())
    )


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[0] + a[1], b[0] + b[1]) - max(a[0], b[0]))


def alone_durations(placed: Sequence[Unit]) -> list[tuple[tuple[float, float], ...]]:
    """Each unit's phases as (natural start, duration alone): see the module docstring."""
    out = []
    for unit in placed:
        phases = []
        for phase in unit.observed:
            sharing = 1 + sum(
                1
                for other in placed
                if other is not unit
                and other.switches & unit.switches
                and any(
                    _overlap(phase, theirs) >= 0.5 * min(phase[1], theirs[1])
                    for theirs in other.observed
                )
            )
            phases.append((phase[0] - unit.applied_offset_s, phase[1] / sharing))
        out.append(tuple(phases))
    return out


def _total_overlap(
    mine: Sequence[tuple[float, float]], offset: float, theirs: Sequence[tuple[float, float]]
) -> float:
    return sum(
        _overlap((start + offset, duration), other) for start, duration in mine for other in theirs
    )


def place(
    all_units: Sequence[Unit], params: InterleaveParams
) -> tuple[dict[str, float], float, float]:
    """Offsets by group name for units that cross the spine, and the phase overlap per step
    (seconds, summed over pairs of phases on a shared switch) without and with them."""
    crossing = [u for u in all_units if u.crosses]
    phases = alone_durations(crossing)
    order = sorted(
        range(len(crossing)), key=lambda i: (min(p[0] for p in phases[i]), crossing[i].pgs)
    )
    offsets: dict[str, float] = {}
    placed: list[tuple[Unit, list[tuple[float, float]]]] = []
    before = after = 0.0
    for i in order:
        unit, mine = crossing[i], phases[i]
        theirs = [p for other, shifted in placed if other.switches & unit.switches for p in shifted]
        candidates = {0.0, params.interleave_max_offset_s}
        for end in (start + duration for start, duration in theirs):
            for start, _ in mine:
                if 0 < end - start <= params.interleave_max_offset_s:
                    candidates.add(round(end - start, 6))
        unshifted = _total_overlap(mine, 0.0, theirs)
        least = min(_total_overlap(mine, c, theirs) for c in candidates)
        # The smallest offset within the threshold of the least overlap (an offset costs the
        # unit its own time), and none unless it takes at least the threshold away.
        best = min(
            c
            for c in candidates
            if _total_overlap(mine, c, theirs) <= least + params.interleave_min_overlap_s
        )
        if unshifted - _total_overlap(mine, best, theirs) < params.interleave_min_overlap_s:
            best = 0.0
        best = round(best / _RESOLUTION_S) * _RESOLUTION_S
        before += unshifted
        after += _total_overlap(mine, best, theirs)
        for pg in unit.pgs:
            offsets[pg] = best
        placed.append((unit, [(start + best, duration) for start, duration in mine]))
    return offsets, before, after


@dataclass(frozen=True)
class InterleaveState:
    """What one decision hands to the next: the offsets published."""

    offsets: Mapping[str, float] = field(default_factory=dict)


class InterleavePolicy:
    """The interleave policy behind the service's policy interface; see the module docstring."""

    name = "interleave"

    def __init__(self, params: InterleaveParams) -> None:
        self.params = params

    def initial_state(self) -> InterleaveState:
        return InterleaveState()

    def decide(self, window: JobWindow, previous: InterleaveState) -> Outcome:
        found = units(window.groups)
        if not any(u.crosses for u in found):
            return Outcome(reason=REASON_NO_PHASES, state=InterleaveState(), info={"offsets": {}})
        offsets, before, after = place(found, self.params)
        published = {pg: offset for pg, offset in sorted(offsets.items()) if offset > 0}
        info = {
            "offsets": published,
            "interleave": {
                "units": len([u for u in found if u.crosses]),
                "overlap_s": round(before, 4),
                "overlap_after_s": round(after, 4),
            },
        }
        reason = REASON_INTERLEAVING if published else REASON_NO_COLLISION
        return Outcome(
            reason=reason,
            state=InterleaveState(published),
            active=bool(published),
            info=info,
        )
