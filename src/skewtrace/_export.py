"""Off the hot path: turn recorded event tuples into OTel spans and export them.

One daemon thread wakes every ``export_interval_millis``, drains the recorder, builds
``ReadableSpan`` objects with explicit IDs, parents and timestamps, and hands them to a sink:

- the span processors of a TracerProvider the user configured (their exporters, their
  batching), with the rank's resource merged into the provider's; or
- a private OTLP exporter (gRPC or http/protobuf per ``OTEL_EXPORTER_OTLP_PROTOCOL``) that
  reads the standard ``OTEL_EXPORTER_OTLP_*`` variables. The global provider is never touched.

Nothing here raises into training: failures are logged and counted
(``skewtrace.spans.export_failed``). The final flush is bounded by ``shutdown_timeout_millis``.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from skewtrace import semconv
from skewtrace._ids import SpanIdGenerator, step_root_span_id, step_trace_id
from skewtrace._recorder import COLLECTIVE, PACING, PHASE, STEP, TIMING_CUDA_EVENT, Recorder
from skewtrace.version import __version__

logger = logging.getLogger("skewtrace")

SCOPE = InstrumentationScope("skewtrace", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# Steps whose IDs are remembered: async collectives may finish a few steps after they began.
_STEP_CACHE = 256
# Spans per export call: keeps one OTLP request well under gRPC's 4 MiB default.
_EXPORT_BATCH = 512
# CUDA-timed spans wait at most this many for their events before falling back to host time.
_MAX_PENDING_CUDA = 4096

OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
DEFAULT_METRIC_EXPORT_INTERVAL_MILLIS = 10_000


@dataclass(frozen=True)
class Identity:
    """What the materializer needs to know about the rank (resolved lazily in zero-code use)."""

    job_id: str
    rank: int
    resource: Resource


class CudaPoller(Protocol):
    def poll(self) -> list[tuple[int, float]]: ...


class SpanMaterializer:
    """Event tuples -> ReadableSpans. Owned by the export thread; not thread-safe."""

    def __init__(
        self, identity: Identity, epoch_anchor_ns: int, cuda_timer: CudaPoller | None = None
    ) -> None:
        self._job = identity.job_id
        self._is_root_rank = identity.rank == 0
        self._resource = identity.resource
        self._anchor = epoch_anchor_ns
        self._ids = SpanIdGenerator()
        self._steps: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self._cuda_timer = cuda_timer
        self._cuda_pending: OrderedDict[int, tuple[object, ...]] = OrderedDict()
        # Results polled before their event was drained from the buffer.
        self._cuda_early: OrderedDict[int, float] = OrderedDict()

    def _step_ids(self, step: int) -> tuple[int, int]:
        """(trace id, this rank's train.step span id) for ``step``."""
        ids = self._steps.get(step)
        if ids is None:
            ids = (step_trace_id(self._job, step), self._ids.new_span_id())
            self._steps[step] = ids
            if len(self._steps) > _STEP_CACHE:
                self._steps.popitem(last=False)
        return ids

    def _span(
        self,
        name: str,
        step: int,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        span_id: int | None = None,
        parent: SpanContext | None = None,
    ) -> ReadableSpan:
        trace_id, step_span_id = self._step_ids(step)
        if parent is None:
            parent = SpanContext(trace_id, step_span_id, is_remote=False, trace_flags=_SAMPLED)
        context = SpanContext(
            trace_id,
            span_id if span_id is not None else self._ids.new_span_id(),
            is_remote=False,
            trace_flags=_SAMPLED,
        )
        return ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=attributes,
            kind=SpanKind.INTERNAL,
            start_time=start_ns + self._anchor,
            end_time=max(end_ns, start_ns) + self._anchor,
            instrumentation_scope=SCOPE,
        )

    def materialize(
        self, events: Sequence[tuple[object, ...]], final: bool = False
    ) -> list[ReadableSpan]:
        spans: list[ReadableSpan] = []
        for event in events:
            try:
                self._one(event, spans)
            except Exception:  # a malformed event must not stop the rest
                logger.debug("skewtrace: skipped event %r", event, exc_info=True)
        self._resolve_cuda(spans, final)
        return spans

    def _one(self, event: tuple[Any, ...], spans: list[ReadableSpan]) -> None:
        kind = event[0]
        if kind == PHASE:
            handle = event[6]
            if handle is not None and self._cuda_timer is not None:
                self._hold_for_cuda(handle, event, spans)
                return
            self._phase(event, spans, None)
        elif kind == STEP:
            _, step, start, end = event
            trace_id, step_span_id = self._step_ids(step)
            root_id = step_root_span_id(self._job, step)
            root = SpanContext(
                trace_id, root_id, is_remote=not self._is_root_rank, trace_flags=_SAMPLED
            )
            attributes = {semconv.STEP: step}
            spans.append(
                self._span(semconv.SPAN_STEP, step, start, end, attributes, step_span_id, root)
            )
            if self._is_root_rank:
                spans.append(
                    ReadableSpan(
                        name=semconv.SPAN_STEP_ROOT,
                        context=SpanContext(trace_id, root_id, False, trace_flags=_SAMPLED),
                        parent=None,
                        resource=self._resource,
                        attributes={semconv.STEP: step},
                        start_time=start + self._anchor,
                        end_time=end + self._anchor,
                        instrumentation_scope=SCOPE,
                    )
                )
        elif kind == COLLECTIVE:
            handle = event[12] if len(event) > 12 else None
            if handle is not None and self._cuda_timer is not None:
                self._hold_for_cuda(handle, event, spans)
                return
            self._collective(event, spans, None)
        elif kind == PACING:
            _, step, start, end, delay, version = event
            attributes = {
                semconv.STEP: step,
                semconv.PACING_DELAY: float(delay),
                semconv.PACING_VERSION: int(version),
            }
            spans.append(self._span(semconv.SPAN_PACING_DELAY, step, start, end, attributes))
        else:
            raise ValueError(f"unknown event kind {kind!r}")

    def _collective(
        self, event: tuple[Any, ...], spans: list[ReadableSpan], cuda_seconds: float | None
    ) -> None:
        (_, step, start, end, op, pg, pg_size, seq, nbytes, is_async, source, timing) = event[:12]
        if cuda_seconds is not None:
            end = start + int(cuda_seconds * 1e9)
            timing = TIMING_CUDA_EVENT
        attributes = {
            semconv.STEP: step,
            semconv.COLLECTIVE_OP: op,
            semconv.COLLECTIVE_PG: pg,
            semconv.COLLECTIVE_PG_SIZE: pg_size,
            semconv.COLLECTIVE_SEQ: seq,
            semconv.COLLECTIVE_BYTES: nbytes,
            semconv.COLLECTIVE_ASYNC: is_async,
            semconv.COLLECTIVE_SOURCE: source,
            semconv.TIMING: timing,
        }
        name = semconv.SPAN_COLLECTIVE_PREFIX + str(op)
        spans.append(self._span(name, step, start, end, attributes))

    def _hold_for_cuda(
        self, handle: int, event: tuple[Any, ...], spans: list[ReadableSpan]
    ) -> None:
        early = self._cuda_early.pop(handle, None)
        if early is not None:
            self._emit(event, spans, early)
            return
        self._cuda_pending[handle] = event
        if len(self._cuda_pending) > _MAX_PENDING_CUDA:
            _, oldest = self._cuda_pending.popitem(last=False)
            self._emit(oldest, spans, None)

    def _emit(
        self, event: tuple[Any, ...], spans: list[ReadableSpan], cuda_seconds: float | None
    ) -> None:
        if event[0] == COLLECTIVE:
            self._collective(event, spans, cuda_seconds)
        else:
            self._phase(event, spans, cuda_seconds)

    def _phase(
        self, event: tuple[Any, ...], spans: list[ReadableSpan], cuda_seconds: float | None
    ) -> None:
        _, name, step, start, end, timing, _handle = event
        attributes: dict[str, Any] = {semconv.STEP: step}
        if cuda_seconds is not None:
            end = start + int(cuda_seconds * 1e9)
            timing = TIMING_CUDA_EVENT
        if timing is not None:
            attributes[semconv.TIMING] = timing
        spans.append(self._span(name, step, start, end, attributes))

    def _resolve_cuda(self, spans: list[ReadableSpan], final: bool) -> None:
        if self._cuda_timer is None or not self._cuda_pending:
            return
        try:
            resolved = self._cuda_timer.poll()
        except Exception:
            logger.debug("skewtrace: CUDA event poll failed", exc_info=True)
            resolved = []
        for handle, seconds in resolved:
            event = self._cuda_pending.pop(handle, None)
            if event is not None:
                self._emit(event, spans, seconds)
            else:
                # Resolved between the hook's stop() and its event reaching the buffer:
                # keep the result for the event's arrival (handles are never reused).
                self._cuda_early[handle] = seconds
                if len(self._cuda_early) > _MAX_PENDING_CUDA:
                    self._cuda_early.popitem(last=False)
        if final:
            # At exit unresolved events fall back to host times rather than vanish.
            while self._cuda_pending:
                _, event = self._cuda_pending.popitem(last=False)
                self._emit(event, spans, None)


