"""What the pacer keeps of each job it hears from (:class:`JobState`), and the table of them
with the bounds on its size (:class:`JobTable`).

Memory is bounded whatever clients send: at most ``max_jobs`` jobs, ``max_ranks_per_job``
ranks and ``max_series_per_job`` series in a job, ``max_series`` series in all. The modules
that take points in apply these bounds, each to its own records, and count what they take and
drop in the table's :class:`~skewtrace.controller._limits.IngestCounters`: the ranks'
histograms (:mod:`~skewtrace.controller.deltas`), the Collector's flags
(:mod:`~skewtrace.controller.collector_flags`) and group phases
(:mod:`~skewtrace.controller.group_phases`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from skewtrace.controller._limits import IngestCounters
from skewtrace.controller.decision_record import DecisionRecord

if TYPE_CHECKING:
    # The modules that fill a job's records import this one; here their types are only named.
    from skewtrace.controller.deltas import Delta, Series, SeriesKey
    from skewtrace.controller.group_phases import PhaseSeries

# Weight of a new step-duration delta in a job's smoothed step duration and time between steps.
_STEP_SMOOTHING = 0.2


@dataclass
class JobState:
    """One job's records, from its first point until it is forgotten."""

    last_seen: float
    deltas: dict[int, deque[Delta]] = field(default_factory=dict)
    rank_last_seen: dict[int, float] = field(default_factory=dict)
    decisions: DecisionRecord = field(default_factory=DecisionRecord)
    """Every published decision still relevant to the window."""
    step_s: float = 0.0
    """The job's step duration, smoothed from its ranks' step-duration deltas (0: none yet)."""
    step_gap_s: float = 0.0
    """The job's time between steps as they arrive here, smoothed: a rank's seconds since its
    previous step delta, per step counted (0: none yet)."""
    step_last_at: dict[int, float] = field(default_factory=dict)
    """When each rank's last step-duration delta arrived."""
    stepped_at: float = -math.inf
    """When a rank's step count last went up between two points of one series (not the first
    point of a cumulative series, which carries a history that may be long over: the
    Collector re-sends an ended job's series until ``series_idle_timeout``)."""
    series: dict[SeriesKey, Series] = field(default_factory=dict)
    flags: dict[tuple[str, ...], tuple[str, bool]] = field(default_factory=dict)
    """The Collector's flags the policies decline for
    (:data:`~skewtrace.controller.collector_flags.DECLINE_METRICS`): series key -> (reason,
    flagged now), from the latest point of each. The connector sends 1 while flagged and 0
    once cleared, but an unchanged series only every ``metrics_resend_interval``: the last
    value holds until the next (or the job is forgotten)."""
    phases: dict[tuple[str, str], PhaseSeries] = field(default_factory=dict)
    """(process group, op) -> its phase's recent values
    (:data:`~skewtrace.controller.group_phases.PHASE_METRICS`)."""
    step_start: tuple[float, float] = (0.0, -math.inf)
    """(a step's start on the controller's wall clock, as a rank last reported it; when it
    arrived)."""

    def note_step(self, rank: int, count: int, total: float, now: float) -> None:
        """Update the job's step duration and time between steps from one rank's step delta."""
        if total > 0:
            self.step_s = _smooth(self.step_s, total / count)
        last = self.step_last_at.get(rank)
        if last is not None and now > last:
            self.step_gap_s = _smooth(self.step_gap_s, (now - last) / count)
        self.step_last_at[rank] = now


def _smooth(average: float, value: float) -> float:
    return value if average <= 0 else average + _STEP_SMOOTHING * (value - average)


class JobTable:
    """The jobs tracked, by id, with the bounds on them and the counters of what came in."""

    def __init__(
        self,
        *,
        max_jobs: int,
        max_ranks_per_job: int,
        max_series_per_job: int,
        max_series: int,
    ) -> None:
        self.max_jobs = max_jobs
        self.max_ranks_per_job = max_ranks_per_job
        self.max_series_per_job = max_series_per_job
        self.max_series = max_series
        self.counters = IngestCounters()
        self.jobs: dict[str, JobState] = {}
        # Series tracked now, in all jobs (histogram and phase series: ``max_series`` bounds
        # their sum).
        self.series = 0

    def job_for(self, job_id: str, now: float) -> JobState | None:
        """The job's state, made for a job not tracked yet while there is room for one more;
        None, and the point counted as over the job limit, when there is not."""
        job = self.jobs.get(job_id)
        if job is None:
            if len(self.jobs) >= self.max_jobs:
                self.counters.points_over_job_limit += 1
                return None
            job = self.jobs[job_id] = JobState(last_seen=now)
        return job
