"""Rank histograms to deltas: every point of a rank's wait, lateness or step-duration
histogram (:data:`RANK_METRICS`) becomes what changed since the previous point of its series,
kept in its job's :class:`~skewtrace.controller.jobs.JobState` by rank.

The Collector's connector sends cumulative histograms by default (delta when configured).
Every series (metric name + job + the data point's attributes) keeps its last cumulative
point; each new point becomes a delta of ``count`` and ``sum``. A point whose start time
changed, or whose count went down, is a reset (the Collector restarted, the series was
evicted): the new point is taken as the delta since its own start. Deltas are stamped with the
time the pacer received them, not with the producer's timestamps, because window arithmetic
against another host's clock would inherit its offset.

Bounded whatever clients send: points beyond the table's jobs, ranks per job or series (in a
job, in all) are counted and dropped; a series costs a fixed size whatever its attributes (it
is keyed by a digest of them); deltas of one rank received within ``window_s / 16`` of each
other are merged, so a rank holds a bounded number of them however often points arrive; the
wait histogram's buckets are kept only up to 64 buckets, in at most 64 distinct layouts.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.proto.metrics.v1 import metrics_pb2

from skewtrace import semconv
from skewtrace.controller._limits import MAX_VALUE_LENGTH
from skewtrace.controller.jobs import JobState, JobTable
from skewtrace.controller.otlp_points import (
    AGGREGATION_TEMPORALITY_CUMULATIVE,
    AGGREGATION_TEMPORALITY_DELTA,
    attributes,
    parse_rank,
    point_count,
)

# The metrics the policy reads, by the field of RankSample they fill.
RANK_METRICS = {
    semconv.METRIC_RANK_WAIT: "wait",
    semconv.METRIC_RANK_LATENESS: "lateness",
    semconv.METRIC_STEP_DURATION: "step",
}

NEAR_ZERO_S = 0.001
"""A first histogram bucket bounded at or below this counts collectives that did not wait."""

# Deltas of one rank and kind received closer together than window_s / this are merged.
_DELTAS_PER_WINDOW = 16

# Wait histograms keep their buckets (for the rebalancing policy's estimate) up to this many
# buckets, in at most this many distinct layouts (one per Collector configuration, normally).
_MAX_BUCKETS = 64
_MAX_LAYOUTS = 64


@dataclass(slots=True)
class Series:
    """One series' last point (cumulative temporality; zeros for delta) and when it came."""

    seen_at: float
    start_time_unix_nano: int = 0
    count: int = 0
    total: float = 0.0
    near_zero: int = 0
    buckets: array[int] | None = None
    """Bucket counts (the wait histogram only), 8 bytes each."""
    bounds: tuple[float, ...] | None = None
    """Their bounds: one shared tuple per layout (``HistogramDeltas._layouts``)."""


@dataclass(frozen=True, slots=True)
class Delta:
    received_at: float
    kind: str
    count: int
    total: float
    near_zero: int
    """Observations in the first bucket when its bound is at most NEAR_ZERO_S (else 0)."""
    buckets: array[int] | None = None
    """The delta's bucket counts (the wait histogram only, for
    :func:`~skewtrace.controller.window_stats.top_sum`)."""
    bounds: tuple[float, ...] | None = None


SeriesKey = tuple[str, int, bytes]
"""(kind, rank, digest of all the point's and resource's attributes)."""


