"""Sending imported spans to a Collector over OTLP, encoded by the ranks' own encoder.

The request bytes are :class:`~skewtrace.rank._export.otlp_wire.FastSpanEncoder`'s, the encoder
a rank's exporter uses, so the Collector reads what it reads from live ranks. They go over
OTLP/gRPC (``TraceService/Export``) or OTLP/HTTP (``POST .../v1/traces``,
``application/x-protobuf``), where the instrumentation would send them
(:func:`destination`): ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
``OTEL_EXPORTER_OTLP_ENDPOINT``, else ``http://localhost:4317`` (gRPC) or
``http://localhost:4318`` (HTTP); the protocol from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
``OTEL_EXPORTER_OTLP_PROTOCOL`` (``grpc`` by default), headers from
``OTEL_EXPORTER_OTLP_HEADERS``/``..._TRACES_HEADERS``. An ``https://`` endpoint uses TLS
with the system's roots; anything else is plaintext.

Unlike a rank's exporter this one does not retry in the background: the Collector must be
reachable before the first request (:class:`SendError` otherwise, nothing sent), a failed
request stops the send, and the error says how many spans had been accepted.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan

from skewtrace.rank._export.otlp_wire import FastSpanEncoder

GRPC, HTTP = "grpc", "http/protobuf"
PROTOCOLS = (GRPC, HTTP)
_DEFAULT_ENDPOINT = {GRPC: "http://localhost:4317", HTTP: "http://localhost:4318"}
_HTTP_PATH = "/v1/traces"
_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

MAX_SPANS_PER_REQUEST = 1024
"""Spans per request: about 300 KB, under every receiver's default 4 MiB limit."""


class SendError(RuntimeError):
    """The spans could not all be sent; ``sent`` were accepted before the failure."""

    def __init__(self, message: str, sent: int) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(frozen=True)
class Destination:
    protocol: str
    endpoint: str
    """``host:port`` for gRPC (scheme removed), the full URL for HTTP."""
    secure: bool
    headers: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return f"{self.endpoint} (OTLP/{'gRPC' if self.protocol == GRPC else 'HTTP'})"


def _first(env: Mapping[str, str], *names: str) -> str:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return value
    return ""


def destination(
    endpoint: str | None = None,
    protocol: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Destination:
    """Where the spans go: the arguments, else the standard variables, else the local
    Collector; raises ``ValueError`` for an unknown protocol."""
    env = os.environ if env is None else env
    chosen = (
        protocol
        or _first(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        or GRPC
    ).lower()
    if chosen not in PROTOCOLS:
        raise ValueError(f"protocol {chosen!r}: use grpc or http/protobuf")
    signal = _first(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    general = _first(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
    raw = endpoint or signal or general or _DEFAULT_ENDPOINT[chosen]
    from opentelemetry.util.re import parse_env_headers

    headers = {
        **parse_env_headers(_first(env, "OTEL_EXPORTER_OTLP_HEADERS"), liberal=True),
        **parse_env_headers(_first(env, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"), liberal=True),
    }
    secure = raw.lower().startswith("https://")
    if chosen == GRPC:
        target = raw.split("://", 1)[1] if "://" in raw else raw
        return Destination(chosen, target.rstrip("/"), secure, tuple(headers.items()))
    url = raw if "://" in raw else f"http://{raw}"
    # As the SDK: a per-signal endpoint (or ours) is used as it is, the general one gets
    # the signal's path; a bare host:port gets it too.
    if (raw == general and not endpoint and not signal) or urlsplit(url).path in ("", "/"):
        url = url.rstrip("/") + _HTTP_PATH
    return Destination(chosen, url, secure, tuple(headers.items()))


def _chunks(spans: Sequence[ReadableSpan], size: int) -> Iterable[Sequence[ReadableSpan]]:
    for start in range(0, len(spans), size):
        yield spans[start : start + size]


def send(
    batches: Iterable[Sequence[ReadableSpan]],
    where: Destination,
    *,
    connect_timeout_s: float = 5.0,
    request_timeout_s: float = 30.0,
) -> int:
    """Send each batch (a step's spans) in order; returns the spans the Collector accepted.

    Raises :class:`SendError` when the Collector cannot be reached (nothing sent), refuses a
    request, or rejects spans."""
    encoder = FastSpanEncoder()
    if where.protocol == GRPC:
        return _send_grpc(batches, where, encoder, connect_timeout_s, request_timeout_s)
    return _send_http(batches, where, encoder, request_timeout_s)


def _rejected(response: bytes) -> tuple[int, str]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    parsed = ExportTraceServiceResponse.FromString(response)
    partial = parsed.partial_success
    return int(partial.rejected_spans), str(partial.error_message)


def _send_grpc(
    batches: Iterable[Sequence[ReadableSpan]],
    where: Destination,
    encoder: FastSpanEncoder,
    connect_timeout_s: float,
    request_timeout_s: float,
) -> int:
    import grpc

    credentials = grpc.ssl_channel_credentials() if where.secure else None
    channel = (
        grpc.secure_channel(where.endpoint, credentials)
        if credentials is not None
        else grpc.insecure_channel(where.endpoint)
    )
    sent = 0
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=connect_timeout_s)
        except grpc.FutureTimeoutError:
            raise SendError(
                f"cannot reach a Collector at {where} within {connect_timeout_s:g} s: is it "
                "running and listening there? (--endpoint, OTEL_EXPORTER_OTLP_ENDPOINT)",
                0,
            ) from None
        export = channel.unary_unary(_EXPORT_METHOD)
        metadata = list(where.headers) or None
        for batch in batches:
            for chunk in _chunks(batch, MAX_SPANS_PER_REQUEST):
                try:
                    response = export(
                        encoder.encode(chunk), timeout=request_timeout_s, metadata=metadata
                    )
                except grpc.RpcError as exc:
                    code = exc.code() if hasattr(exc, "code") else None
                    detail = exc.details() if hasattr(exc, "details") else str(exc)
                    raise SendError(
                        f"the Collector at {where} refused a request "
                        f"({getattr(code, 'name', code)}: {detail})",
                        sent,
                    ) from None
                sent = _accept(response, len(chunk), sent, where)
    finally:
        channel.close()
    return sent


def _send_http(
    batches: Iterable[Sequence[ReadableSpan]],
    where: Destination,
    encoder: FastSpanEncoder,
    request_timeout_s: float,
) -> int:
    headers = {"Content-Type": "application/x-protobuf", **dict(where.headers)}
    sent = 0
    for batch in batches:
        for chunk in _chunks(batch, MAX_SPANS_PER_REQUEST):
            request = urllib.request.Request(
                where.endpoint, data=encoder.encode(chunk), headers=headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=request_timeout_s) as answer:
                    body = answer.read()
            except urllib.error.HTTPError as exc:
                raise SendError(
                    f"the Collector at {where} refused a request (HTTP {exc.code} {exc.reason})",
                    sent,
                ) from None
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                raise SendError(
                    f"cannot reach a Collector at {where} ({reason}): is it running and "
                    "listening there? (--endpoint, OTEL_EXPORTER_OTLP_ENDPOINT)",
                    sent,
                ) from None
            sent = _accept(body, len(chunk), sent, where)
    return sent


def _accept(response: bytes, count: int, sent: int, where: Destination) -> int:
    rejected, message = _rejected(response) if response else (0, "")
    if rejected:
        raise SendError(
            f"the Collector at {where} rejected {rejected} of {count} spans"
            + (f" ({message})" if message else ""),
            sent + count - rejected,
        )
    return sent + count
