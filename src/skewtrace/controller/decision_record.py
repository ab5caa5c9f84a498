"""What a job's ranks were told, remembered for its window: the published decisions' delays,
whether a schedule was in force, and the groups' offsets.

The window hands them to the policies with what it observed, to add back when estimating the
ranks' natural waits and the groups' natural phases
(:attr:`~skewtrace.controller.window.RankWindow.applied_delay_s`,
:attr:`~skewtrace.controller.window.GroupPhases.applied_offset_s`,
:attr:`~skewtrace.controller.window.JobWindow.scheduled`). Each decision holds until the next,
so each of these is a time-weighted mean over the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

Decision = tuple[float, Mapping[int, float], bool, Mapping[str, float]]
"""A published decision as the window remembers it: (time, delays, whether a schedule was
published, offsets by group)."""


class DecisionRecord:
    """One job's published decisions still relevant to its window, oldest first."""

    def __init__(self) -> None:
        self._decisions: deque[Decision] = deque()

    def record(
        self,
        now: float,
        delays: Mapping[int, float],
        scheduled: bool,
        offsets: Mapping[str, float] | None,
    ) -> None:
        """Remember a decision published at ``now`` (copies of its delays and offsets)."""
        self._decisions.append((now, dict(delays), scheduled, dict(offsets or {})))

    def forget_before(self, start: float) -> None:
        """Drop the decisions no window starting at ``start`` or later reads."""
        # Keep the last decision before the window start: it was in force at the start.
        decisions = self._decisions
        while len(decisions) > 1 and decisions[1][0] <= start:
            decisions.popleft()

    def scheduled(self, start: float, now: float) -> float:
        """Fraction of [start, now] during which a schedule was published for the job."""
        return self._time_weighted(start, now, lambda entry: 1.0 if entry[2] else 0.0)

    def mean_offset(self, pg: str, start: float, now: float) -> float:
        """Time-weighted mean of the offset published for the group over [start, now]."""
        return self._time_weighted(start, now, lambda entry: entry[3].get(pg, 0.0))

    def mean_delay(self, rank: int, start: float, now: float) -> float:
        """Time-weighted mean of the delay published for ``rank`` over [start, now]."""
        return self._time_weighted(start, now, lambda entry: entry[1].get(rank, 0.0))

    def _time_weighted(self, start: float, now: float, value: Callable[[Decision], float]) -> float:
        """The time-weighted mean over [start, now] of ``value`` of the decision in force (each
        published decision holds until the next)."""
        if not self._decisions or now <= start:
            return 0.0
        weighted = 0.0
        entries = list(self._decisions)
        for index, entry in enumerate(entries):
            until = entries[index + 1][0] if index + 1 < len(entries) else now
            lo, hi = max(entry[0], start), min(until, now)
            if hi > lo:
                weighted += value(entry) * (hi - lo)
        return weighted / (now - start)
