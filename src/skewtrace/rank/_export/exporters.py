"""The private exporters, chosen and configured by OpenTelemetry's own variables.

Used when the user gave no TracerProvider (spans) or MeterProvider (self-metrics, node
telemetry). Which exporters: ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER``, read as
the SDK's configurator reads them (:func:`exporter_names`): unset means ``otlp``, ``none``
means no exporter at all, a comma-separated list means each of them; ``otlp`` (and the SDK's
``otlp_proto_grpc``/``otlp_proto_http``) is skewtrace's OTLP exporter, any other name is the
exporter installed under that name (entry point groups ``opentelemetry_traces_exporter`` and
``opentelemetry_metrics_exporter``: the SDK's ``console``, for one); a name that is not
installed is a :class:`~skewtrace.rank.config.ConfigError` from ``instrument()``. Pull metric
readers (``prometheus``) are not supported on skewtrace's private meter provider: give
``instrument()`` a ``meter_provider`` with one instead.

Where to: the exporters read ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the per-signal
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``/``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` themselves,
with the specification's semantics: for http/protobuf a per-signal endpoint is used as it is
and the general one gets ``/v1/traces`` or ``/v1/metrics`` appended; for gRPC either is the
server's address. gRPC is the default; ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal
variable, which wins) picks ``http/protobuf``.

The gRPC span exporter is the SDK's (endpoint, headers, TLS, retries) with its request
encoding replaced by :class:`~.otlp_wire.FastSpanEncoder`: that replaces the SDK's private
``_translate_data``, so it is used only with the exporter versions it is tested against
(``FAST_ENCODER_TESTED``, the same bounds as in ``pyproject.toml``), and with any other
version, or if the override fails, the SDK's own encoder runs and one line says so.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from skewtrace._options import ConfigError
from skewtrace.rank._export.otlp_wire import FastSpanEncoder

logger = logging.getLogger("skewtrace")

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"

Signal = Literal["traces", "metrics"]
_EXPORTER_VAR: dict[str, str] = {"traces": OTEL_TRACES_EXPORTER, "metrics": OTEL_METRICS_EXPORTER}
_PROTOCOL_VAR: dict[str, str] = {
    "traces": OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    "metrics": OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
}
_ENTRY_POINT_GROUP: dict[str, str] = {
    "traces": "opentelemetry_traces_exporter",
    "metrics": "opentelemetry_metrics_exporter",
}
# The SDK's names for OTLP -> the protocol they fix (None: the protocol variables decide).
_OTLP_NAMES: dict[str, str | None] = {
    "otlp": None,
    "otlp_proto_grpc": "grpc",
    "otlp_proto_http": "http/protobuf",
}
_PROTOCOLS = ("grpc", "http/protobuf")

GRPC_EXPORTER_PACKAGE = "opentelemetry-exporter-otlp-proto-grpc"
FAST_ENCODER_TESTED = ((1, 30), (1, 46))
"""(lowest, first untested) (major, minor) of ``GRPC_EXPORTER_PACKAGE`` whose private
``_translate_data(spans) -> ExportTraceServiceRequest`` the fast encoder replaces. Its
byte-equality test runs against the installed version (1.45.2 when this was written); the
SDK's span encoding for these spans is unchanged since 1.30. Raise the upper bound together
with ``pyproject.toml``'s, after the test passes against the new version."""


def _protocol(signal_var: str, env: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol of a signal: its own variable, else the general one, else grpc."""
    env = os.environ if env is None else env
    for name in (signal_var, OTEL_EXPORTER_OTLP_PROTOCOL):
        raw = env.get(name, "")
        if raw.strip():
            protocol = raw.strip().lower()
            if protocol not in _PROTOCOLS:
                raise ConfigError(f"{name}={raw!r}: skewtrace supports grpc and http/protobuf")
            return protocol
    return "grpc"


def exporter_names(signal: Signal, env: Mapping[str, str] | None = None) -> list[str]:
    """``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER`` as names: unset or blank is
    ``["otlp"]`` (the SDK's default), ``none`` is ``[]``."""
    env = os.environ if env is None else env
    var = _EXPORTER_VAR[signal]
    raw = env.get(var, "")
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if not names:
        return ["otlp"]
    if any(name.lower() == "none" for name in names):
        if len(names) > 1:
            raise ConfigError(f"{var}={raw!r}: none cannot be combined with other exporters")
        return []
    return names


def _installed_exporter(signal: Signal, name: str) -> type:
    var, group = _EXPORTER_VAR[signal], _ENTRY_POINT_GROUP[signal]
    found = importlib.metadata.entry_points(group=group, name=name)
    if not found:
        installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})
        raise ConfigError(
            f"{var}: no exporter named {name!r} is installed (entry points "
            f"{group}: {', '.join(installed) or 'none'}; or use otlp or none)"
        )
    try:
        loaded = next(iter(found)).load()
    except Exception as exc:
        raise ConfigError(f"{var}: exporter {name!r} could not be loaded ({exc!r})") from None
    if not isinstance(loaded, type):
        raise ConfigError(f"{var}: {name!r} is not an exporter class")
    return loaded


def _span_builder(name: str, env: Mapping[str, str] | None) -> Callable[[], SpanExporter]:
    key = name.lower()
    if key in _OTLP_NAMES:
        protocol = _OTLP_NAMES[key] or _protocol(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, env)
        return lambda: otlp_span_exporter(protocol)
    cls = _installed_exporter("traces", name)
    if not issubclass(cls, SpanExporter):
        raise ConfigError(f"{OTEL_TRACES_EXPORTER}: {name!r} is not a span exporter")
    return cls


