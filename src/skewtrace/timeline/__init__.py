"""The timeline: which component changed first before a job slowed down, read from Prometheus.

Prometheus already holds the history of every series skewtrace produces (the Collector's
step times, skew and collective transfers; the ranks' node telemetry), each with the labels
that join it to ranks, hosts, NICs and switches. The Collector keeps only per-step state.
So this package reads Prometheus:

- :func:`first_change`: the job's step-time regression (:mod:`.changepoint`), then every
  signal on the regressed ranks' hosts that changed before it, earliest first, named by
  ``training.component.kind`` / ``training.component`` / ``training.signal``;
- :func:`compare`: a job's figures over two time ranges, largest relative change first;
- :class:`Watcher`: the first-change analysis every interval, published as the
  ``training_first_change_seconds`` gauge and one ``timeline.first_change`` span per
  regression in the trace of the step it started in.

From the command line: ``skewtrace timeline first-change | compare | watch``
(:mod:`.command`; ``docs/timeline.md``).
"""

from skewtrace.timeline.changepoint import Change, DetectorParams, detect
from skewtrace.timeline.compare import Comparison, TimeRange, compare
from skewtrace.timeline.first_change import (
    ComponentChange,
    Regression,
    Report,
    Settings,
    first_change,
)
from skewtrace.timeline.prometheus_source import PrometheusError, PrometheusSource
from skewtrace.timeline.service import WatchConfig, Watcher
from skewtrace.timeline.source import Form, MemorySource, Query, Series, SeriesSource, TimelineError

__all__ = [
    "Change",
    "Comparison",
    "ComponentChange",
    "DetectorParams",
    "Form",
    "MemorySource",
    "PrometheusError",
    "PrometheusSource",
    "Query",
    "Regression",
    "Report",
    "Series",
    "SeriesSource",
    "Settings",
    "TimeRange",
    "TimelineError",
    "WatchConfig",
    "Watcher",
    "compare",
    "detect",
    "first_change",
]
