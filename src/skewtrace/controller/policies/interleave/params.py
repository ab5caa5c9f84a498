"""The interleave policy's settings (every one a ``skewtrace pacer`` flag) and the resolution
it publishes offsets, slots and periods to."""

from __future__ import annotations

from dataclasses import dataclass

from skewtrace._options import at_least, check_fields, integer, non_negative, option, positive

RESOLUTION_S = 0.001
"""Offsets, slots and periods are published to the millisecond: a sleep's own jitter is about
that."""


def round_period(seconds: float) -> float:
    """A period (or any time) to the resolution."""
    return round(round(seconds / RESOLUTION_S) * RESOLUTION_S, 6)


def below_one(value: object) -> str | None:
    """A fraction in [0, 1)."""
    if non_negative(value) is None and isinstance(value, (int, float)) and value < 1:
        return None
    return "must be a number in [0, 1)"


@dataclass(frozen=True)
class InterleaveParams:
    """How the interleave policy places groups; the defaults are the ``skewtrace pacer``
    defaults. Every field is a ``skewtrace pacer`` flag; the docstrings are its help."""

    interleave_max_offset_s: float = option(0.15, check=non_negative, seconds=True)
    """Upper bound on a group's offset (ranks also cap it, with their own maximum delay)."""

    interleave_min_overlap_s: float = option(0.005, check=non_negative, seconds=True)
    """An offset is given only where it takes at least this much phase overlap per step away."""

    interleave_period_margin: float = option(0.05, check=non_negative)
    """A schedule's period starts this fraction above the slowest job's step time (and is
    set this much above a job's steps that outgrew it): a slot comes round before its next
    step."""

    interleave_period_step: float = option(0.04, check=below_one)
    """While every job's steps wait for their slots, the period is shortened by this fraction
    once per ``interleave_settle_s`` (down to the slowest job's step without the collision);
    each trial that fails halves the step of the next, down to 1%."""

    interleave_settle_s: float = option(6.0, check=positive, seconds=True)
    """How long a new period runs before the steps under it are judged (keep it above
    window_s)."""

    interleave_collision_dilation: float = option(0.1, check=non_negative)
    """Once a schedule has held the jobs in their turns, a window without it is a collision
    only where some group's phases last at least this fraction longer than they did in
    their turns (jobs that stayed in their turns are left alone); before that, steps this
    fraction below those that asked for the schedule (it withheld) are jobs that left the
    collision, and a collision is then steps this fraction longer than the shortest seen
    since."""

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