def span_exporter_factory(
    env: Mapping[str, str] | None = None,
) -> Callable[[], SpanExporter] | None:
    """What builds the private span exporter, None for ``OTEL_TRACES_EXPORTER=none``.

    Checks now (a :class:`ConfigError` from ``instrument()``); builds when called (on the
    export thread, so that a slow channel setup costs training nothing).
    """
    builders = [_span_builder(name, env) for name in exporter_names("traces", env)]
    if not builders:
        return None
    if len(builders) == 1:
        return builders[0]
    return lambda: FanOutSpanExporter([build() for build in builders])


class FanOutSpanExporter(SpanExporter):
    """Several span exporters (``OTEL_TRACES_EXPORTER=otlp,console``); a failure of one is
    a failure of the export."""

    def __init__(self, exporters: Sequence[SpanExporter]) -> None:
        self.exporters = list(exporters)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        results = [exporter.export(spans) for exporter in self.exporters]
        ok = all(result == SpanExportResult.SUCCESS for result in results)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        for exporter in self.exporters:
            exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all(exporter.force_flush(timeout_millis) for exporter in self.exporters)


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def fast_encoder_refusal(exporter_class: type, version: str | None) -> str | None:
    """Why the fast encoder must not replace ``exporter_class``'s, or None when it may."""
    low, high = FAST_ENCODER_TESTED
    tested = f"{low[0]}.{low[1]} to {high[0]}.{high[1] - 1}"
    match = re.match(r"(\d+)\.(\d+)", version or "")
    if match is None:
        return f"{GRPC_EXPORTER_PACKAGE} version {version!r} is not known"
    minor = (int(match.group(1)), int(match.group(2)))
    if not low <= minor < high:
        return f"{GRPC_EXPORTER_PACKAGE} {version} is outside the tested {tested}"
    if not callable(getattr(exporter_class, "_translate_data", None)):
        return f"{GRPC_EXPORTER_PACKAGE} {version} has no _translate_data to replace"
    return None


def otlp_span_exporter(protocol: str | None = None) -> SpanExporter:
    """An OTLP span exporter configured from the standard OTEL_EXPORTER_OTLP_* variables
    (``protocol`` None: the protocol variables decide)."""
    if (protocol or _protocol(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)) != "grpc":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpSpanExporter,
        )

        return HttpSpanExporter()

    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    refusal = fast_encoder_refusal(OTLPSpanExporter, _installed_version(GRPC_EXPORTER_PACKAGE))
    if refusal is not None:
        logger.warning(
            "skewtrace: %s; spans are encoded by the SDK's OTLP encoder (about 10x slower)",
            refusal,
        )
        return OTLPSpanExporter()
    return _fast_grpc_exporter_class(OTLPSpanExporter)()


def _fast_grpc_exporter_class(base: type[Any]) -> type[SpanExporter]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    encoder = FastSpanEncoder()

    class FastOTLPSpanExporter(base):
        """The SDK's gRPC exporter (endpoint, headers, TLS, retries) with our encoder."""

        _fast = True

        def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
            if self._fast:
                try:
                    # Parsing the bytes back is C code (upb); building messages field by
                    # field from Python is what made the SDK encoder slow.
                    return ExportTraceServiceRequest.FromString(encoder.encode(data))
                except Exception:
                    self._fast = False
                    logger.warning(
                        "skewtrace: the fast OTLP span encoder failed; using the SDK's from now on",
                        exc_info=True,
                    )
            return super()._translate_data(data)

    return FastOTLPSpanExporter


def otlp_metric_exporter(protocol: str | None = None) -> Any:
    if (protocol or _protocol(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL)) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()


def _metric_builder(name: str, env: Mapping[str, str] | None) -> Callable[[], Any]:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

    key = name.lower()
    if key in _OTLP_NAMES:
        protocol = _OTLP_NAMES[key] or _protocol(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL, env)
        return lambda: otlp_metric_exporter(protocol)
    cls = _installed_exporter("metrics", name)
    if issubclass(cls, MetricReader):
        raise ConfigError(
            f"{OTEL_METRICS_EXPORTER}: {name!r} is a pull reader, which skewtrace's private "
            "meter provider does not serve; pass instrument() a meter_provider with it"
        )
    if not issubclass(cls, MetricExporter):
        raise ConfigError(f"{OTEL_METRICS_EXPORTER}: {name!r} is not a metric exporter")
    return cls


def metric_exporter_factories(env: Mapping[str, str] | None = None) -> list[Callable[[], Any]]:
    """What builds each private metric exporter; empty for ``OTEL_METRICS_EXPORTER=none``.
    Checks now, like :func:`span_exporter_factory`."""
    return [_metric_builder(name, env) for name in exporter_names("metrics", env)]


def metric_readers(export_interval_millis: float | None) -> list[Any]:
    """A periodic reader per exporter of ``OTEL_METRICS_EXPORTER`` (none: no reader);
    ``export_interval_millis`` None lets the reader read ``OTEL_METRIC_EXPORT_INTERVAL``."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return [
        PeriodicExportingMetricReader(build(), export_interval_millis=export_interval_millis)
        for build in metric_exporter_factories()
    ]
