"""The pacer's own metrics: every job's published decision as gauges (pacing on, each rank's
delay and share, the pacing policy's measured effect), a count of decisions, and the counts by
reason of what the servers refused and the windows dropped (the same numbers as ``/healthz``);
exported over OTLP when ``metrics_endpoint`` is set, else kept in the process.

The gauges are read when the metrics are collected, from a snapshot of the published bodies
that the service takes under its lock; nothing here keeps a decision of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.metrics import Observation

from skewtrace import semconv
from skewtrace._registry_instruments import counter, observable
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.policies.pacing import PacingPolicy
from skewtrace.decision import DecisionBody


def register_instruments(
    meter: Any,
    decisions: Callable[[], Mapping[str, DecisionBody]],
    by_reason: Iterable[tuple[str, Callable[[], Mapping[str, int]]]],
) -> Any:
    """Register the pacer's instruments on ``meter``: the gauges read ``decisions`` (every
    job's published body, by job id), each metric of ``by_reason`` its counts by reason.
    Returns the decisions counter, which the service adds to for each job it decides."""
    observable(meter, semconv.METRIC_PACING_ACTIVE, [lambda options: _active(decisions())])
    observable(meter, semconv.METRIC_PACING_DELAY, [lambda options: _delays(decisions())])
    observable(meter, semconv.METRIC_REBALANCE_SHARE, [lambda options: _shares(decisions())])
    observable(meter, semconv.METRIC_CONTROLLER_EFFECT, [lambda options: _effect(decisions())])
    decisions_counter = counter(meter, semconv.METRIC_PACING_DECISIONS)
    for name, read in by_reason:
        observable(meter, name, [lambda options, read=read: _by_reason(read())])
    return decisions_counter


def _active(bodies: Mapping[str, DecisionBody]) -> Iterable[Observation]:
    return [
        Observation(1 if body.active else 0, {semconv.JOB_ID: job}) for job, body in bodies.items()
    ]


def _delays(bodies: Mapping[str, DecisionBody]) -> Iterable[Observation]:
    observations = []
    for job, body in bodies.items():
        for rank, delay in body.delays.items():
            observations.append(Observation(delay, {semconv.JOB_ID: job, semconv.RANK: rank}))
    return observations


def _effect(bodies: Mapping[str, DecisionBody]) -> Iterable[Observation]:
    return [
        Observation(
            body.effect.gain,
            {semconv.JOB_ID: job, semconv.CONTROLLER_POLICY: PacingPolicy.name},
        )
        for job, body in bodies.items()
        if body.effect is not None and body.effect.pairs
    ]


def _shares(bodies: Mapping[str, DecisionBody]) -> Iterable[Observation]:
    return [
        Observation(share, {semconv.JOB_ID: job, semconv.RANK: rank})
        for job, body in bodies.items()
        for rank, share in (body.shares or {}).items()
    ]


def _by_reason(counts: Mapping[str, int]) -> list[Observation]:
    return [Observation(n, {semconv.REASON: reason}) for reason, n in counts.items()]


def build_meter_provider(config: PacerConfig) -> Any:
    """The SDK meter provider for the pacer's own metrics: with a periodic OTLP/gRPC export to
    ``config.metrics_endpoint``, or none (kept in the process) without one."""
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({semconv.SERVICE_NAME: "skewtrace-pacer"})
    if not config.metrics_endpoint:
        return SdkMeterProvider(resource=resource)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    # The exporter retries and logs on its own thread; an unreachable endpoint costs log lines,
    # never the service. It reads OTEL_EXPORTER_OTLP_(METRICS_)HEADERS (an authorization header
    # for a Collector that requires one) and, for an https:// endpoint, ..._CERTIFICATE.
    insecure = not config.metrics_endpoint.startswith("https://")
    exporter = OTLPMetricExporter(endpoint=config.metrics_endpoint, insecure=insecure, timeout=5)
    reader = PeriodicExportingMetricReader(
        exporter,
        export_interval_millis=config.metrics_interval_s * 1000,
        export_timeout_millis=5000,
    )
    return SdkMeterProvider(resource=resource, metric_readers=[reader])
