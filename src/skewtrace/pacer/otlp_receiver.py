"""An OTLP/gRPC MetricsService server: where the Collector's OTLP exporter pushes the metrics.

The messages are the generated ``opentelemetry-proto`` classes, so nothing is parsed by hand.
The method handler is registered with a deserializer that does not raise: a request that
does not decode is counted and answered ``INVALID_ARGUMENT`` instead of surfacing as an
anonymous ``INTERNAL`` error in grpc's own logs. Points the pacer cannot use are reported back
to the exporter in ``partial_success.rejected_data_points`` (OTLP's way to say "dropped, do not
retry").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

_log = logging.getLogger(__name__)

_SERVICE_NAME = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name

ExportRequest = metrics_service_pb2.ExportMetricsServiceRequest
ExportResponse = metrics_service_pb2.ExportMetricsServiceResponse

IngestFn = Callable[[ExportRequest], int]
"""Takes a decoded request, returns the number of rejected data points; must not raise."""


@dataclass(frozen=True)
class _Undecodable:
    error: str


def _decode(raw: bytes) -> ExportRequest | _Undecodable:
    try:
        return ExportRequest.FromString(raw)
    except Exception as exc:  # protobuf raises DecodeError, but any failure means the same
        return _Undecodable(f"{type(exc).__name__}: {exc}")


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Decodes export requests and hands them to ``ingest``; counts what it could not take."""

    def __init__(self, ingest: IngestFn) -> None:
        self._ingest = ingest
        self.requests_undecodable = 0
        self.requests_failed = 0

    def Export(
        self, request: ExportRequest | _Undecodable, context: grpc.ServicerContext
    ) -> ExportResponse:
        if isinstance(request, _Undecodable):
            self.requests_undecodable += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {request.error}")
        assert isinstance(request, ExportRequest)
        try:
            rejected = self._ingest(request)
        except Exception:
            # The policy's state must never take the receiver down; the exporter retries.
            self.requests_failed += 1
            _log.exception("failed to ingest an OTLP metrics request")
            context.abort(grpc.StatusCode.INTERNAL, "pacer failed to ingest the request")
        response = ExportResponse()
        if rejected:
            response.partial_success.rejected_data_points = rejected
            response.partial_success.error_message = (
                "data points without training.job.id/training.rank, of the wrong type or "
                "with invalid values were dropped"
            )
        return response


class OtlpMetricsServer:
    """The gRPC server; ``port`` is the bound port (useful with port 0)."""

    def __init__(self, host: str, port: int, ingest: IngestFn, *, max_workers: int = 4) -> None:
        self.receiver = MetricsReceiver(ingest)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pacer-otlp"),
            options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self.receiver.Export,
            request_deserializer=_decode,
            response_serializer=ExportResponse.SerializeToString,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(_SERVICE_NAME, {"Export": handler}),)
        )
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc raises (older versions returned 0)
            raise OSError(f"cannot bind the OTLP gRPC receiver to {host}:{port}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot bind the OTLP gRPC receiver to {host}:{port}")
        self.host = host

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 1.0) -> None:
        self._server.stop(grace_s).wait(grace_s + 1.0)
