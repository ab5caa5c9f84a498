"""A real OTLP/gRPC receiver for tests and benchmarks: traces and metrics, kept in memory.

Built on opentelemetry-proto's service stubs and grpcio, listening on 127.0.0.1, so tests
exercise the same exporter, serialization and socket path as production.

    with OtlpSink() as sink:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.endpoint
        ...
        spans = sink.wait_for_spans(lambda s: len(s) >= 10, timeout=10)

Run as a script (``python tests/otlp_sink.py --port 4317``) it serves until interrupted and
prints the span count every few seconds.
"""

from __future__ import annotations

import argparse
import http.server
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    # (trace_id, span_id, attributes) of each span link.
    links: tuple[tuple[str, str, dict[str, Any]], ...] = ()
    # Serialized size of the span, and of its resource (protobuf bytes).
    size: int = 0
    resource_size: int = 0

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def trace_bytes(spans: list[ReceivedSpan]) -> dict[str, int]:
    """Protobuf bytes per trace ID: its spans, plus each resource they came with once (what a
    backend's max_bytes_per_trace counts, give or take the envelope)."""
    spans_of: dict[str, int] = {}
    resources: dict[str, dict[int, int]] = {}
    for span in spans:
        spans_of[span.trace_id] = spans_of.get(span.trace_id, 0) + span.size
        resources.setdefault(span.trace_id, {})[id(span.resource)] = span.resource_size
    return {trace: size + sum(resources[trace].values()) for trace, size in spans_of.items()}


@dataclass
class ReceivedMetricPoint:
    name: str
    value: float
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class _Store:
    spans: list[ReceivedSpan] = field(default_factory=list)
    metrics: list[ReceivedMetricPoint] = field(default_factory=list)
    trace_requests: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, store: _Store, detail: bool = True) -> None:
        self._store = store
        self._detail = detail

    def Export(self, request: Any, context: Any) -> Any:
        received = []
        for resource_spans in request.resource_spans:
            resource_size = resource_spans.resource.ByteSize()
            if not self._detail:
                # Sizes only: a fresh (empty) resource per ResourceSpans keeps them apart.
                resource: dict[str, Any] = {}
                received.extend(
                    ReceivedSpan(name=span.name, trace_id=span.trace_id.hex(),
                                 span_id=span.span_id.hex(), parent_span_id="", start_ns=0,
                                 end_ns=0, attributes={}, resource=resource, scope="",
                                 size=span.ByteSize(), resource_size=resource_size)
                    for scope_spans in resource_spans.scope_spans
                    for span in scope_spans.spans
                )  # fmt: skip
                continue
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes=attributes(span.attributes),
                            resource=resource,
                            scope=scope_spans.scope.name,
                            links=tuple(
                                (
                                    link.trace_id.hex(),
                                    link.span_id.hex(),
                                    attributes(link.attributes),
                                )
                                for link in span.links
                            ),
                            size=span.ByteSize(),
                            resource_size=resource_size,
                        )
                    )
        with self._store.cond:
            self._store.spans.extend(received)
            self._store.trace_requests += 1
            self._store.cond.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, store: _Store) -> None:
        self._store = store

    def Export(self, request: Any, context: Any) -> Any:
        points = []
        for resource_metrics in request.resource_metrics:
            resource = attributes(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    if kind not in ("sum", "gauge"):
                        continue
                    for point in getattr(metric, kind).data_points:
                        value = point.as_int if point.HasField("as_int") else point.as_double
                        points.append(
                            ReceivedMetricPoint(
                                metric.name, value, attributes(point.attributes), resource
                            )
                        )
        with self._store.cond:
            self._store.metrics.extend(points)
            self._store.cond.notify_all()
        return metrics_service_pb2.ExportMetricsServiceResponse()


class _HttpHandler(http.server.BaseHTTPRequestHandler):
    """OTLP/HTTP (binary protobuf) on /v1/traces and /v1/metrics."""

    traces: _TraceService
    metrics: _MetricsService

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/traces":
            request: Any = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            reply = self.traces.Export(request, None)
        elif self.path == "/v1/metrics":
            request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            reply = self.metrics.Export(request, None)
        else:
            self.send_error(404)
            return
        payload = reply.SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        return None


class OtlpSink:
    """An OTLP/gRPC server on 127.0.0.1 (``port=0``: any free port), and OTLP/HTTP on
    ``http_endpoint`` for the http/protobuf protocol."""

    def __init__(self, port: int = 0, detail: bool = True) -> None:
        """``detail=False`` keeps only each span's name, IDs and sizes (fast enough for
        hundreds of thousands of spans)."""
        self._store = _Store()
        handler = type(
            "Handler",
            (_HttpHandler,),
            {"traces": _TraceService(self._store), "metrics": _MetricsService(self._store)},
        )
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._http_thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            _TraceService(self._store, detail), self._server
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsService(self._store), self._server
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        if self.port == 0:
            raise OSError(f"could not bind 127.0.0.1:{port}")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def start(self) -> OtlpSink:
        self._server.start()
        self._http_thread.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> OtlpSink:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        with self._store.cond:
            return list(self._store.spans)

    def metric_points(self) -> list[ReceivedMetricPoint]:
        with self._store.cond:
            return list(self._store.metrics)

    @property
    def trace_requests(self) -> int:
        with self._store.cond:
            return self._store.trace_requests

    def clear(self) -> None:
        with self._store.cond:
            self._store.spans.clear()
            self._store.metrics.clear()

    def wait_for_spans(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout: float
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        with self._store.cond:
            while not done(self._store.spans):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._store.cond.wait(remaining)
            return list(self._store.spans)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=4317)
    args = parser.parse_args()
    with OtlpSink(args.port) as sink:
        print(f"listening on {sink.endpoint} (gRPC), {sink.http_endpoint} (HTTP)", flush=True)
        try:
            while True:
                time.sleep(5)
                print(f"spans={len(sink.spans())}", flush=True)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