class SpanSink(Protocol):
    def export(self, spans: Sequence[ReadableSpan]) -> bool: ...
    def flush(self, timeout_millis: int) -> None: ...
    def shutdown(self) -> None: ...


class ProcessorSink:
    """Feeds a user TracerProvider's span processors (its exporters and batching apply)."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider
        self._processor = provider._active_span_processor

    def export(self, spans: Sequence[ReadableSpan]) -> bool:
        on_end = self._processor.on_end
        for span in spans:
            on_end(span)
        return True

    def flush(self, timeout_millis: int) -> None:
        self._provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        # The provider is the user's; it shuts down with their program.
        return None


class ExporterSink:
    """A private span exporter, created lazily on the export thread."""

    def __init__(self, factory: Callable[[], SpanExporter]) -> None:
        self._factory = factory
        self._exporter: SpanExporter | None = None
        self._lock = threading.Lock()

    def _get(self) -> SpanExporter:
        with self._lock:
            if self._exporter is None:
                self._exporter = self._factory()
            return self._exporter

    def export(self, spans: Sequence[ReadableSpan]) -> bool:
        return self._get().export(spans) == SpanExportResult.SUCCESS

    def flush(self, timeout_millis: int) -> None:
        return None

    def shutdown(self) -> None:
        with self._lock:
            exporter = self._exporter
        if exporter is not None:
            # Also aborts a retry backoff in progress on the export thread.
            exporter.shutdown()


def _protocol(signal_var: str) -> str:
    protocol = os.environ.get(signal_var) or os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL) or "grpc"
    protocol = protocol.strip().lower()
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(
            f"{OTEL_EXPORTER_OTLP_PROTOCOL}={protocol!r}: skewtrace supports grpc and http/protobuf"
        )
    return protocol


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited protobuf field (``tag`` already encoded)."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """OTLP AnyValue wire bytes for a scalar attribute."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _F64.pack(value)
    return _field(b"\x0a", str(value).encode())


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_KV_CACHE_MAX = 4096


