"""Recorded events -> ``ReadableSpan``s: IDs, parents, timestamps, CUDA durations, sampling.

Every rank derives the same trace ID for a step from (job, step), and rank 0 emits the
step's ``train.step.root`` with an ID every rank can compute; each rank's ``train.step`` is
its child, and the step's other spans are children of that. Spans are built after the fact
as ``ReadableSpan``s: the SDK's own ``Span`` costs about 13 us on the training thread.

A user's sampler (from their TracerProvider) decides per span, as the SDK's tracer would:
it sees the span's parent context, the step's trace ID, the name and the attributes, and
its ``DROP`` leaves the span out, ``RECORD_ONLY`` hands it on unsampled,
``RECORD_AND_SAMPLE`` sampled, with the attributes and trace state it returns. The step
root's and ``train.step``'s verdicts are taken once per step, before their children's, so
a ``ParentBased`` sampler keeps or drops a step's spans together.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from skewtrace import semconv
from skewtrace._ids import (
    SpanIdGenerator,
    rank_step_span_id,
    step_root_span_id,
    step_trace_id,
)
from skewtrace.rank._events import (
    CheckpointEvent,
    CollectiveEvent,
    Event,
    LayersEvent,
    PacingEvent,
    PhaseEvent,
    RawEvent,
    StepEvent,
    typed,
)
from skewtrace.version import __version__

logger = logging.getLogger("skewtrace")

SCOPE = InstrumentationScope("skewtrace", __version__)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
# Steps whose IDs are remembered: async collectives may finish a few steps after they began.
_STEP_CACHE = 256
# CUDA-timed spans wait at most this many for their events before falling back to host time.
_MAX_PENDING_CUDA = 4096


@dataclass(frozen=True)
class Identity:
    """What the materializer needs to know about the rank (resolved lazily in zero-code use)."""

    job_id: str
    rank: int
    resource: Resource


class CudaPoller(Protocol):
    def poll(self) -> list[tuple[int, float]]: ...


class _Verdict(NamedTuple):
    """What the sampler decided for a span it did not drop."""

    flags: TraceFlags
    attributes: Mapping[str, Any] | None
    """The sampler's attributes for the span; None: the span's own."""
    trace_state: TraceState | None


_KEEP = _Verdict(_SAMPLED, None, None)
# The step root's parent context: empty, so that a sampler never finds a span that happens
# to be current on the export thread.
_NO_PARENT = Context()


class _Step(NamedTuple):
    """One step's contexts on this rank, and the sampler's verdicts on its two spans."""

    trace_id: int
    root: SpanContext
    """``train.step.root``: the parent of this rank's ``train.step`` (remote on rank > 0)."""
    span: SpanContext
    """This rank's ``train.step``: the parent of the step's other spans."""
    root_verdict: _Verdict | None
    span_verdict: _Verdict | None
    span_as_parent: Context | None
    """``span`` as the sampler wants a parent; None without a sampler."""


