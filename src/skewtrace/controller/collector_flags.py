"""The Collector's flags that make the policies decline a job (:data:`DECLINE_METRICS`): taken
in from its flag gauges, per job whether each flagged thing is flagged now, and read back as
the job's reasons to decline (:attr:`~skewtrace.controller.window.JobWindow.declines`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from opentelemetry.proto.metrics.v1 import metrics_pb2

from skewtrace import semconv
from skewtrace.controller._limits import MAX_VALUE_LENGTH
from skewtrace.controller.jobs import JobTable
from skewtrace.controller.otlp_points import attributes, parse_rank, point_count

IMBALANCE_CAUSES = (semconv.CAUSE_STAGE_IMBALANCE, semconv.CAUSE_DATA_IMBALANCE)

DECLINE_FABRIC = "fabric_fault"
"""The reason a policy declines a job while the Collector flags one of its ranks for its
network or suspects a part of the fabric: a delay on the other ranks does not make a link
faster."""

DECLINE_METRICS = frozenset(
    {semconv.METRIC_IMBALANCE, semconv.METRIC_STRAGGLER, semconv.METRIC_FABRIC_SUSPECT}
)
"""The Collector's flag gauges the policies read to decline a job (1 while flagged, 0 once
cleared): an imbalance (``stage_imbalance``, ``data_imbalance``), a rank flagged for its
network, a suspected part of the fabric."""

# Flag series kept per job (one per stage, per rank flagged for its network, per suspect).
_MAX_FLAGS_PER_JOB = 256


def _decline_of(metric: str, attrs: Mapping[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """(reason, key) of one flag gauge point: the reason the policies decline for ("" for a
    flag they do not decline for), and the key of its series in the job; None when the point
    lacks what its metric must carry."""
    if metric == semconv.METRIC_IMBALANCE:
        cause = attrs.get(semconv.STRAGGLER_CAUSE, "")
        stage = attrs.get(semconv.PIPELINE_STAGE, "")
        if cause not in IMBALANCE_CAUSES or len(stage) > MAX_VALUE_LENGTH:
            return None
        return cause, (metric, cause, stage)
    if metric == semconv.METRIC_STRAGGLER:
        rank = attrs.get(semconv.RANK, "")
        cause = attrs.get(semconv.STRAGGLER_CAUSE, "")
        if parse_rank(rank) is None or not cause or len(cause) > MAX_VALUE_LENGTH:
            return None
        reason = DECLINE_FABRIC if cause == semconv.CAUSE_NETWORK else ""
        return reason, (metric, rank, cause)
    name = attrs.get(semconv.SUSPECT_NAME, "")
    kind = attrs.get(semconv.SUSPECT_KIND, "")
    host = attrs.get(semconv.HOST_NAME, "")
    if not name or not kind or max(len(name), len(kind), len(host)) > MAX_VALUE_LENGTH:
        return None
    return DECLINE_FABRIC, (metric, kind, name, host)


def ingest_flags(
    table: JobTable,
    metric: metrics_pb2.Metric,
    data_field: str | None,
    resource_attrs: Mapping[str, str],
    now: float,
) -> int:
    """Take the Collector's flag gauges that make the policies decline a job (see
    :data:`DECLINE_METRICS`): whether each flagged thing of a job is flagged now. Returns
    how many points were rejected."""
    counters = table.counters
    if data_field != "gauge":
        points = point_count(metric, data_field)
        counters.points_invalid += points
        return points
    rejected = 0
    for point in metric.gauge.data_points:
        attrs = {**resource_attrs, **attributes(point.attributes)}
        job_id = attrs.get(semconv.JOB_ID, "")
        which = point.WhichOneof("value")
        value = point.as_double if which == "as_double" else float(point.as_int)
        if len(job_id) > MAX_VALUE_LENGTH:
            counters.points_too_long += 1
            rejected += 1
            continue
        found = _decline_of(metric.name, attrs)
        if not job_id or found is None or which is None or not math.isfinite(value):
            counters.points_invalid += 1
            rejected += 1
            continue
        reason, key = found
        if not reason:
            # A flag of a kind no policy declines for (a rank late for its compute):
            # the policies act on it from the waits.
            counters.points_unused += 1
            continue
        job = table.job_for(job_id, now)
        if job is None:
            rejected += 1
            continue
        if key not in job.flags and len(job.flags) >= _MAX_FLAGS_PER_JOB:
            counters.points_over_series_limit += 1
            rejected += 1
            continue
        job.flags[key] = (reason, value >= 1)
        job.last_seen = now
        counters.points_accepted += 1
    return rejected


def declines(flags: Mapping[tuple[str, ...], tuple[str, bool]]) -> tuple[str, ...]:
    """The reasons to decline a job with these flags (:attr:`JobState.flags
    <skewtrace.controller.jobs.JobState.flags>`): those flagged now, each once, sorted."""
    return tuple(sorted({reason for reason, on in flags.values() if on}))
