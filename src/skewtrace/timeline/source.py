"""Where the timeline reads series from: the interface, and an in-memory source for tests.

The analysis asks for one metric of one job over a time range in one of a few forms
(:class:`Form`); :class:`~skewtrace.timeline.prometheus_source.PrometheusSource` turns that
into PromQL, :class:`MemorySource` answers from series it was given (already in that form).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol


class TimelineError(Exception):
    """The timeline could not be computed; the message says why (shown without traceback)."""


class Form(enum.Enum):
    """How a metric becomes a series the detector can read."""

    GAUGE = "gauge"
    """The sampled value."""
    RATE = "rate"
    """A counter's per-second rate."""
    MEAN = "mean"
    """A histogram's mean per observation: rate of ``_sum`` over rate of ``_count``."""
    RATIO = "ratio"
    """A counter's rate over another counter's rate (the query's ``denominator``)."""
    RAW = "raw"
    """The stored value as is (a counter's cumulative count)."""


@dataclass(frozen=True)
class Query:
    """One metric of a job, in one form."""

    metric: str
    """Its Prometheus name (``semconv.PROM_*``; for RAW of a histogram, with ``_count``)."""
    form: Form
    denominator: str | None = None
    """For :attr:`Form.RATIO`: the counter the rate is divided by."""
    labels: tuple[tuple[str, str], ...] = ()
    """Extra equality matchers (Prometheus label names) besides the job's."""


@dataclass(frozen=True)
class Series:
    """One labelled time series (Unix seconds, values)."""

    labels: Mapping[str, str]
    times: Sequence[float]
    values: Sequence[float]


class SeriesSource(Protocol):
    """What the analysis needs from a metrics store."""

    def series(self, query: Query, job: str, start: float, end: float) -> list[Series]:
        """Every series of ``query`` for ``job`` with samples in [start, end]."""
        ...

    def resolution(self, start: float, end: float) -> float:
        """Seconds between the samples :meth:`series` returns for this range."""
        ...

    def smear_s(self, query: Query, start: float, end: float) -> float:
        """How long a step in the underlying data takes to show fully in ``query``'s series
        (the rate window of a rate, mean or ratio; 0 for a gauge)."""
        ...


@dataclass
class MemorySource:
    """Series given in memory, already in the form they are asked in (tests, replays).

    ``add(metric, labels, times, values)`` stores a series under the metric's Prometheus name;
    a query finds the series stored under its ``metric`` whose labels include the job label and
    the query's matchers, cut to the time range.
    """

    job_label: str
    step_s: float = 1.0
    window_s: float = 0.0
    """The rate window the stored rates, means and ratios were computed over (0: none)."""
    _series: dict[str, list[Series]] = field(default_factory=dict)

    def add(
        self,
        metric: str,
        labels: Mapping[str, str],
        times: Sequence[float],
        values: Sequence[float],
    ) -> None:
        self._series.setdefault(metric, []).append(Series(dict(labels), times, values))

    def series(self, query: Query, job: str, start: float, end: float) -> list[Series]:
        found = []
        for stored in self._series.get(query.metric, []):
            if stored.labels.get(self.job_label) != job:
                continue
            if any(stored.labels.get(key) != value for key, value in query.labels):
                continue
            kept = [
                (t, v)
                for t, v in zip(stored.times, stored.values, strict=True)
                if start <= t <= end
            ]
            if kept:
                found.append(Series(stored.labels, [t for t, _ in kept], [v for _, v in kept]))
        return found

    def resolution(self, start: float, end: float) -> float:
        return self.step_s

    def smear_s(self, query: Query, start: float, end: float) -> float:
        return 0.0 if query.form in (Form.GAUGE, Form.RAW) else self.window_s
