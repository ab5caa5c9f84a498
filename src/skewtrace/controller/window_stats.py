"""The statistics of a job's window, from the deltas its ranks' histograms left
(:mod:`~skewtrace.controller.deltas`): each rank's :class:`~skewtrace.controller.window.RankWindow`
(sums, the barrier time with overlapping collectives counted once, the typical wait per step,
the top waits estimated from the buckets) and the job's mean step time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from skewtrace.controller.deltas import Delta
from skewtrace.controller.jobs import JobState
from skewtrace.controller.window import RankWindow

# The window is cut into this many parts for a rank's typical wait per step (the median over
# the parts): one part that held another rank's random stall does not make it.
_WAIT_PARTS = 4


def rank_window(
    deltas: Iterable[Delta], start: float, span: float, applied_delay_s: float
) -> RankWindow:
    """A rank's window from its deltas received since ``start`` (``span`` seconds before the
    window's end), with the mean delay it was asked over the window."""
    part_s = span / _WAIT_PARTS
    sums = {"wait": 0.0, "lateness": 0.0, "step": 0.0}
    counts = {"wait": 0, "lateness": 0, "step": 0}
    idle = {"wait": 0, "lateness": 0, "step": 0}
    wait_buckets: list[int] | None = None
    wait_bounds: tuple[float, ...] | None = None
    layout_changed = False
    # Per part of the window: [wait total, wait count, wait near zero, steps].
    parts = [[0.0, 0, 0, 0] for _ in range(_WAIT_PARTS)]
    for delta in deltas:
        if delta.received_at < start:
            continue
        sums[delta.kind] += delta.total
        counts[delta.kind] += delta.count
        idle[delta.kind] += delta.near_zero
        part = parts[min(_WAIT_PARTS - 1, int((delta.received_at - start) / part_s))]
        if delta.kind == "wait":
            part[0] += delta.total
            part[1] += delta.count
            part[2] += delta.near_zero
        elif delta.kind == "step":
            part[3] += delta.count
        if delta.kind == "wait" and not layout_changed:
            if (
                delta.bounds is None
                or delta.buckets is None
                or (wait_bounds is not None and delta.bounds is not wait_bounds)
            ):
                layout_changed, wait_buckets = True, None  # no estimate
                continue
            if wait_bounds is None or wait_buckets is None:
                wait_bounds, wait_buckets = delta.bounds, [0] * len(delta.buckets)
            for i, n in enumerate(delta.buckets):
                wait_buckets[i] += n
    steps = counts["step"]
    top = None
    if wait_buckets and wait_bounds and steps > 0 and sum(wait_buckets) > 0:
        top = top_sum(wait_bounds, wait_buckets, sums["wait"], steps)
    return RankWindow(
        steps=steps,
        step_time_sum_s=sums["step"],
        wait_sum_s=_once_per_step(sums["wait"], counts["wait"] - idle["wait"], steps),
        lateness_sum_s=_once_per_step(
            sums["lateness"], counts["lateness"] - idle["lateness"], steps
        ),
        applied_delay_s=applied_delay_s,
        wait_top_sum_s=top,
        wait_typical_s=_typical_wait(parts),
    )


def top_sum(bounds: Sequence[float], counts: Sequence[int], total: float, take: int) -> float:
    """The sum of the ``take`` largest observations of a histogram, estimated.

    The buckets above those taken hold them all; the buckets below are estimated at their
    midpoints (small absolute error: they hold the small observations) and subtracted from the
    exact ``total``; what is left is split between the buckets taken whole and the one taken
    in part in proportion to their midpoint estimates. Exact when every observation is in one
    bucket, or when the taken ones are the only ones outside the near-zero buckets.
    """
    mids = []
    for i in range(len(counts)):
        low = bounds[i - 1] if i > 0 else 0.0
        high = bounds[i] if i < len(bounds) else 2.0 * bounds[-1] if bounds else 0.0
        mids.append((low + high) / 2.0)
    remaining, whole, partial, partial_fraction = take, 0.0, 0.0, 0.0
    index = len(counts) - 1
    while index >= 0 and remaining > 0:
        n = counts[index]
        if n > 0:
            used = min(n, remaining)
            if used == n:
                whole += n * mids[index]
            else:
                partial, partial_fraction = n * mids[index], used / n
            remaining -= used
        index -= 1
    below = sum(counts[i] * mids[i] for i in range(index + 1))
    upper = max(0.0, total - below)
    estimated = whole + partial
    if estimated <= 0:
        return 0.0
    return upper * (whole + partial_fraction * partial) / estimated


def _typical_wait(parts: Sequence[Sequence[float]]) -> float | None:
    """The median over the window's parts of each part's barrier wait per step; None when
    fewer than 3 parts saw steps (too few to outvote one)."""
    per_step = [
        _once_per_step(float(total), int(count) - int(near_zero), int(steps)) / steps
        for total, count, near_zero, steps in parts
        if steps > 0
    ]
    return statistics.median(per_step) if len(per_step) >= 3 else None


def _once_per_step(total: float, nonzero: int, steps: int) -> float:
    """The window's barrier time with collectives that waited together counted once.

    A step's DDP gradient buckets are asynchronous and overlap: an early rank waits for the
    late one at every bucket at the same time, so the plain sum counts that wait once per
    bucket. The sum over the steps of each step's largest wait lies between ``total *
    steps / nonzero`` (the mean of the collectives that waited, once per step) and ``total``;
    the smaller of the two is exact both when one collective absorbs the whole wait and when
    all of them share it, and errs low (toward smaller delays) in between.
    """
    if nonzero <= 0 or steps <= 0:
        return total
    return min(total, total * steps / nonzero)


def job_step(job: JobState, start: float) -> float:
    """The job's mean step time over the step-duration deltas received since ``start`` (0
    without any): the same figure for the job's own window and for the other jobs'."""
    count = 0
    total = 0.0
    for deltas in job.deltas.values():
        for delta in deltas:
            if delta.kind == "step" and delta.received_at >= start:
                count += delta.count
                total += delta.total
    return total / count if count else 0.0
