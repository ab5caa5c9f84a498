"""Change-point detection on one time series: the onset of a sustained level shift.

Pure Python (standard library), robust to outliers and to noise of any scale:

1. Samples whose value is NaN or infinite are dropped (a rate over a window with no samples,
   0/0 for a histogram mean with no observations).
2. For each candidate index ``k`` (at least ``min_before`` samples before it, at least
   ``min_after`` after it), the trailing baseline is up to ``baseline_points`` samples before
   ``k`` and the following window up to ``after_points`` samples from ``k``. The baseline's
   level is its median and its spread ``1.4826 * MAD`` (the standard deviation for Gaussian
   noise), floored at ``relative_floor * |median|`` and ``absolute_floor`` so that a series
   that is exactly flat does not make every wiggle infinitely significant.
3. ``k`` is a change when the following window's median is ``threshold`` spreads away from
   the baseline's median, the relative change is at least ``min_relative``, and at least
   ``persistence`` of the following window's samples are past the midpoint between the two
   levels (the shift persists; one spike does not move a median of several samples).
4. The earliest such ``k`` is the change. Its onset is the first sample of the new level:
   from the first sample past the midpoint, earlier samples are taken in while they are
   still ``threshold`` spreads away from the baseline (a rate over a window turns a step
   into a ramp; the ramp's start is when the change began).

A baseline of zeros (no drops, no errors) that becomes non-zero is a change; its ratio is
:data:`ZERO_BASELINE_RATIO`, a finite stand-in for infinity so that JSON, OTel attributes
and Prometheus all carry it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median

ZERO_BASELINE_RATIO = 1e6
"""The ratio reported when the level before is zero and the level after is not."""

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class DetectorParams:
    """How sure the detector must be before it calls a change."""

    min_before: int = 5
    """Samples of baseline needed before a candidate onset."""
    min_after: int = 3
    """Samples of the new level needed after it (the shift must persist this long)."""
    baseline_points: int = 30
    """At most this many samples before the candidate make the baseline."""
    after_points: int = 10
    """At most this many samples from the candidate make the new level."""
    threshold: float = 6.0
    """Distance between the two medians, in baseline spreads."""
    min_relative: float = 0.2
    """Smallest relative change of the level (0.2: 20%); ignored for a zero baseline."""
    persistence: float = 0.8
    """Fraction of the following window that must be past the midpoint."""
    relative_floor: float = 0.02
    """The spread is at least this fraction of the baseline's level."""
    absolute_floor: float = 1e-12
    """The spread is at least this (a flat zero baseline)."""

    def __post_init__(self) -> None:
        if self.min_before < 2 or self.min_after < 1:
            raise ValueError("min_before must be >= 2 and min_after >= 1")
        if self.baseline_points < self.min_before or self.after_points < self.min_after:
            raise ValueError("baseline_points >= min_before and after_points >= min_after")
        if not 0.5 < self.persistence <= 1.0:
            raise ValueError("persistence must be in (0.5, 1]")


@dataclass(frozen=True)
class Change:
    """A sustained level shift in one series."""

    onset: float
    """Time of the first sample of the new level."""
    before: float
    """Median of the baseline."""
    after: float
    """Median of the new level."""
    score: float
    """Distance between the levels in baseline spreads."""

    @property
    def ratio(self) -> float:
        """After over before; :data:`ZERO_BASELINE_RATIO` when before is zero."""
        return level_ratio(self.before, self.after)

    @property
    def direction(self) -> int:
        return 1 if self.after > self.before else -1


def level_ratio(before: float, after: float) -> float:
    if before == 0:
        return 1.0 if after == 0 else math.copysign(ZERO_BASELINE_RATIO, after)
    return after / before


def _clean(times: Sequence[float], values: Sequence[float]) -> tuple[list[float], list[float]]:
    if len(times) != len(values):
        raise ValueError(f"{len(times)} timestamps for {len(values)} values")
    pairs = sorted(
        (float(t), float(v)) for t, v in zip(times, values, strict=True) if math.isfinite(v)
    )
    return [t for t, _ in pairs], [v for _, v in pairs]


