"""The private OTLP exporters, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables.

Used when the user gave no TracerProvider (spans) or MeterProvider (self-metrics). gRPC is
the default; ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal variable) picks
``http/protobuf``. The gRPC span exporter is the SDK's (endpoint, headers, TLS, retries)
with its request encoding replaced by :class:`~.otlp_wire.FastSpanEncoder`: that replaces
the SDK's private ``_translate_data``, so it is used only with the exporter versions it is
tested against (``FAST_ENCODER_TESTED``, the same bounds as in ``pyproject.toml``), and
with any other version, or if the override fails, the SDK's own encoder runs and one line
says so.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from skewtrace._export.otlp_wire import FastSpanEncoder

logger = logging.getLogger("skewtrace")

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"

GRPC_EXPORTER_PACKAGE = "opentelemetry-exporter-otlp-proto-grpc"
FAST_ENCODER_TESTED = ((1, 30), (1, 46))
"""(lowest, first untested) (major, minor) of ``GRPC_EXPORTER_PACKAGE`` whose private
``_translate_data(spans) -> ExportTraceServiceRequest`` the fast encoder replaces. Its
byte-equality test runs against the installed version (1.45.2 when this was written); the
SDK's span encoding for these spans is unchanged since 1.30. Raise the upper bound together
with ``pyproject.toml``'s, after the test passes against the new version."""


def _protocol(signal_var: str) -> str:
    protocol = os.environ.get(signal_var) or os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL) or "grpc"
    protocol = protocol.strip().lower()
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(
            f"{OTEL_EXPORTER_OTLP_PROTOCOL}={protocol!r}: skewtrace supports grpc and http/protobuf"
        )
    return protocol


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


def otlp_span_exporter() -> SpanExporter:
    """An OTLP span exporter configured from the standard OTEL_EXPORTER_OTLP_* variables."""
    if _protocol(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) != "grpc":
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


def otlp_metric_exporter() -> Any:
    if _protocol(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()
