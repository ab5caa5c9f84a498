"""The window over received metrics: what every controller policy reads about a job.

:class:`JobWindow` holds each rank's observations (:class:`RankWindow`: sums of the delta
histograms over the last ``window_s`` seconds, or a stretched window for a job with long
steps) and what the Collector flags in the job that no delay or share fixes (``declines``).
:class:`skewtrace.controller.state.JobWindows` builds one per job and tick from OTLP points;
every policy in :mod:`skewtrace.controller.policies` gets it and the previous state it
returned, and :func:`declined` is the one rule they share for staying out of a job.

Pure data, standard library only; imports no policy (the policies import it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from skewtrace import semconv

REASON_STAGE_IMBALANCE = semconv.CAUSE_STAGE_IMBALANCE
"""Declined: a pipeline stage does more work than the others on every replica. Its ranks
arrive last because of the partition; a delay on the other stages' ranks only moves their
wait, and the fix is a partition of the layers (the verdict's ``training.imbalance.fix``)."""
REASON_DATA_IMBALANCE = semconv.CAUSE_DATA_IMBALANCE
"""Declined: the slowest replica changes from step to step with the data; no rank is early
persistently, and a balanced split of each global batch (by tokens) is the fix."""
REASON_FABRIC_FAULT = "fabric_fault"
"""Declined: the Collector flags a rank for its network, or suspects a NIC, host, uplink or
switch. The late rank waits on a slow link; delaying the others does not make it faster (the
demo's throttled NIC lost 7.5% of throughput to pacing)."""


@dataclass(frozen=True)
class RankWindow:
    """One rank's observations over the window (sums of the delta histograms)."""

    steps: int
    """``training.step.duration`` count: steps the rank finished in the window."""

    step_time_sum_s: float
    """``training.step.duration`` sum."""

    wait_sum_s: float
    """Time the rank idled at barriers for later ranks (``training.rank.wait``), with
    collectives that waited at the same time (overlapping DDP buckets) counted once."""

    lateness_sum_s: float
    """Time the rank arrived after the earliest (``training.rank.lateness``), the same way."""

    applied_delay_s: float = 0.0
    """Mean delay per step the controller asked of this rank during the window."""

    wait_top_sum_s: float | None = None
    """The sum of the window's ``steps`` largest waits (``training.rank.wait``, estimated from
    its buckets): the rank's idle time when each step idles at one collective or at several
    at once, without counting small waits as steps. None without buckets. The rebalancing
    policy reads it; pacing keeps ``wait_sum_s``, which errs low, toward smaller delays."""

    wait_typical_s: float | None = None
    """The rank's typical barrier wait per step: the median over the window's parts (a
    quarter each) of the part's wait per step. A random stall of another rank makes every
    rank wait once, which lifts the mean of a slow rank's waits but not this. None with too
    few parts."""

    @property
    def wait_per_step_s(self) -> float:
        return self.wait_sum_s / self.steps if self.steps else 0.0

    @property
    def lateness_per_step_s(self) -> float:
        return self.lateness_sum_s / self.steps if self.steps else 0.0


@dataclass(frozen=True)
class GroupPhases:
    """One process group's communication phases in the job's step, as the interleave policy
    reads them (:mod:`skewtrace.controller.policies.interleave`)."""

    pg: str
    """The group's name (``training.collective.pg``)."""

    phases: tuple[tuple[float, float], ...]
    """(start, duration) of each phase in seconds, the start after the members' own step
    start, as observed (with any offset the group was given in it)."""

    switches: tuple[str, ...] = ()
    """The leaf switches of its members (``training.group.switches``): behind two or more it
    crosses their uplinks."""

    hosts: tuple[str, ...] = ()
    """Its members' hosts, when known: groups that share a host are tied (a delay before one
    rank's forward holds the host's other ranks at their tensor-parallel collective), so they
    get one offset. Empty: the group is tied to no other."""

    applied_offset_s: float = 0.0
    """The offset the controller published for the group, time-weighted over the window."""

    job: str = ""
    """The job the group belongs to (:attr:`JobWindow.job` for its own groups)."""

    step_s: float = 0.0
    """Its job's mean step time over the window (0: not known)."""

    step_start_unix: float = 0.0
    """When one of its job's steps started, on the controller's wall clock, as its ranks last
    reported it with a poll (the step's age when the poll was sent; 0: not reported in the
    window). With ``step_s`` it places the phases of different jobs on one time line."""


@dataclass(frozen=True)
class JobWindow:
    """All ranks of one job over the window ending at ``now``."""

    now: float
    """The decision time in seconds (any monotonic origin; only differences are used)."""

    ranks: Mapping[int, RankWindow]

    stretch_s: float = 0.0
    """How much longer than the configured window this one is (a job with long steps gets a
    window that holds several of them); a policy that waits for a window of settled steps
    waits this much longer."""

    declines: tuple[str, ...] = ()
    """What the Collector flags in the job that no delay or share fixes: ``stage_imbalance``,
    ``data_imbalance`` (its ``training.imbalance`` gauge), ``fabric_fault`` (a rank flagged for
    its network, or a suspected part of the fabric). The policies decline while one is
    flagged, and say so."""

    groups: tuple[GroupPhases, ...] = ()
    """Process groups' communication phases (the Collector's ``training.group.phase.*``
    gauges); empty when none are known."""

    job: str = ""
    """The job's id: every job's policy places the groups of all jobs in one order, by their
    jobs' ids, so that they agree."""

    fabric: tuple[GroupPhases, ...] = ()
    """The groups of the other jobs the controller hears from (their ``job`` set), whose
    phases may collide with this job's on a shared uplink."""

    scheduled: float = 0.0
    """The fraction of the window during which a schedule was published for the job (the
    interleave policy's): its steps' timing then includes the holds the schedule asked."""


def declined(window: JobWindow) -> str | None:
    """The reason a controller policy stays out of a job whose delay it cannot fix (a flagged
    imbalance, stage first; a fault of the fabric), or None."""
    for reason in (REASON_STAGE_IMBALANCE, REASON_DATA_IMBALANCE, REASON_FABRIC_FAULT):
        if reason in window.declines:
            return reason
    return None
