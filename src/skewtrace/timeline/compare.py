"""Before and after: the same job's signals over two time ranges, largest relative change first.

Each figure is the mean (and for the step time also the median, ``p50``) of the sampled
series over the range, at the source's resolution: the job's step time (per sample, the
slowest rank's mean step time), barrier skew per process group and op (histogram mean), each
flagged rank's cost per step (``training.rank.cost``), and every node signal the first-change
analysis reads (a counter's rate, a gauge's value) on every host of the job. A mean of
per-interval means weighs each interval equally, not each step: close to the true mean when
steps are short against the interval, which is what the comparison is for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, median
from typing import Any

from skewtrace import semconv
from skewtrace.timeline import signals as sig
from skewtrace.timeline.changepoint import ZERO_BASELINE_RATIO
from skewtrace.timeline.first_change import _job_max
from skewtrace.timeline.source import Form, Query, Series, SeriesSource


@dataclass(frozen=True)
class TimeRange:
    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError(f"a time range must end after it starts ({self.start}..{self.end})")


@dataclass(frozen=True)
class Row:
    kind: str
    component: str
    signal: str
    statistic: str
    before: float
    after: float

    @property
    def change(self) -> float:
        """Relative change (0.5: +50%); :data:`ZERO_BASELINE_RATIO` from zero to non-zero."""
        if self.before == 0:
            return 0.0 if self.after == 0 else math.copysign(ZERO_BASELINE_RATIO, self.after)
        return (self.after - self.before) / abs(self.before)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "component": self.component,
            "signal": self.signal,
            "statistic": self.statistic,
            "before": self.before,
            "after": self.after,
            "change": self.change,
        }


@dataclass(frozen=True)
class Comparison:
    job: str
    before: TimeRange
    after: TimeRange
    rows: tuple[Row, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "before": {"start": self.before.start, "end": self.before.end},
            "after": {"start": self.after.start, "end": self.after.end},
            "rows": [row.to_json() for row in self.rows],
        }

    def table(self) -> str:
        header = ("component", "signal", "stat", "before", "after", "change")
        lines = [
            (
                row.component,
                row.signal,
                row.statistic,
                f"{row.before:.4g}",
                f"{row.after:.4g}",
                "from zero" if abs(row.change) >= ZERO_BASELINE_RATIO else f"{row.change:+.1%}",
            )
            for row in self.rows
        ]
        columns = zip(header, *lines, strict=True)
        widths = [max(len(cell) for cell in column) for column in columns]
        return "\n".join(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in (header, *lines)
        )


def _values(series: Iterable[Series]) -> list[float]:
    return [v for s in series for v in s.values if math.isfinite(v)]


def _by_labels(series: Sequence[Series]) -> dict[tuple[tuple[str, str], ...], Series]:
    return {tuple(sorted(s.labels.items())): s for s in series}


def compare(source: SeriesSource, job: str, before: TimeRange, after: TimeRange) -> Comparison:
    rows: list[Row] = []

    def both(query: Query) -> tuple[list[Series], list[Series]]:
        return (
            source.series(query, job, before.start, before.end),
            source.series(query, job, after.start, after.end),
        )

    step_before, step_after = both(sig.STEP_TIME)
    b, a = _job_max(step_before)[1], _job_max(step_after)[1]
    if b and a:
        for statistic, function in (("mean", fmean), ("p50", median)):
            rows.append(
                Row(semconv.COMPONENT_STEP, job, semconv.METRIC_STEP_DURATION, statistic,
                    function(b), function(a))
            )  # fmt: skip

    per_series: list[tuple[str, Query, Any, Any]] = [
        (
            semconv.COMPONENT_COLLECTIVE,
            Query(semconv.PROM_BARRIER_SKEW, Form.MEAN),
            sig.process_group,
            lambda labels: f"{semconv.METRIC_BARRIER_SKEW}{{{labels.get(sig.OP, '')}}}",
        ),
        (
            semconv.COMPONENT_STEP,
            Query(semconv.PROM_RANK_COST, Form.GAUGE),
            sig.rank_on_host,
            lambda labels: semconv.METRIC_RANK_COST,
        ),
    ]
    per_series += [
        (signal.kind, signal.query, signal.component, signal.signal_name) for signal in sig.SIGNALS
    ]
    for kind, query, component, signal_name in per_series:
        series_before, series_after = both(query)
        after_by = _by_labels(series_after)
        for key, earlier in _by_labels(series_before).items():
            later = after_by.get(key)
            if later is None:
                continue
            b, a = _values([earlier]), _values([later])
            if b and a:
                labels = dict(key)
                rows.append(
                    Row(kind, component(labels), signal_name(labels), "mean", fmean(b), fmean(a))
                )
    rows.sort(key=lambda row: (-abs(row.change), row.component, row.signal, row.statistic))
    return Comparison(job, before, after, tuple(rows))
