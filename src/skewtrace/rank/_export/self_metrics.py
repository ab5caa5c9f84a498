"""skewtrace's metrics about itself: events dropped, spans exported, exports failed.

Observable counters: the hot path only bumps plain ints and the SDK reads them on its own
schedule. They go to the user's MeterProvider, else the global SDK one, else a private one
with the exporters of ``OTEL_METRICS_EXPORTER`` (:mod:`.exporters`; OTLP by default, none
at all for ``none``) every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (the SDK's reader parses it;
unset, skewtrace's default of 10 s applies rather than the SDK's 60 s).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.environment_variables import OTEL_METRIC_EXPORT_INTERVAL
from opentelemetry.sdk.resources import Resource

from skewtrace import semconv
from skewtrace._registry_instruments import observable
from skewtrace.rank._export.exporters import metric_readers
from skewtrace.rank._export.thread import ExportStats
from skewtrace.rank._recorder import Recorder
from skewtrace.version import __version__

DEFAULT_METRIC_EXPORT_INTERVAL_MILLIS = 10_000


def metric_export_interval_millis() -> int | None:
    """None where ``OTEL_METRIC_EXPORT_INTERVAL`` is set: the SDK's reader parses it then."""
    if os.environ.get(OTEL_METRIC_EXPORT_INTERVAL, "").strip():
        return None
    return DEFAULT_METRIC_EXPORT_INTERVAL_MILLIS


class SelfMetrics:
    """skewtrace.events.dropped / spans.exported / spans.export_failed as observable counters.

    Observable: the hot path only bumps plain ints; the SDK reads them on its own schedule.
    """

    def __init__(
        self,
        recorder: Recorder,
        stats: ExportStats,
        meter_provider: Any | None,
        resource: Callable[[], Resource | None],
    ) -> None:
        self._recorder = recorder
        self._stats = stats
        self._own_provider: Any | None = None
        self._meter_provider = meter_provider
        self._resource = resource
        self._started = False

    def start(self) -> None:
        """Register the counters; with no provider of the user's, on a private one with the
        rank's resource (so call this once the rank is identified) and the exporters of
        ``OTEL_METRICS_EXPORTER``. With that set to ``none`` nothing is registered."""
        if self._started:
            return
        self._started = True
        from opentelemetry.metrics import CallbackOptions, Observation

        provider = self._meter_provider
        if provider is None:
            from opentelemetry.sdk.metrics import MeterProvider

            readers = metric_readers(metric_export_interval_millis())
            if not readers:
                return
            resource = self._resource() or Resource.create({})
            provider = MeterProvider(metric_readers=readers, resource=resource)
            self._own_provider = provider
        meter = provider.get_meter("skewtrace", __version__)

        def dropped(_options: CallbackOptions) -> list[Observation]:
            counts = self._recorder.dropped()
            return [Observation(n, {semconv.REASON: reason}) for reason, n in counts.items()]

        def exported(_options: CallbackOptions) -> list[Observation]:
            return [Observation(self._stats.exported)]

        def failed(_options: CallbackOptions) -> list[Observation]:
            return [Observation(self._stats.failed)]

        observable(meter, semconv.METRIC_EVENTS_DROPPED, [dropped])
        observable(meter, semconv.METRIC_SPANS_EXPORTED, [exported])
        observable(meter, semconv.METRIC_SPANS_EXPORT_FAILED, [failed])

    def shutdown(self, timeout_millis: int) -> None:
        if self._own_provider is not None:
            self._own_provider.shutdown(timeout_millis=timeout_millis)
            self._own_provider = None
