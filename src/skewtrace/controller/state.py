"""Per-job windows of barrier observations (:mod:`skewtrace.controller.window`), built from OTLP
metric points: :class:`JobWindows` takes export requests in, hands each metric to the module
that reads it, and builds a job's :class:`~skewtrace.controller.window.JobWindow` on every
tick from what they keep.

- :mod:`~skewtrace.controller.otlp_points`: the points' attribute values, ranks and
  temporalities.
- :mod:`~skewtrace.controller.deltas`: the ranks' wait, lateness and step-duration histograms
  (cumulative or delta) as deltas, stamped on receipt.
- :mod:`~skewtrace.controller.collector_flags`: the Collector's flags a policy declines a job
  for.
- :mod:`~skewtrace.controller.group_phases`: process groups' communication phases.
- :mod:`~skewtrace.controller.jobs`: what is kept per job, and the bounds on it.
- :mod:`~skewtrace.controller.window_stats`: a rank's window from its deltas.
- :mod:`~skewtrace.controller.decision_record`: what the ranks were told, time-weighted.

Memory is bounded, whatever clients send: observations older than the window are dropped at
every tick, series and jobs that stop reporting are forgotten after ``job_timeout_s``, and
points beyond ``max_jobs`` jobs, ``max_ranks_per_job`` ranks or ``max_series_per_job`` series
in a job, or ``max_series`` series in all, are counted and dropped. A histogram series costs
a fixed size whatever its attributes (it is keyed by a digest of them), and deltas of one rank
received within ``window_s / 16`` of each other are merged, so a rank holds a bounded number of
them however often points arrive. The client text kept is the job id and, for the group-phase
gauges (:data:`~skewtrace.controller.group_phases.PHASE_METRICS`), each group's name, op,
switches and hosts: every value at most :data:`~skewtrace.controller._limits.MAX_VALUE_LENGTH`
characters (longer ones are refused, as over HTTP), at most 256 phase series a job (counted in
``max_series``) of 32 values each.

Not thread-safe by itself; :class:`skewtrace.controller.service.PacerService` holds a lock around
it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from opentelemetry.proto.metrics.v1 import metrics_pb2

from skewtrace import semconv
from skewtrace.controller._limits import IngestCounters
from skewtrace.controller.collector_flags import DECLINE_METRICS, declines, ingest_flags
from skewtrace.controller.deltas import RANK_METRICS, HistogramDeltas
from skewtrace.controller.group_phases import PHASE_METRICS, groups_of, ingest_phases
from skewtrace.controller.jobs import JobTable
from skewtrace.controller.otlp_points import attributes, point_count
from skewtrace.controller.window import GroupPhases, JobWindow, RankWindow
from skewtrace.controller.window_stats import rank_window

# Known metrics the policy does not need: accepted quietly (not counted as unknown). Every
# connector metric is known (the registry's list, so a new one needs no change here).
_KNOWN_UNUSED = frozenset(semconv.CONNECTOR_METRICS) - frozenset(RANK_METRICS)

MAX_STEP_AGE_S = 60.0
"""A step start reported as older than this (seconds before the poll) is refused."""


class JobWindows:
    """Delta observations per job and rank over a sliding window of ``window_s`` seconds."""

    def __init__(
        self,
        window_s: float,
        job_timeout_s: float,
        *,
        rank_timeout_s: float | None = None,
        max_jobs: int = 1024,
        max_ranks_per_job: int = 65536,
        max_series_per_job: int = 262144,
        max_series: int = 1048576,
        window_steps: int = 1,
        max_window_s: float | None = None,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s!r}")
        if window_steps < 1:
            raise ValueError(f"window_steps must be >= 1, got {window_steps!r}")
        if max_window_s is not None and not max_window_s >= window_s:
            raise ValueError(f"max_window_s must be >= window_s, got {max_window_s!r}")
        if not job_timeout_s > 0:
            raise ValueError(f"job_timeout_s must be > 0, got {job_timeout_s!r}")
        self.window_s = window_s
        self.window_steps = window_steps
        self.max_window_s = window_s if max_window_s is None else max_window_s
        self.job_timeout_s = job_timeout_s
        self.rank_timeout_s = window_s if rank_timeout_s is None else rank_timeout_s
        self._table = JobTable(
            max_jobs=max_jobs,
            max_ranks_per_job=max_ranks_per_job,
            max_series_per_job=max_series_per_job,
            max_series=max_series,
        )
        self._histograms = HistogramDeltas(self._table, window_s)
        self._groups_cache: tuple[float, dict[str, tuple[GroupPhases, ...]]] | None = None

    @property
    def counters(self) -> IngestCounters:
        """What happened to the data points received."""
        return self._table.counters

    @property
    def series(self) -> int:
        """Series tracked now, in all jobs."""
        return self._table.series

    # ----------------------------------------------------------------- ingest

    def ingest_request(
        self, resource_metrics: Iterable[metrics_pb2.ResourceMetrics], now: float
    ) -> int:
        """Take every data point of an export request; returns how many were rejected."""
        self._groups_cache = None
        rejected = 0
        for rm in resource_metrics:
            resource_attrs = attributes(rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    rejected += self._ingest_metric(metric, resource_attrs, now)
        return rejected

    def _ingest_metric(
        self, metric: metrics_pb2.Metric, resource_attrs: Mapping[str, str], now: float
    ) -> int:
        kind = RANK_METRICS.get(metric.name)
        data_field = metric.WhichOneof("data")
        if metric.name in DECLINE_METRICS:
            return ingest_flags(self._table, metric, data_field, resource_attrs, now)
        if metric.name in PHASE_METRICS:
            return ingest_phases(self._table, metric, data_field, resource_attrs, now)
        if kind is None:
            points = point_count(metric, data_field)
            if metric.name in _KNOWN_UNUSED:
                self.counters.points_unused += points
            else:
                self.counters.points_unknown_metric += points
            return 0
        return self._histograms.ingest(metric, kind, data_field, resource_attrs, now)

    # ----------------------------------------------------------------- windows

    def job_ids(self) -> list[str]:
        return list(self._table.jobs)

    def note_step_start(self, job_id: str, raw_age: str, wall_now: float, now: float) -> bool:
        """A rank of the job said with its poll that one of its steps started ``raw_age``
        seconds before it sent the poll: on this controller's wall clock (``wall_now`` at
        receipt) the step started at ``wall_now - age``, late by the request's one-way
        network time and with no host clock trusted. Jobs are known from their metrics only:
        a start of a job not seen is ignored. False (and counted) when the age is not a
        finite number of seconds in [0, :data:`MAX_STEP_AGE_S`]."""
        try:
            age = float(raw_age)
        except (TypeError, ValueError):
            age = math.nan
        if not (math.isfinite(age) and 0.0 <= age <= MAX_STEP_AGE_S):
            self.counters.step_starts_invalid += 1
            return False
        job = self._table.jobs.get(job_id)
        if job is not None:
            job.step_start = (wall_now - age, now)
            self._groups_cache = None
        return True

    def stretch_s(self, job_id: str) -> float:
        """How much longer than ``window_s`` the job's window is, to hold ``window_steps`` of
        its steps (at most ``max_window_s`` in all). A job whose steps take longer than
        ``window_s / min_steps`` would otherwise never have enough steps in a window to be
        judged, and its ranks would drop out between two steps (``rank_timeout_s``); the rank
        timeout stretches by the same amount. The step period is the larger of the job's
        smoothed step duration and the smoothed time between its steps' arrivals (a job that
        pauses between short steps has a long period all the same)."""
        job = self._table.jobs.get(job_id)
        if job is None:
            return 0.0
        period = max(job.step_s, job.step_gap_s)
        if period <= 0:
            return 0.0
        span = min(self.max_window_s, max(self.window_s, self.window_steps * period))
        return span - self.window_s

    def window(self, job_id: str, now: float) -> JobWindow:
        """The job's window ending at ``now``; ranks silent for ``rank_timeout_s`` are left out."""
        job = self._table.jobs.get(job_id)
        if job is None:
            return JobWindow(now=now, ranks={})
        stretch = self.stretch_s(job_id)
        span = self.window_s + stretch
        start = now - span
        ranks: dict[int, RankWindow] = {}
        for rank, deltas in job.deltas.items():
            if now - job.rank_last_seen.get(rank, -math.inf) > self.rank_timeout_s + stretch:
                continue
            ranks[rank] = rank_window(
                deltas, start, span, job.decisions.mean_delay(rank, start, now)
            )
        every_group = self._all_groups(now)
        return JobWindow(
            now=now,
            ranks=ranks,
            stretch_s=stretch,
            declines=declines(job.flags),
            job=job_id,
            groups=every_group.get(job_id, ()),
            fabric=tuple(
                g for other, groups in every_group.items() if other != job_id for g in groups
            ),
            scheduled=job.decisions.scheduled(start, now),
        )

    def _all_groups(self, now: float) -> dict[str, tuple[GroupPhases, ...]]:
        """Every job's groups with phases over its own window ending at ``now``, built once
        per decision time: each job's window holds its own and, as its ``fabric``, the other
        jobs' (all of them, so that every job's policy sees the same units)."""
        cached = self._groups_cache
        if cached is not None and cached[0] == now:
            return cached[1]
        found: dict[str, tuple[GroupPhases, ...]] = {}
        for job_id, job in sorted(self._table.jobs.items()):
            if job.phases:
                start = now - self.window_s - self.stretch_s(job_id)
                if job.stepped_at < start:
                    # Its ranks are not stepping (the job ended, hangs, or was forgotten and
                    # only its phases came back): the Collector re-sends a job's last phases
                    # now and then (metrics_resend_interval, until series_idle_timeout), but
                    # only a job that steps is on the fabric.
                    continue
                groups = groups_of(job, start, now, job_id)
                if groups:
                    found[job_id] = groups
        self._groups_cache = (now, found)
        return found

    def record_decision(
        self,
        job_id: str,
        now: float,
        delays: Mapping[int, float],
        scheduled: bool = False,
        offsets: Mapping[str, float] | None = None,
    ) -> None:
        """Remember what ranks were told, to add it back when estimating natural waits and
        phases: the delays, whether a schedule was in force (:attr:`JobWindow.scheduled`)
        and the groups' offsets (:attr:`GroupPhases.applied_offset_s`)."""
        job = self._table.jobs.get(job_id)
        if job is not None:
            job.decisions.record(now, delays, scheduled, offsets)

    # ----------------------------------------------------------------- expiry

    def expire(self, now: float) -> list[str]:
        """Drop old observations, and forget jobs silent for ``job_timeout_s``; returns them."""
        forgotten = [
            j for j, s in self._table.jobs.items() if now - s.last_seen > self.job_timeout_s
        ]
        for job_id in forgotten:
            job = self._table.jobs.pop(job_id)
            self._table.series -= len(job.series) + len(job.phases)
        for job_id, job in self._table.jobs.items():
            start = now - self.window_s - self.stretch_s(job_id)
            stale = [k for k, c in job.series.items() if now - c.seen_at > self.job_timeout_s]
            for key in stale:
                del job.series[key]
            self._table.series -= len(stale)
            for rank in list(job.deltas):
                deltas = job.deltas[rank]
                while deltas and deltas[0].received_at < start:
                    deltas.popleft()
                if not deltas and now - job.rank_last_seen.get(rank, now) > self.job_timeout_s:
                    del job.deltas[rank]
                    job.rank_last_seen.pop(rank, None)
                    job.step_last_at.pop(rank, None)
            silent = [
                phase
                for phase, series in job.phases.items()
                if now - max((at for at, _ in (*series.start, *series.duration)), default=now)
                > self.job_timeout_s
            ]
            for phase in silent:
                del job.phases[phase]
            self._table.series -= len(silent)
            job.decisions.forget_before(start)
        return forgotten