class FastSpanEncoder:
    """OTLP ExportTraceServiceRequest wire bytes for skewtrace's own spans.

    The SDK's generic encoder costs 40-140 us per span here (it hashes the resource as JSON
    per span and builds a protobuf object per field); with 4 ranks on 2 cores that alone
    would eat the 1% budget. Our spans are uniform (scalar attributes, status unset, no
    events or links), so they are written straight to the wire format, with the encodings
    of repeating attribute pairs (op, pg, source, ...) cached.
    """

    def __init__(self) -> None:
        self._kv: dict[tuple[str, type, Any], bytes] = {}
        self._resources: dict[int, tuple[Resource, bytes]] = {}

    def _attribute(self, key: str, value: Any) -> bytes:
        # The type is in the key so that True and 1 (equal, same hash) stay apart.
        cache_key = (key, type(value), value)
        encoded = self._kv.get(cache_key)
        if encoded is None:
            encoded = _field(b"\x4a", _key_value(key, value))  # Span.attributes = 9
            if len(self._kv) < _KV_CACHE_MAX:
                self._kv[cache_key] = encoded
        return encoded

    def _resource(self, resource: Resource) -> bytes:
        entry = self._resources.get(id(resource))
        if entry is None or entry[0] is not resource:
            body = b"".join(
                _field(b"\x0a", _key_value(k, v)) for k, v in resource.attributes.items()
            )
            entry = (resource, _field(b"\x0a", body))  # ResourceSpans.resource = 1
            self._resources[id(resource)] = entry
        return entry[1]

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        by_resource: dict[int, tuple[Resource, list[bytes]]] = {}
        attribute = self._attribute
        for span in spans:
            context, parent = span.context, span.parent
            if context is None:
                continue
            parts = [
                b"\x0a\x10",
                context.trace_id.to_bytes(16, "big"),
                b"\x12\x08",
                context.span_id.to_bytes(8, "big"),
            ]
            if parent is not None:
                parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
            parts += (
                _field(b"\x2a", span.name.encode()),
                b"\x30\x01",  # kind = SPAN_KIND_INTERNAL
                b"\x39",
                _U64.pack(span.start_time or 0),
                b"\x41",
                _U64.pack(span.end_time or 0),
            )
            for key, value in (span.attributes or {}).items():
                parts.append(attribute(key, value))
            # flags: HAS_IS_REMOTE, plus IS_REMOTE for a remote parent (as the SDK sets them)
            flags = 0x100 | (0x200 if parent is not None and parent.is_remote else 0)
            parts += (b"\x85\x01", _U32.pack(flags))
            entry = by_resource.get(id(span.resource))
            if entry is None:
                entry = by_resource[id(span.resource)] = (span.resource, [])
            entry[1].append(_field(b"\x12", b"".join(parts)))  # ScopeSpans.spans = 2
        scope = _field(
            b"\x0a",
            _field(b"\x0a", SCOPE.name.encode()) + _field(b"\x12", (SCOPE.version or "").encode()),
        )
        out = []
        for resource, encoded_spans in by_resource.values():
            scope_spans = _field(b"\x12", scope + b"".join(encoded_spans))
            schema = _field(b"\x1a", resource.schema_url.encode()) if resource.schema_url else b""
            out.append(_field(b"\x0a", self._resource(resource) + scope_spans + schema))
        return b"".join(out)


