"""An OTLP/gRPC MetricsService server: where the Collector's OTLP exporter pushes the metrics.

The messages are the generated ``opentelemetry-proto`` classes, so nothing is parsed by hand.
Requests are refused, counted (:attr:`MetricsReceiver.refused`, by reason) and never reach the
pacer's state when:

- ``unauthenticated``: a token is configured and the call's ``authorization`` metadata is not
  ``Bearer <token>`` (scheme in any case). Checked from the call's metadata, before its
  message is read (let alone decoded); answered ``UNAUTHENTICATED``.
- ``undecodable``: the message is not an ``ExportMetricsServiceRequest``. The method handler
  is registered with a deserializer that does not raise, so this is answered
  ``INVALID_ARGUMENT`` instead of surfacing as an anonymous ``INTERNAL`` error in grpc's logs.
- ``ingest_failed``: the pacer failed on it (a bug); answered ``INTERNAL``, the exporter retries.

Points the pacer cannot use are reported back to the exporter in
``partial_success.rejected_data_points`` (OTLP's way to say "dropped, do not retry").

With TLS files configured the server speaks TLS, and with a client CA it requires a client
certificate that CA signed (mTLS); see :func:`skewtrace.controller._auth.grpc_server_credentials`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from skewtrace.controller._auth import BearerToken
from skewtrace.controller._limits import LogBudget, ReasonCounts

_log = logging.getLogger(__name__)

_SERVICE_NAME = metrics_service_pb2.DESCRIPTOR.services_by_name["MetricsService"].full_name
_EXPORT_METHOD = f"/{_SERVICE_NAME}/Export"

# Calls in progress or queued at once; more are refused with RESOURCE_EXHAUSTED by grpc itself
# (the exporter retries), so a flood cannot queue requests without bound.
_MAX_CONCURRENT_RPCS = 16
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

REFUSED_UNAUTHENTICATED = "unauthenticated"
REFUSED_UNDECODABLE = "undecodable"
REFUSED_INGEST_FAILED = "ingest_failed"
REFUSED_REASONS = (REFUSED_UNAUTHENTICATED, REFUSED_UNDECODABLE, REFUSED_INGEST_FAILED)

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


_NOT_READ = b""


def _discard(raw: bytes) -> bytes:
    """The deserializer of refused calls: their bytes are never parsed (None would be an error)."""
    return _NOT_READ


class MetricsReceiver(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Decodes export requests and hands them to ``ingest``; counts what it refused."""

    def __init__(self, ingest: IngestFn, *, log_budget: LogBudget | None = None) -> None:
        self._ingest = ingest
        self._log_budget = log_budget or LogBudget()
        self.refused = ReasonCounts(*REFUSED_REASONS)

    @property
    def requests_undecodable(self) -> int:
        return self.refused.get(REFUSED_UNDECODABLE)

    @property
    def requests_failed(self) -> int:
        return self.refused.get(REFUSED_INGEST_FAILED)

    @property
    def requests_unauthenticated(self) -> int:
        return self.refused.get(REFUSED_UNAUTHENTICATED)

    def Export(
        self, request: ExportRequest | _Undecodable, context: grpc.ServicerContext
    ) -> ExportResponse:
        if isinstance(request, _Undecodable):
            self.refused.add(REFUSED_UNDECODABLE)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"undecodable request: {request.error}")
        assert isinstance(request, ExportRequest)
        try:
            rejected = self._ingest(request)
        except Exception:
            # The policy's state must never take the receiver down; the exporter retries.
            self.refused.add(REFUSED_INGEST_FAILED)
            self._log_budget.log(
                _log, logging.ERROR, "failed to ingest an OTLP metrics request", exc_info=True
            )
            context.abort(grpc.StatusCode.INTERNAL, "pacer failed to ingest the request")
        response = ExportResponse()
        if rejected:
            response.partial_success.rejected_data_points = rejected
            response.partial_success.error_message = (
                "data points without training.job.id/training.rank, of the wrong type, with "
                "invalid or too long values, or beyond the pacer's limits were dropped"
            )
        return response

    def refuse_unauthenticated(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> None:
        self.refused.add(REFUSED_UNAUTHENTICATED)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")


class _MetricsHandler(grpc.GenericRpcHandler):
    """Routes ``Export`` to the receiver, or to the refusal when the token does not match."""

    def __init__(self, receiver: MetricsReceiver, token: BearerToken | None) -> None:
        self._token = token
        self._export = grpc.unary_unary_rpc_method_handler(
            receiver.Export,
            request_deserializer=_decode,
            response_serializer=ExportResponse.SerializeToString,
        )
        # Streaming on this side (the wire is the same for a unary client): the refusal never
        # asks for the message, so an unauthenticated caller cannot make the pacer buffer one.
        self._refuse = grpc.stream_unary_rpc_method_handler(
            receiver.refuse_unauthenticated,
            request_deserializer=_discard,
            response_serializer=ExportResponse.SerializeToString,
        )

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        if handler_call_details.method != _EXPORT_METHOD:
            return None  # grpc answers UNIMPLEMENTED
        if self._token is None:
            return self._export
        header = _metadata_value(handler_call_details.invocation_metadata, "authorization")
        return self._export if self._token.accepts(header) else self._refuse


def _metadata_value(metadata: Sequence[tuple[str, Any]] | None, key: str) -> str | None:
    for name, value in metadata or ():
        if name == key:  # gRPC metadata keys are lower case on the wire
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


class OtlpMetricsServer:
    """The gRPC server; ``port`` is the bound port (useful with port 0).

    ``token``: calls must carry ``authorization: Bearer <token>``. ``credentials``: serve TLS
    (see :func:`skewtrace.controller._auth.grpc_server_credentials`) instead of plaintext.
    """

    def __init__(
        self,
        host: str,
        port: int,
        ingest: IngestFn,
        *,
        max_workers: int = 4,
        token: str | None = None,
        credentials: grpc.ServerCredentials | None = None,
        log_budget: LogBudget | None = None,
    ) -> None:
        self.receiver = MetricsReceiver(ingest, log_budget=log_budget)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="pacer-otlp"),
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
            maximum_concurrent_rpcs=_MAX_CONCURRENT_RPCS,
        )
        self._server.add_generic_rpc_handlers(
            (_MetricsHandler(self.receiver, BearerToken(token) if token else None),)
        )
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if credentials is None:
                self.port = self._server.add_insecure_port(address)
            else:
                self.port = self._server.add_secure_port(address, credentials)
        except RuntimeError as exc:  # grpc raises (older versions returned 0)
            raise OSError(f"cannot bind the OTLP gRPC receiver to {host}:{port}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot bind the OTLP gRPC receiver to {host}:{port}")
        self.host = host
        self.tls = credentials is not None

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 1.0) -> None:
        self._server.stop(grace_s).wait(grace_s + 1.0)
