"""Process groups' communication phases, from the Collector's group-phase gauges
(:data:`PHASE_METRICS`): taken in per job as (group, op) series of recent values, and read
back over a window as the groups' :class:`~skewtrace.controller.window.GroupPhases`, the
interleave policy's input.

The client text kept is each group's name, op, switches and hosts, every value at most
:data:`~skewtrace.controller._limits.MAX_VALUE_LENGTH` characters (longer ones are refused),
in at most 256 phase series a job (counted in the table's ``max_series``) of 32 values each.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry.proto.metrics.v1 import metrics_pb2

from skewtrace import semconv
from skewtrace.controller._limits import MAX_VALUE_LENGTH
from skewtrace.controller.jobs import JobState, JobTable
from skewtrace.controller.otlp_points import attributes, point_count
from skewtrace.controller.window import GroupPhases
from skewtrace.controller.window_stats import job_step

PHASE_METRICS = {
    semconv.METRIC_GROUP_PHASE_START: "start",
    semconv.METRIC_GROUP_PHASE_DURATION: "duration",
}
"""The Collector's group-phase gauges (``training.group.phase.start`` / ``.duration``, one point
per job, process group and collective op each analysed step), which the interleave policy
reads as :class:`~skewtrace.controller.window.GroupPhases`."""

# Phase series kept per job ((group, op) pairs), and values kept per series (the window's
# median is taken over them).
_MAX_PHASES_PER_JOB = 256
_MAX_PHASE_VALUES = 32


@dataclass
class PhaseSeries:
    """One group's phase of one op: its latest starts and durations, stamped on receipt."""

    switches: str
    hosts: str
    start: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=_MAX_PHASE_VALUES)
    )
    duration: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=_MAX_PHASE_VALUES)
    )


def ingest_phases(
    table: JobTable,
    metric: metrics_pb2.Metric,
    data_field: str | None,
    resource_attrs: Mapping[str, str],
    now: float,
) -> int:
    """Take the Collector's group-phase gauges (:data:`PHASE_METRICS`); returns how many
    points were rejected. A point needs a job, a process group, an op and a finite value
    of at least 0; the switches and hosts are kept as sent (the latest point's)."""
    counters = table.counters
    if data_field != "gauge":
        points = point_count(metric, data_field)
        counters.points_invalid += points
        return points
    which_value = PHASE_METRICS[metric.name]
    rejected = 0
    for point in metric.gauge.data_points:
        attrs = {**resource_attrs, **attributes(point.attributes)}
        job_id = attrs.get(semconv.JOB_ID, "")
        pg = attrs.get(semconv.COLLECTIVE_PG, "")
        op = attrs.get(semconv.COLLECTIVE_OP, "")
        switches = attrs.get(semconv.GROUP_SWITCHES, "")
        hosts = attrs.get(semconv.GROUP_HOSTS, "")
        if max(len(job_id), len(pg), len(op), len(switches), len(hosts)) > MAX_VALUE_LENGTH:
            counters.points_too_long += 1
            rejected += 1
            continue
        which = point.WhichOneof("value")
        value = point.as_double if which == "as_double" else float(point.as_int)
        if not job_id or not pg or not op or which is None or not math.isfinite(value):
            counters.points_invalid += 1
            rejected += 1
            continue
        if value < 0:
            counters.points_invalid += 1
            rejected += 1
            continue
        job = table.job_for(job_id, now)
        if job is None:
            rejected += 1
            continue
        series = job.phases.get((pg, op))
        if series is None:
            if len(job.phases) >= _MAX_PHASES_PER_JOB or table.series >= table.max_series:
                counters.points_over_series_limit += 1
                rejected += 1
                continue
            series = job.phases[(pg, op)] = PhaseSeries(switches, hosts)
            table.series += 1
        series.switches, series.hosts = switches, hosts
        getattr(series, which_value).append((now, value))
        job.last_seen = now
        counters.points_accepted += 1
    return rejected


def groups_of(job: JobState, start: float, now: float, name: str) -> tuple[GroupPhases, ...]:
    """The job's groups with phases received since ``start``: per op, the median start
    and duration, in order of start (see :class:`~skewtrace.controller.window.GroupPhases`)."""
    by_pg: dict[str, list[tuple[float, float]]] = {}
    meta: dict[str, tuple[str, str]] = {}
    for (pg, _op), series in sorted(job.phases.items()):
        starts = [v for at, v in series.start if at >= start]
        durations = [v for at, v in series.duration if at >= start]
        if not starts or not durations:
            continue
        by_pg.setdefault(pg, []).append((statistics.median(starts), statistics.median(durations)))
        meta[pg] = (series.switches, series.hosts)
    step_s = job_step(job, start)
    reported, at = job.step_start
    step_start = reported if at >= start else 0.0
    return tuple(
        GroupPhases(
            pg=pg,
            phases=tuple(sorted(phases)),
            switches=_split(meta[pg][0]),
            hosts=_split(meta[pg][1]),
            applied_offset_s=job.decisions.mean_offset(pg, start, now),
            job=name,
            step_s=step_s,
            step_start_unix=step_start,
        )
        for pg, phases in sorted(by_pg.items())
    )


def _split(text: str) -> tuple[str, ...]:
    """A comma-separated attribute (``training.group.switches`` / ``.hosts``) as a tuple."""
    return tuple(part for part in text.split(",") if part)