class HistogramDeltas:
    """Takes the ranks' histogram points into their jobs' deltas, within the table's bounds."""

    def __init__(self, table: JobTable, window_s: float) -> None:
        self._table = table
        self._merge_s = window_s / _DELTAS_PER_WINDOW
        self._layouts: dict[tuple[float, ...], tuple[float, ...]] = {}

    def ingest(
        self,
        metric: metrics_pb2.Metric,
        kind: str,
        data_field: str | None,
        resource_attrs: Mapping[str, str],
        now: float,
    ) -> int:
        """Take the points of one of :data:`RANK_METRICS` (``kind``: its field); returns how
        many were rejected."""
        counters = self._table.counters
        if data_field != "histogram":
            # The contract makes these histograms; anything else is a producer bug.
            points = point_count(metric, data_field)
            counters.points_invalid += points
            return points
        temporality = metric.histogram.aggregation_temporality
        rejected = 0
        for point in metric.histogram.data_points:
            if not self._ingest_point(kind, temporality, point, resource_attrs, now):
                rejected += 1
        return rejected

    def _ingest_point(
        self,
        kind: str,
        temporality: int,
        point: metrics_pb2.HistogramDataPoint,
        resource_attrs: Mapping[str, str],
        now: float,
    ) -> bool:
        table, counters = self._table, self._table.counters
        attrs = {**resource_attrs, **attributes(point.attributes)}
        job_id = attrs.get(semconv.JOB_ID, "")
        rank_text = attrs.get(semconv.RANK)
        if len(job_id) > MAX_VALUE_LENGTH or len(rank_text or "") > MAX_VALUE_LENGTH:
            counters.points_too_long += 1
            return False
        rank = parse_rank(rank_text)
        total = point.sum if point.HasField("sum") else 0.0
        if (
            not job_id
            or rank is None
            or not math.isfinite(total)
            or total < 0
            or temporality
            not in (AGGREGATION_TEMPORALITY_CUMULATIVE, AGGREGATION_TEMPORALITY_DELTA)
        ):
            counters.points_invalid += 1
            return False
        job = table.jobs.get(job_id)
        if job is None and len(table.jobs) >= table.max_jobs:
            counters.points_over_job_limit += 1
            return False
        if (
            job is not None
            and rank not in job.deltas
            and len(job.deltas) >= table.max_ranks_per_job
        ):
            counters.points_over_rank_limit += 1
            return False
        key: SeriesKey = (kind, rank, _digest(attrs))
        series = job.series.get(key) if job is not None else None
        if series is None and (
            table.series >= table.max_series
            or (job is not None and len(job.series) >= table.max_series_per_job)
        ):
            counters.points_over_series_limit += 1
            return False
        if job is None:
            job = table.jobs[job_id] = JobState(last_seen=now)
        known = series is not None
        if series is None:
            series = job.series[key] = Series(seen_at=now)
            table.series += 1
        series.seen_at = now

        count, delta_total = int(point.count), float(total)
        near_zero = _near_zero_count(point)
        bounds, buckets = self._kept_buckets(kind, point)
        bucket_delta = buckets
        if temporality == AGGREGATION_TEMPORALITY_CUMULATIVE:
            known_buckets = series.buckets
            if (
                buckets is not None
                and known_buckets is not None
                and series.bounds is bounds
                and series.start_time_unix_nano == point.start_time_unix_nano
            ):
                diff = array("q", (b - a for a, b in zip(known_buckets, buckets, strict=True)))
                bucket_delta = diff if min(diff, default=0) >= 0 else buckets
            series.buckets, series.bounds = buckets, bounds
        if temporality == AGGREGATION_TEMPORALITY_CUMULATIVE:
            if known and series.start_time_unix_nano == point.start_time_unix_nano:
                if (
                    count < series.count
                    or total < series.total - 1e-12
                    or near_zero < series.near_zero
                ):
                    counters.resets += 1
                    count, delta_total, near_zero = _reset(series, point, total, near_zero)
                else:
                    delta = count - series.count, total - series.total, near_zero - series.near_zero
                    _reset(series, point, total, near_zero)
                    count, delta_total, near_zero = delta
            else:
                if known:
                    counters.resets += 1
                count, delta_total, near_zero = _reset(series, point, total, near_zero)
        job.last_seen = now
        counters.points_accepted += 1
        if count == 0:
            # An unchanged cumulative point says the rank stopped producing spans; it must
            # not count as "still reporting".
            return True
        job.rank_last_seen[rank] = now
        if kind == "step":
            job.note_step(rank, count, delta_total, now)
            if known or temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
                job.stepped_at = now
        self._add_delta(
            job.deltas.setdefault(rank, deque()),
            Delta(now, kind, count, delta_total, min(near_zero, count), bucket_delta, bounds),
        )
        return True

    def _kept_buckets(
        self, kind: str, point: metrics_pb2.HistogramDataPoint
    ) -> tuple[tuple[float, ...] | None, array[int] | None]:
        """(bounds, bucket counts) kept for the wait histogram; (None, None) for the others,
        for points whose buckets do not match their bounds, for more than
        ``_MAX_BUCKETS`` buckets, or beyond ``_MAX_LAYOUTS`` distinct bounds (memory stays
        bounded whatever clients send; the estimate then falls back to ``wait_sum_s``)."""
        count = len(point.bucket_counts)
        if kind != "wait" or count != len(point.explicit_bounds) + 1 or count > _MAX_BUCKETS:
            return None, None
        key = tuple(point.explicit_bounds)
        bounds = self._layouts.get(key)
        if bounds is None:
            if len(self._layouts) >= _MAX_LAYOUTS:
                return None, None
            bounds = self._layouts[key] = key
        return bounds, array("q", point.bucket_counts)

    def _add_delta(self, deltas: deque[Delta], delta: Delta) -> None:
        """Append, or merge into the same kind's latest delta when it is that recent."""
        for index in range(len(deltas) - 1, max(-1, len(deltas) - 1 - len(RANK_METRICS)), -1):
            previous = deltas[index]
            if previous.kind != delta.kind:
                continue
            if delta.received_at - previous.received_at < self._merge_s and (
                previous.bounds is delta.bounds
            ):
                buckets = None
                if previous.buckets is not None and delta.buckets is not None:
                    buckets = array(
                        "q", (a + b for a, b in zip(previous.buckets, delta.buckets, strict=True))
                    )
                deltas[index] = Delta(
                    previous.received_at,
                    delta.kind,
                    previous.count + delta.count,
                    previous.total + delta.total,
                    previous.near_zero + delta.near_zero,
                    buckets,
                    previous.bounds,
                )
                return
            break
        deltas.append(delta)


def _reset(
    series: Series, point: metrics_pb2.HistogramDataPoint, total: float, near_zero: int
) -> tuple[int, float, int]:
    """Make ``point`` the series' last cumulative point; returns it as (count, sum, near zero)."""
    series.start_time_unix_nano = point.start_time_unix_nano
    series.count, series.total, series.near_zero = int(point.count), total, near_zero
    return series.count, total, near_zero


def _digest(attrs: Mapping[str, str]) -> bytes:
    """A fixed-size identity of an attribute set (length-prefixed, so it is unambiguous)."""
    h = hashlib.blake2b(digest_size=16)
    for key, value in sorted(attrs.items()):
        h.update(f"{len(key)}:{key}{len(value)}:{value}".encode("utf-8", "surrogateescape"))
    return h.digest()


def _near_zero_count(point: metrics_pb2.HistogramDataPoint) -> int:
    if point.explicit_bounds and point.bucket_counts and point.explicit_bounds[0] <= NEAR_ZERO_S:
        return int(point.bucket_counts[0])
    return 0
