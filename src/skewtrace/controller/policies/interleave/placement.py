"""Placement: where each unit's phases go so that they overlap the least, for one job's
offsets and for a schedule's turns. Pure, from :class:`~.units.Unit`:

- **alone**: a phase's duration without the collision, estimated as its observed duration over
  the number of units whose observed phases overlap it on a shared switch (itself included):
  exact for equal units that overlap entirely on an uplink that carries one unit at full rate;
- **offsets** (:func:`place`): units in order of their first phase as it starts now (its
  natural start, the observed start minus the offset it was given, plus that offset: units
  that start together but for noise keep their order, the one holding its offset), the first
  at 0; each next one at the offset in ``[0, max_offset]``, among 0 and the ends of placed
  phases, that leaves the least overlap (alone durations, natural starts) with the placed
  units on a shared switch, the smallest within ``interleave_min_overlap_s`` of the least
  (the unit pays its offset on its own path), and 0 unless it takes at least
  ``interleave_min_overlap_s`` of overlap away. The policy places anew at every decision:
  offsets kept in force while about as good can lock in a bad placement;
- **turns** (:func:`spread`, a schedule's): the units take turns around the period, each a
  share in proportion to its longest phase alone, in order of natural start (then job and
  name); a group's slot is its unit's turn minus that phase's natural start
  (:attr:`~.schedule.Schedule.slots`), so the phases keep their spacing at any period.

Why each rule, and what showed it: docs/pacing.md, "Interleaving: why the schedule is built
this way".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from skewtrace.controller.policies.interleave.params import RESOLUTION_S, InterleaveParams
from skewtrace.controller.policies.interleave.units import Unit


def _ms(seconds: float) -> int:
    """A time to the resolution, for ordering units (ties broken by name, not by float
    noise in a start minus its offset)."""
    return round(seconds / RESOLUTION_S)


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


def total_overlap(
    mine: Sequence[tuple[float, float]],
    offset: float,
    theirs: Sequence[tuple[float, float]],
    period: float = 0.0,
) -> float:
    """Overlap of ``mine`` shifted by ``offset`` with ``theirs``; with a ``period`` (a
    schedule) also with their phases one period before and after."""
    shifts = (0.0,) if period <= 0 else (-period, 0.0, period)
    return sum(
        _overlap((start + offset, duration), (other[0] + shift, other[1]))
        for start, duration in mine
        for other in theirs
        for shift in shifts
    )


def place(
    all_units: Sequence[Unit], params: InterleaveParams, period: float = 0.0
) -> tuple[dict[tuple[str, str], float], float, float]:
    """Offsets by (job, group name) for units that cross the spine, and the phase overlap per step
    (seconds, summed over pairs of phases on a shared switch) without and with them; with a
    ``period`` the phases repeat every period (a schedule) and offsets stay below it."""
    crossing = [u for u in all_units if u.crosses]
    phases = alone_durations(crossing)
    # In order of where their first phases start now (natural start plus the offset given):
    # units whose natural starts are equal but for noise keep their order, and the one
    # holding keeps its offset, instead of noise handing it from one to the other
    # (docs/pacing.md, "Interleaving: why the schedule is built this way").
    order = sorted(
        range(len(crossing)),
        key=lambda i: (
            _ms(min(p[0] for p in phases[i]) + crossing[i].applied_offset_s),
            crossing[i].job,
            crossing[i].pgs,
        ),
    )
    bound = params.interleave_max_offset_s
    if period > 0:
        bound = min(bound, period - RESOLUTION_S)
    offsets: dict[tuple[str, str], float] = {}
    placed: list[tuple[Unit, list[tuple[float, float]]]] = []
    before = after = 0.0
    for i in order:
        unit, mine = crossing[i], phases[i]
        theirs = [p for other, shifted in placed if other.switches & unit.switches for p in shifted]
        candidates = {0.0, bound}
        for end in (start + duration for start, duration in theirs):
            for start, _ in mine:
                if 0 < end - start <= bound:
                    candidates.add(round(end - start, 6))
        unshifted = total_overlap(mine, 0.0, theirs, period)
        least = min(total_overlap(mine, c, theirs, period) for c in candidates)
        # The smallest offset within the threshold of the least overlap (an offset costs the
        # unit its own time), and none unless it takes at least the threshold away.
        best = min(
            c
            for c in candidates
            if total_overlap(mine, c, theirs, period) <= least + params.interleave_min_overlap_s
        )
        if unshifted - total_overlap(mine, best, theirs, period) < params.interleave_min_overlap_s:
            best = 0.0
        # Up to the resolution: rounded down, a shift would leave a sliver of the overlap.
        best = round(math.ceil(best / RESOLUTION_S - 1e-6) * RESOLUTION_S, 6)
        before += unshifted
        after += total_overlap(mine, best, theirs, period)
        for pg in unit.pgs:
            offsets[(unit.job, pg)] = best
        placed.append((unit, [(start + best, duration) for start, duration in mine]))
    return offsets, before, after


def spread(
    crossing: Sequence[Unit], alone: Sequence[Sequence[tuple[float, float]]]
) -> dict[tuple[str, str], tuple[float, float]]:
    """Turns that make the units take turns around the period: in order of natural start
    (then job and name), each unit's longest phase starts where the one before's share of
    the period ends, a share in proportion to its phase (alone) over all of theirs."""
    mains = [max(phases, key=lambda p: p[1]) for phases in alone]
    order = sorted(
        range(len(crossing)),
        key=lambda i: (_ms(min(p[0] for p in alone[i])), crossing[i].job, crossing[i].pgs),
    )
    total = sum(mains[i][1] for i in order) or 1.0
    turns: dict[tuple[str, str], tuple[float, float]] = {}
    turn = 0.0
    for i in order:
        for pg in crossing[i].pgs:
            turns[(crossing[i].job, pg)] = (round(turn, 6), mains[i][0])
        turn += mains[i][1] / total
    return dict(sorted(turns.items()))


def natural_step(unit: Unit, alone: Sequence[tuple[float, float]]) -> float:
    """The unit's step time without the collision: its job's step time minus what sharing
    the uplink added to its phases (0 when the step time is not known)."""
    if unit.step_s <= 0:
        return 0.0
    added = sum(observed[1] - mine[1] for observed, mine in zip(unit.observed, alone, strict=True))
    return max(unit.step_s - added, 0.0)
