"""``skewtrace timeline watch``: first-change analysis every interval, as metrics and a span.

Every ``interval_s`` the watcher runs :func:`~.first_change.first_change` over the last
``since_s`` and, when it found a regression:

- sets the gauge ``training_first_change_seconds`` (``semconv.PROM_FIRST_CHANGE``) on its
  ``/metrics``: one series per change of the latest explained regression (labels
  ``training_job_id``, ``training_component_kind``, ``training_component``,
  ``training_signal``, ``training_change_order``), valued at the change's onset in Unix
  seconds. The series of an earlier regression are removed when a new one is explained.
- once per new regression, sends one ``timeline.first_change`` span (resource
  ``service.name=skewtrace-timeline``) with the first change's attributes and one
  ``training.change`` event per change. It goes into the trace of the step that was running
  at the regression's onset (trace ID ``step_trace_id(job, step)``, parent the step's root
  span), the step being the regressed rank's cumulative step count at the onset; when that
  count cannot be read, the span starts a trace of its own.

A failure to read Prometheus never stops the loop: it is logged (each kind of failure once
per ``LOG_REPEAT_S``, through :class:`skewtrace._log_limit.RepeatLimitFilter`) and the next
interval tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from skewtrace import _ids, semconv
from skewtrace._log_limit import RepeatLimitFilter
from skewtrace.timeline.first_change import Report, Settings, first_change
from skewtrace.timeline.prometheus_source import PrometheusError
from skewtrace.timeline.source import SeriesSource

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

SERVICE_NAME = "skewtrace-timeline"
LOG_REPEAT_S = 300.0
INSTRUMENTATION_SCOPE = "skewtrace.timeline"

logger = logging.getLogger("skewtrace.timeline")
_repeat_filter = RepeatLimitFilter(interval_s=LOG_REPEAT_S)
logger.addFilter(_repeat_filter)

label = semconv.prometheus_label
GAUGE_LABELS = (
    label(semconv.JOB_ID),
    label(semconv.COMPONENT_KIND),
    label(semconv.COMPONENT),
    label(semconv.SIGNAL),
    label(semconv.CHANGE_ORDER),
    label(semconv.CHANGE_EFFECT),
)


@dataclass(frozen=True)
class WatchConfig:
    job: str
    since_s: float = 600.0
    """How far back each run looks."""
    interval_s: float = 10.0
    """Seconds between runs."""
    settings: Settings = field(default_factory=Settings)


class Watcher:
    """Runs the analysis on a schedule and publishes what it finds."""

    def __init__(
        self,
        source: SeriesSource,
        config: WatchConfig,
        registry: CollectorRegistry | None = None,
        tracer_provider: TracerProvider | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # prometheus-client is the `timeline` extra: imported by the watcher only, so that
        # first-change, compare and the other commands run without it.
        from prometheus_client import CollectorRegistry, Gauge

        self.source = source
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.tracer_provider = tracer_provider
        self.clock = clock
        self.gauge = Gauge(
            semconv.PROM_FIRST_CHANGE,
            semconv.METRICS[semconv.METRIC_FIRST_CHANGE].description,
            GAUGE_LABELS,
            registry=self.registry,
        )
        self.latest: Report | None = None
        """The report of the latest explained regression."""
        self.spans_sent = 0
        self._reported_onset: float | None = None
        self._stop = threading.Event()

    def run_once(self) -> Report | None:
        """One analysis; None when it failed (logged)."""
        now = self.clock()
        try:
            report = first_change(
                self.source, self.config.job, now - self.config.since_s, now, self.config.settings
            )
        except PrometheusError as exc:
            logger.warning(
                f"timeline watch: Prometheus {exc.kind}: %s; trying again every %g s",
                exc,
                self.config.interval_s,
            )
            return None
        except Exception as exc:  # the loop must outlive anything a bad answer causes
            logger.warning(
                f"timeline watch: analysis failed ({type(exc).__name__}): %s", exc, exc_info=True
            )
            return None
        if report.regression is not None:
            self._publish(report)
        return report

    def _is_new(self, report: Report) -> bool:
        assert report.regression is not None
        previous = self._reported_onset
        # The same regression seen from a later window may move by a sample or two.
        return previous is None or abs(report.regression.onset - previous) > 3 * report.resolution

    def _publish(self, report: Report) -> None:
        new = self._is_new(report)
        # The same regression seen again may have gained or lost a change: rewrite them all.
        self.gauge.clear()
        for change in report.changes:
            self.gauge.labels(
                report.job,
                change.kind,
                change.component,
                change.signal,
                str(change.order),
                "true" if change.effect else "false",
            ).set(change.onset)
        self.latest = report
        if new:
            assert report.regression is not None
            self._reported_onset = report.regression.onset
            if self.tracer_provider is not None:
                self._send_span(report)

    def _send_span(self, report: Report) -> None:
        regression, first = report.regression, report.first
        assert regression is not None and first is not None
        attributes: dict[str, str | int | float] = {
            semconv.JOB_ID: report.job,
            semconv.COMPONENT_KIND: first.kind,
            semconv.COMPONENT: first.component,
            semconv.SIGNAL: first.signal,
            semconv.CHANGE_ONSET: first.onset,
            semconv.CHANGE_RATIO: first.ratio,
        }
        context = None
        if regression.step is not None:
            attributes[semconv.STEP] = regression.step
            parent = SpanContext(
                trace_id=_ids.step_trace_id(report.job, regression.step),
                span_id=_ids.step_root_span_id(report.job, regression.step),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
            context = trace.set_span_in_context(NonRecordingSpan(parent))
        if self.tracer_provider is None:
            return
        tracer = self.tracer_provider.get_tracer(INSTRUMENTATION_SCOPE)
        span = tracer.start_span(
            semconv.SPAN_FIRST_CHANGE,
            context=context,
            start_time=int(first.onset * 1e9),
            attributes=attributes,
        )
        for change in report.changes:
            span.add_event(
                semconv.EVENT_CHANGE, change.attributes(), timestamp=int(change.onset * 1e9)
            )
        span.end(end_time=int(max(first.onset, regression.onset) * 1e9))
        self.spans_sent += 1

    def run(self) -> None:
        """Until :meth:`stop`: one analysis, then wait the interval."""
        while not self._stop.is_set():
            started = time.monotonic()
            self.run_once()
            self._stop.wait(max(0.0, self.config.interval_s - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()


def timeline_tracer_provider(endpoint: str | None) -> TracerProvider:
    """A TracerProvider exporting over OTLP to ``endpoint`` (None: the ``OTEL_EXPORTER_OTLP_*``
    variables), with ``service.name=skewtrace-timeline``.

    The SDK's exporter, not skewtrace's fast encoder: that one writes no span events.
    """
    import os

    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    from skewtrace.rank._export.exporters import (
        OTEL_EXPORTER_OTLP_PROTOCOL,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    )

    protocol = (
        (
            os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
            or os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL)
            or "grpc"
        )
        .strip()
        .lower()
    )
    exporter: SpanExporter
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        if endpoint:
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        exporter = HttpSpanExporter(endpoint=endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint)
    provider = TracerProvider(resource=Resource.create({semconv.SERVICE_NAME: SERVICE_NAME}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