def detect(
    times: Sequence[float],
    values: Sequence[float],
    params: DetectorParams | None = None,
    *,
    direction: int = 0,
    not_before: float | None = None,
    not_after: float | None = None,
    min_shift: float = 0.0,
    min_level: float = 0.0,
    smear_s: float = 0.0,
) -> Change | None:
    """The earliest sustained level shift, or None.

    ``direction`` 1 looks only for rises, -1 only for falls, 0 for both. ``not_before`` and
    ``not_after`` bound the onset (the baseline may lie before ``not_before``). A shift
    smaller than ``min_shift`` (in the series' unit), or between levels both under
    ``min_level``, is immaterial: the search goes on past it.

    ``smear_s``: the series is a rate over a window this long, which turns a step at ``t0``
    into a ramp from ``t0`` to ``t0 + smear_s``. The onset is then where the series crosses
    the midpoint between the levels (interpolated between samples) less half the window: the
    same for a large change and a small one. ``0``: the first sample of the new level, walking
    back along a ramp while samples are far from the baseline.
    """
    p = params or DetectorParams()
    ts, vs = _clean(times, values)
    n = len(vs)
    first_k = p.min_before
    if not_before is not None:
        # The onset is at most the last sample of the following window: candidates whose
        # window ends before ``not_before`` cannot qualify (this keeps long series cheap).
        first_k = max(first_k, bisect.bisect_left(ts, not_before) - p.after_points + 1)
    for k in range(first_k, n - p.min_after + 1):
        if not_after is not None and ts[k] > not_after:
            break
        baseline = vs[max(0, k - p.baseline_points) : k]
        following = vs[k : k + p.after_points]
        level = median(baseline)
        spread = max(
            MAD_TO_SIGMA * median(abs(v - level) for v in baseline),
            p.relative_floor * abs(level),
            p.absolute_floor,
        )
        new_level = median(following)
        shift = new_level - level
        if shift == 0 or (direction and (shift > 0) != (direction > 0)):
            continue
        if abs(shift) < min_shift or max(abs(level), abs(new_level)) < min_level:
            continue
        score = abs(shift) / spread
        if score < p.threshold:
            continue
        if level != 0 and abs(shift) / abs(level) < p.min_relative:
            continue
        midpoint = level + shift / 2
        past = [(v - midpoint) * shift > 0 for v in following]
        if sum(past) < p.persistence * len(following):
            continue
        first_past = k + past.index(True)
        if smear_s > 0:
            onset_t = _midpoint_crossing(ts, vs, first_past, midpoint, shift) - smear_s / 2
        else:
            # Back from the first sample past the midpoint while samples are still far from
            # the baseline: the start of a ramp.
            onset = first_past
            while onset > 0:
                deviation = (vs[onset - 1] - level) * (1 if shift > 0 else -1)
                if deviation < p.threshold * spread:
                    break
                onset -= 1
            onset_t = ts[onset]
        if not_before is not None and onset_t < not_before:
            continue
        if not_after is not None and onset_t > not_after:
            continue
        return Change(onset=onset_t, before=level, after=new_level, score=score)
    return None


def _midpoint_crossing(
    ts: Sequence[float], vs: Sequence[float], first_past: int, midpoint: float, shift: float
) -> float:
    """When the series crosses ``midpoint`` just before sample ``first_past`` (linear between
    that sample and the one before it, when the one before is not past it)."""
    if first_past == 0:
        return ts[0]
    v0, v1 = vs[first_past - 1], vs[first_past]
    if (v0 - midpoint) * shift > 0 or v1 == v0:
        return ts[first_past]
    fraction = (midpoint - v0) / (v1 - v0)
    return ts[first_past - 1] + fraction * (ts[first_past] - ts[first_past - 1])


def counter_rate(
    times: Sequence[float], values: Sequence[float]
) -> tuple[list[float], list[float]]:
    """Per-second rate of a cumulative counter between consecutive samples.

    Each rate is stamped at the later sample. A value below its predecessor is a counter reset
    (the process restarted): the new value itself is the increase since the reset, as
    Prometheus's ``rate()`` counts it.
    """
    ts, vs = _clean(times, values)
    out_t: list[float] = []
    out_v: list[float] = []
    for i in range(1, len(vs)):
        dt = ts[i] - ts[i - 1]
        if dt <= 0:
            continue
        increase = vs[i] - vs[i - 1]
        if increase < 0:
            increase = vs[i]
        out_t.append(ts[i])
        out_v.append(increase / dt)
    return out_t, out_v