def otlp_span_exporter() -> SpanExporter:
    """An OTLP span exporter configured from the standard OTEL_EXPORTER_OTLP_* variables."""
    if _protocol(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        encoder = FastSpanEncoder()

        class FastOTLPSpanExporter(OTLPSpanExporter):
            """The SDK's gRPC exporter (endpoint, headers, TLS, retries) with our encoder."""

            def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
                # Parsing the bytes back is C code (upb); building messages field by field
                # from Python is what made the SDK encoder slow.
                return ExportTraceServiceRequest.FromString(encoder.encode(data))

        return FastOTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    return HttpSpanExporter()


def otlp_metric_exporter() -> Any:
    if _protocol(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )

    return HttpMetricExporter()


class ExportStats:
    def __init__(self) -> None:
        self.exported = 0
        self.failed = 0
        # CPU the export thread spent (materialize + export): what skewtrace costs off the
        # hot path, measurable even when step times are too noisy to compare.
        self.cpu_ns = 0


class BackgroundExporter:
    """The daemon thread: drain, materialize, export, every interval; bounded final flush."""

    def __init__(
        self,
        recorder: Recorder,
        sink: SpanSink,
        identity: Callable[[], Identity | None],
        interval_millis: int,
        cuda_timer: CudaPoller | None = None,
    ) -> None:
        self._recorder = recorder
        self._sink = sink
        self._identity = identity
        self._interval_s = interval_millis / 1000.0
        self._cuda_timer = cuda_timer
        self._materializer: SpanMaterializer | None = None
        self._disabled = False
        self.stats = ExportStats()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Set when the final flush ran out of time: the thread stops exporting at once.
        self._abandoned = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skewtrace-export", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def set_cuda_timer(self, timer: CudaPoller) -> None:
        """A CUDA model appeared after start (zero-code); takes effect for new spans."""
        self._cuda_timer = timer
        if self._materializer is not None:
            self._materializer._cuda_timer = timer

    def _run(self) -> None:
        from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, set_value

        # Our own OTLP calls must not be traced by other instrumentations (grpc, requests).
        attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
        try:
            while not self._stop.is_set():
                self._wake.wait(self._interval_s)
                self._wake.clear()
                self._cycle(final=False)
            self._cycle(final=True)
        finally:
            self._done.set()

    def _cycle(self, final: bool) -> None:
        cpu_start = time.thread_time_ns()
        try:
            self._cycle_inner(final)
        finally:
            self.stats.cpu_ns += time.thread_time_ns() - cpu_start

    def _cycle_inner(self, final: bool) -> None:
        try:
            while not self._abandoned.is_set():
                events = self._recorder.drain(_EXPORT_BATCH)
                if not events and not (final and self._materializer is not None):
                    return
                materializer = self._get_materializer()
                if materializer is None:
                    return
                spans = materializer.materialize(events, final=final and not events)
                if spans:
                    self._export(spans)
                if not events:
                    return
                if not final and self._stop.is_set():
                    return
        except Exception:
            logger.exception("skewtrace: export cycle failed; continuing")

    def _get_materializer(self) -> SpanMaterializer | None:
        if self._materializer is None and not self._disabled:
            try:
                identity = self._identity()
            except Exception:
                logger.exception("skewtrace: cannot identify this rank; spans are discarded")
                self._disabled = True
                return None
            if identity is None:
                return None
            self._materializer = SpanMaterializer(
                identity, self._recorder.epoch_anchor_ns, self._cuda_timer
            )
        if self._disabled:
            # Keep memory bounded by discarding what cannot be exported.
            self._recorder.drain(self._recorder.capacity)
        return self._materializer

    def _export(self, spans: list[ReadableSpan]) -> None:
        try:
            ok = self._sink.export(spans)
        except Exception:
            if not self._abandoned.is_set():
                logger.warning("skewtrace: span export raised", exc_info=True)
            ok = False
        if ok:
            self.stats.exported += len(spans)
        else:
            self.stats.failed += len(spans)

    def flush_now(self) -> None:
        self._wake.set()

    def shutdown(self, timeout_millis: int) -> bool:
        """Stop the thread after a final drain; True if everything finished in time."""
        deadline = time.monotonic() + timeout_millis / 1000.0
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._done.wait(max(0.0, deadline - time.monotonic()))
        finished = self._done.is_set() or not self._thread.is_alive()
        if finished:
            try:
                self._sink.flush(max(0, int((deadline - time.monotonic()) * 1000)))
            except Exception:
                logger.debug("skewtrace: flush failed", exc_info=True)
        else:
            self._abandoned.set()
            logger.warning(
                "skewtrace: final export did not finish within %d ms; remaining spans dropped",
                timeout_millis,
            )
        try:
            self._sink.shutdown()
        except Exception:
            logger.debug("skewtrace: exporter shutdown failed", exc_info=True)
        return finished


def metric_export_interval_millis() -> int:
    raw = os.environ.get(OTEL_METRIC_EXPORT_INTERVAL, "").strip()
    try:
        return int(raw) if raw else DEFAULT_METRIC_EXPORT_INTERVAL_MILLIS
    except ValueError:
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
        if self._started:
            return
        self._started = True
        from opentelemetry.metrics import CallbackOptions, Observation

        provider = self._meter_provider
        if provider is None:
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            reader = PeriodicExportingMetricReader(
                otlp_metric_exporter(), export_interval_millis=metric_export_interval_millis()
            )
            resource = self._resource() or Resource.create({})
            provider = MeterProvider(metric_readers=[reader], resource=resource)
            self._own_provider = provider
        meter = provider.get_meter("skewtrace", __version__)

        def dropped(_options: CallbackOptions) -> list[Observation]:
            counts = self._recorder.dropped()
            return [Observation(n, {"reason": reason}) for reason, n in counts.items()]

        def exported(_options: CallbackOptions) -> list[Observation]:
            return [Observation(self._stats.exported)]

        def failed(_options: CallbackOptions) -> list[Observation]:
            return [Observation(self._stats.failed)]

        meter.create_observable_counter(
            semconv.METRIC_EVENTS_DROPPED,
            [dropped],
            unit="1",
            description="events dropped because the rank's buffer was full",
        )
        meter.create_observable_counter(
            semconv.METRIC_SPANS_EXPORTED,
            [exported],
            unit="1",
            description="spans handed to the exporter",
        )
        meter.create_observable_counter(
            semconv.METRIC_SPANS_EXPORT_FAILED,
            [failed],
            unit="1",
            description="spans the exporter reported as failed",
        )

    def shutdown(self, timeout_millis: int) -> None:
        if self._own_provider is not None:
            self._own_provider.shutdown(timeout_millis=timeout_millis)
            self._own_provider = None