class SpanMaterializer:
    """Events -> ReadableSpans. Owned by the export thread; not thread-safe."""

    def __init__(
        self,
        identity: Identity,
        epoch_anchor_ns: int,
        cuda_timer: CudaPoller | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        self._job = identity.job_id
        self._rank = identity.rank
        self._is_root_rank = identity.rank == 0
        self._resource = identity.resource
        self._anchor = epoch_anchor_ns
        self._ids = SpanIdGenerator()
        self._steps: OrderedDict[int, _Step] = OrderedDict()
        self.cuda_timer = cuda_timer
        self._sampler = sampler
        self._sampler_failed_logged = False
        self._cuda_pending: OrderedDict[int, PhaseEvent | CollectiveEvent] = OrderedDict()
        # Results polled before their event was drained from the buffer.
        self._cuda_early: OrderedDict[int, float] = OrderedDict()

    # ------------------------------------------------------------------ IDs and sampling

    def _sample(
        self, parent: Context | None, trace_id: int, name: str, attributes: dict[str, Any]
    ) -> _Verdict | None:
        """The user's sampler on one span; None when it drops the span."""
        sampler = self._sampler
        if sampler is None:
            return _KEEP
        try:
            result = sampler.should_sample(
                parent, trace_id, name, SpanKind.INTERNAL, attributes, None
            )
        except Exception:
            # Fail open, as before sampling existed: the collector still gets the span.
            if not self._sampler_failed_logged:
                self._sampler_failed_logged = True
                logger.warning(
                    "skewtrace: the TracerProvider's sampler raised; the spans it fails on are "
                    "kept (logged once)",
                    exc_info=True,
                )
            return _KEEP
        decision = result.decision
        if not decision.is_recording():
            return None
        flags = _SAMPLED if decision.is_sampled() else _NOT_SAMPLED
        return _Verdict(flags, result.attributes, result.trace_state)

    def _step(self, step: int) -> _Step:
        entry = self._steps.get(step)
        if entry is None:
            entry = self._new_step(step)
            self._steps[step] = entry
            if len(self._steps) > _STEP_CACHE:
                self._steps.popitem(last=False)
        return entry

    def _new_step(self, step: int) -> _Step:
        trace_id = step_trace_id(self._job, step)
        root_id = step_root_span_id(self._job, step)
        span_id = rank_step_span_id(self._job, step, self._rank)
        remote_root = not self._is_root_rank
        if self._sampler is None:
            root = SpanContext(trace_id, root_id, remote_root, trace_flags=_SAMPLED)
            span = SpanContext(trace_id, span_id, False, trace_flags=_SAMPLED)
            return _Step(trace_id, root, span, _KEEP, _KEEP, None)
        attributes = {semconv.STEP: step}
        # Every rank takes the root's verdict itself (only rank 0 emits the root): a sampler
        # that decides by trace ID gives every rank the same one.
        root_verdict = self._sample(_NO_PARENT, trace_id, semconv.SPAN_STEP_ROOT, attributes)
        root = _context(trace_id, root_id, remote_root, root_verdict)
        span_verdict = self._sample(
            set_span_in_context(NonRecordingSpan(root)), trace_id, semconv.SPAN_STEP, attributes
        )
        span = _context(trace_id, span_id, False, span_verdict)
        return _Step(
            trace_id,
            root,
            span,
            root_verdict,
            span_verdict,
            set_span_in_context(NonRecordingSpan(span)),
        )

    def _readable(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        verdict: _Verdict,
        attributes: dict[str, Any],
        start_ns: int,
        end_ns: int,
    ) -> ReadableSpan:
        return ReadableSpan(
            name=name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=attributes if verdict.attributes is None else dict(verdict.attributes),
            kind=SpanKind.INTERNAL,
            start_time=start_ns + self._anchor,
            end_time=max(end_ns, start_ns) + self._anchor,
            instrumentation_scope=SCOPE,
        )

    def _child(
        self,
        spans: list[ReadableSpan],
        name: str,
        step: int,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
    ) -> None:
        """A span under this rank's ``train.step`` of ``step``, unless the sampler drops it."""
        entry = self._step(step)
        verdict = self._sample(entry.span_as_parent, entry.trace_id, name, attributes)
        if verdict is None:
            return
        context = _context(entry.trace_id, self._ids.new_span_id(), False, verdict)
        spans.append(
            self._readable(name, context, entry.span, verdict, attributes, start_ns, end_ns)
        )

    # ------------------------------------------------------------------ events

    def materialize(self, events: Sequence[RawEvent], final: bool = False) -> list[ReadableSpan]:
        spans: list[ReadableSpan] = []
        for raw in events:
            try:
                self._one(typed(raw), spans)
            except Exception:  # a malformed event must not stop the rest
                logger.debug("skewtrace: skipped event %r", raw, exc_info=True)
        self._resolve_cuda(spans, final)
        return spans

    def _one(self, event: Event, spans: list[ReadableSpan]) -> None:
        if isinstance(event, (PhaseEvent, CollectiveEvent)):
            handle = event.cuda_handle
            if handle is not None and self.cuda_timer is not None:
                self._hold_for_cuda(handle, event, spans)
            else:
                self._emit(event, spans, None)
        elif isinstance(event, StepEvent):
            self._step_spans(event, spans)
        elif isinstance(event, PacingEvent):
            attributes = {
                semconv.STEP: event.step,
                semconv.PACING_DELAY: float(event.delay_s),
                semconv.PACING_VERSION: int(event.version),
            }
            self._child(
                spans,
                semconv.SPAN_PACING_DELAY,
                event.step,
                event.start_ns,
                event.end_ns,
                attributes,
            )
        elif isinstance(event, CheckpointEvent):
            self._checkpoint_span(event, spans)
        elif isinstance(event, LayersEvent):
            layers: dict[str, Any] = {
                semconv.STEP: event.step,
                semconv.PIPELINE_LAYERS: tuple(event.names),
                semconv.PIPELINE_LAYER_FORWARD: tuple(float(v) for v in event.forward_s),
                semconv.PIPELINE_LAYER_BACKWARD: tuple(float(v) for v in event.backward_s),
                semconv.PIPELINE_MICROBATCHES: int(event.microbatches),
            }
            self._child(
                spans,
                semconv.SPAN_PIPELINE_LAYERS,
                event.step,
                event.start_ns,
                event.end_ns,
                layers,
            )
        else:
            raise ValueError(f"unknown event {event!r}")

    def _checkpoint_span(self, event: CheckpointEvent, spans: list[ReadableSpan]) -> None:
        attributes: dict[str, Any] = {
            semconv.STEP: event.step,
            semconv.CHECKPOINT_PATH_KIND: event.path_kind,
        }
        if event.nbytes is not None:  # a stream has no size
            attributes[semconv.CHECKPOINT_BYTES] = int(event.nbytes)
        self._child(spans, event.name, event.step, event.start_ns, event.end_ns, attributes)

    def _step_spans(self, event: StepEvent, spans: list[ReadableSpan]) -> None:
        entry = self._step(event.step)
        attributes = {semconv.STEP: event.step}
        if entry.span_verdict is not None:
            spans.append(
                self._readable(
                    semconv.SPAN_STEP,
                    entry.span,
                    entry.root,
                    entry.span_verdict,
                    attributes,
                    event.start_ns,
                    event.end_ns,
                )
            )
        if self._is_root_rank and entry.root_verdict is not None:
            root = entry.root  # local on rank 0
            spans.append(
                self._readable(
                    semconv.SPAN_STEP_ROOT,
                    root,
                    None,
                    entry.root_verdict,
                    dict(attributes),
                    event.start_ns,
                    event.end_ns,
                )
            )

    def _emit(
        self,
        event: PhaseEvent | CollectiveEvent,
        spans: list[ReadableSpan],
        cuda_seconds: float | None,
    ) -> None:
        start, end, timing = event.start_ns, event.end_ns, event.timing
        if cuda_seconds is not None:
            end = start + int(cuda_seconds * 1e9)
            timing = semconv.TIMING_CUDA_EVENT
        if isinstance(event, CollectiveEvent):
            attributes: dict[str, Any] = {
                semconv.STEP: event.step,
                semconv.COLLECTIVE_OP: event.op,
                semconv.COLLECTIVE_PG: event.pg,
                semconv.COLLECTIVE_PG_SIZE: event.pg_size,
                semconv.COLLECTIVE_SEQ: event.seq,
                semconv.COLLECTIVE_BYTES: event.nbytes,
                semconv.COLLECTIVE_ASYNC: event.is_async,
                semconv.COLLECTIVE_SOURCE: event.source,
                semconv.TIMING: timing,
            }
            if event.peer is not None:
                attributes[semconv.COLLECTIVE_PEER] = event.peer
            name = semconv.SPAN_COLLECTIVE_PREFIX + str(event.op)
        else:
            attributes = {semconv.STEP: event.step}
            if timing is not None:
                attributes[semconv.TIMING] = timing
            if event.input_size is not None:
                attributes[semconv.INPUT_SIZE] = int(event.input_size)
            if event.balance is not None:
                mode, version, cost_version = event.balance
                attributes[semconv.BALANCE_MODE] = str(mode)
                attributes[semconv.BALANCE_VERSION] = int(version)
                attributes[semconv.BALANCE_COST_VERSION] = int(cost_version)
            name = event.name
        self._child(spans, name, event.step, start, end, attributes)

    # ------------------------------------------------------------------ CUDA durations

    def _hold_for_cuda(
        self, handle: int, event: PhaseEvent | CollectiveEvent, spans: list[ReadableSpan]
    ) -> None:
        early = self._cuda_early.pop(handle, None)
        if early is not None:
            self._emit(event, spans, early)
            return
        self._cuda_pending[handle] = event
        if len(self._cuda_pending) > _MAX_PENDING_CUDA:
            _, oldest = self._cuda_pending.popitem(last=False)
            self._emit(oldest, spans, None)

    def _resolve_cuda(self, spans: list[ReadableSpan], final: bool) -> None:
        if self.cuda_timer is None or not self._cuda_pending:
            return
        try:
            resolved = self.cuda_timer.poll()
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


def _context(trace_id: int, span_id: int, is_remote: bool, verdict: _Verdict | None) -> SpanContext:
    """A span's context; a dropped span's (verdict None) still parents its children, unsampled."""
    if verdict is None:
        return SpanContext(trace_id, span_id, is_remote, trace_flags=_NOT_SAMPLED)
    return SpanContext(
        trace_id, span_id, is_remote, trace_flags=verdict.flags, trace_state=verdict.trace_state
    )
