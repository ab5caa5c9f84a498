"""Off the hot path: the user's sampler in the materializer, the provider sink, the fast OTLP
encoder against the SDK's, and the guard that keeps the encoder to tested exporter versions."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanKind, get_current_span
from opentelemetry.trace.span import TraceState

from skewtrace import semconv
from skewtrace._ids import step_trace_id
from skewtrace.rank._events import (
    COLLECTIVE,
    EVENT_CLASSES,
    PACING,
    PHASE,
    STEP,
    CollectiveEvent,
    Event,
    PacingEvent,
    PhaseEvent,
    StepEvent,
    typed,
)
from skewtrace.rank._export import exporters
from skewtrace.rank._export.materialize import Identity, SpanMaterializer
from skewtrace.rank._export.otlp_wire import FastSpanEncoder
from skewtrace.rank._export.sinks import ExporterSink, ProcessorSink
from skewtrace.rank.resource import RankInfo, build_resource

JOB = "job-x"


def _identity(rank: int) -> Identity:
    return Identity(JOB, rank, build_resource(JOB, RankInfo(rank, rank, 2), host_name="node1"))


def _steps(count: int) -> list[Event]:
    events: list[Event] = []
    for step in range(count):
        events += [
            PhaseEvent(semconv.SPAN_FORWARD, step, 10, 20, "host", None),
            CollectiveEvent(
                step, 20, 30, "all_reduce", "default", 2, step, 64, True, "ddp", "host", None
            ),
            PacingEvent(step, 1, 2, 0.01, 3),
            StepEvent(step, 5, 40),
        ]
    return events


# ------------------------------------------------------------------ events


def test_raw_events_become_named_events() -> None:
    kinds = {PHASE: PhaseEvent, STEP: StepEvent, COLLECTIVE: CollectiveEvent, PACING: PacingEvent}
    assert {kind: EVENT_CLASSES[kind] for kind in kinds} == kinds
    assert typed((PHASE, "forward", 3, 10, 20, "host", None, 64)) == PhaseEvent(
        "forward", 3, 10, 20, "host", None, 64
    )
    assert typed((STEP, 3, 5, 40)).end_ns == 40
    assert typed(StepEvent(3, 5, 40)) == StepEvent(3, 5, 40)  # already named
    with pytest.raises(TypeError):
        typed((STEP, 3, 5))  # a field short
    with pytest.raises(ValueError, match="unknown event kind"):
        typed((9, 3, 5, 40))


def test_malformed_event_is_skipped_and_the_rest_kept() -> None:
    materializer = SpanMaterializer(_identity(1), 0)
    spans = materializer.materialize(
        [(STEP, 0, 5), (PHASE, "forward", 0, 1, 2, "host", None, None)]
    )
    assert [s.name for s in spans] == ["forward"]


# ------------------------------------------------------------------ the user's sampler


class _DropSteps(Sampler):
    """Drops the traces of the given steps; records what it was asked."""

    def __init__(self, steps: set[int]) -> None:
        self.dropped = {step_trace_id(JOB, step) for step in steps}
        self.calls: list[tuple[str, bool | None, dict[str, Any]]] = []

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = get_current_span(parent_context).get_span_context()
        self.calls.append((name, parent.is_remote if parent.is_valid else None, attributes))
        if trace_id in self.dropped:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "DropSteps"


def test_sampler_keeps_or_drops_whole_steps() -> None:
    """ParentBased: the root's verdict (by trace ID, the same on every rank) carries down."""
    sampler = ParentBased(_DropSteps({1}))
    for rank in (0, 1):
        spans = SpanMaterializer(_identity(rank), 0, sampler=sampler).materialize(_steps(3))
        kept = {s.attributes[semconv.STEP] for s in spans}
        assert kept == {0, 2}
        per_step = 5 if rank == 0 else 4  # rank 0 also emits train.step.root
        assert len(spans) == 2 * per_step
        assert all(s.context.trace_flags.sampled for s in spans)


def test_sampler_sees_parents_names_and_attributes() -> None:
    root_sampler = _DropSteps(set())
    spans = SpanMaterializer(_identity(1), 0, sampler=root_sampler).materialize(_steps(1))
    calls = {name: (remote, attributes) for name, remote, attributes in root_sampler.calls}
    # Not ParentBased: asked for every span. The root has no parent; train.step's parent,
    # the root, is remote on rank 1; the rest hang off this rank's train.step.
    assert calls[semconv.SPAN_STEP_ROOT] == (None, {semconv.STEP: 0})
    assert calls[semconv.SPAN_STEP] == (True, {semconv.STEP: 0})
    assert calls["collective.all_reduce"][0] is False
    assert calls["collective.all_reduce"][1][semconv.COLLECTIVE_SEQ] == 0
    assert calls[semconv.SPAN_PACING_DELAY][1][semconv.PACING_VERSION] == 3
    assert len(spans) == 4


class _Verdicts(Sampler):
    """Per-name decisions, with an attribute and a trace state of its own."""

    def __init__(self, decisions: dict[str, Decision]) -> None:
        self.decisions = decisions

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        decision = self.decisions.get(name, Decision.RECORD_AND_SAMPLE)
        return SamplingResult(
            decision, {**(attributes or {}), "sampler.tag": name}, TraceState([("k", "v")])
        )

    def get_description(self) -> str:
        return "Verdicts"


def test_record_only_is_handed_on_unsampled_and_sampler_attributes_apply() -> None:
    sampler = _Verdicts(
        {"collective.all_reduce": Decision.RECORD_ONLY, semconv.SPAN_FORWARD: Decision.DROP}
    )
    spans = SpanMaterializer(_identity(0), 0, sampler=sampler).materialize(_steps(1))
    by_name = {s.name: s for s in spans}
    assert semconv.SPAN_FORWARD not in by_name
    collective = by_name["collective.all_reduce"]
    assert not collective.context.trace_flags.sampled
    assert by_name[semconv.SPAN_STEP].context.trace_flags.sampled
    for span in spans:
        assert span.attributes["sampler.tag"] == span.name
        assert span.context.trace_state.get("k") == "v"


def test_dropped_step_span_drops_children_under_parent_based() -> None:
    """A ParentBased sampler that drops train.step (not the root) drops the step's phases."""
    sampler = ParentBased(ALWAYS_ON, remote_parent_sampled=_Verdicts({}))
    sampler_drop = ParentBased(
        ALWAYS_ON, remote_parent_sampled=_Verdicts({semconv.SPAN_STEP: Decision.DROP})
    )
    kept = SpanMaterializer(_identity(1), 0, sampler=sampler).materialize(_steps(1))
    dropped = SpanMaterializer(_identity(1), 0, sampler=sampler_drop).materialize(_steps(1))
    assert len(kept) == 4 and dropped == []


def test_failing_sampler_keeps_spans_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    class _Broken(Sampler):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            raise RuntimeError("broken sampler")

        def get_description(self) -> str:
            return "Broken"

    with caplog.at_level(logging.WARNING, logger="skewtrace"):
        spans = SpanMaterializer(_identity(0), 0, sampler=_Broken()).materialize(_steps(2))
    assert len(spans) == 10
    assert sum("sampler raised" in r.message for r in caplog.records) == 1


def test_ratio_sampler_agrees_across_ranks() -> None:
    """TraceIdRatioBased decides by trace ID, which every rank derives alike for a step."""
    sampler = ParentBased(TraceIdRatioBased(0.5))
    kept = []
    for rank in (0, 1, 2):
        spans = SpanMaterializer(_identity(rank), 0, sampler=sampler).materialize(_steps(16))
        kept.append({s.attributes[semconv.STEP] for s in spans if s.name == semconv.SPAN_STEP})
    assert kept[0] == kept[1] == kept[2]
    assert 0 < len(kept[0]) < 16


# ------------------------------------------------------------------ sinks


def test_processor_sink_uses_the_providers_sampler_and_processors() -> None:
    exporter = InMemorySpanExporter()
    sampler = ParentBased(_DropSteps({0}))
    provider = TracerProvider(sampler=sampler)
    sink = ProcessorSink(provider)
    # A processor added after the sink was made is fed too (the same multi-processor).
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert sink.sampler is sampler
    spans = SpanMaterializer(_identity(0), 0, sampler=sink.sampler).materialize(_steps(2))
    assert sink.export(spans)
    assert {s.attributes[semconv.STEP] for s in exporter.get_finished_spans()} == {1}
    provider.shutdown()


def test_disabled_provider_discards_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = ProcessorSink(provider)
    spans = SpanMaterializer(_identity(0), 0, sampler=sink.sampler).materialize(_steps(1))
    assert sink.export(spans) and exporter.get_finished_spans() == ()
    provider.shutdown()


def test_private_exporter_sink_samples_nothing() -> None:
    assert ExporterSink(InMemorySpanExporter).sampler is None


# ------------------------------------------------------------------ the fast OTLP encoder


def _without_status(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span.ClearField("status")  # unset status: the same on the wire
    return request


def _sdk_request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    return _without_status(encode_spans(spans))


def test_fast_encoder_matches_the_sdk_encoder() -> None:
    for rank in (0, 1):
        spans = SpanMaterializer(_identity(rank), 1_000).materialize(_steps(3))
        encoded = FastSpanEncoder().encode(spans)
        expected = _sdk_request(spans)
        assert ExportTraceServiceRequest.FromString(encoded) == expected
        assert encoded == expected.SerializeToString(deterministic=True)  # byte for byte


def test_fast_grpc_exporter_encodes_like_the_sdk_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the exporter classes themselves: the override of the installed exporter's
    private _translate_data builds the request the SDK's own would."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never dialed
    spans = SpanMaterializer(_identity(0), 1_000).materialize(_steps(2))
    fast = exporters.otlp_span_exporter()
    sdk = OTLPSpanExporter()
    try:
        assert type(fast).__name__ == "FastOTLPSpanExporter"
        assert isinstance(fast, OTLPSpanExporter)
        expected = _without_status(sdk._translate_data(spans))
        assert fast._translate_data(spans) == expected  # type: ignore[attr-defined]
    finally:
        fast.shutdown()
        sdk.shutdown()


def test_installed_exporter_is_in_the_tested_range() -> None:
    """Fails when the venv moves past FAST_ENCODER_TESTED: rerun the byte-equality tests
    against the new version, then raise the bound here and in pyproject.toml."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    version = exporters._installed_version(exporters.GRPC_EXPORTER_PACKAGE)
    assert exporters.fast_encoder_refusal(OTLPSpanExporter, version) is None


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("1.46.0", "outside the tested 1.30 to 1.45"),
        ("2.0.1", "outside the tested"),
        ("1.29.0", "outside the tested"),
        (None, "is not known"),
        ("1.45.2", "no _translate_data"),
    ],
)
def test_fast_encoder_refused_outside_what_is_tested(version: str | None, reason: str) -> None:
    class _Renamed:
        def _encode(self, data: Any) -> Any: ...

    refusal = exporters.fast_encoder_refusal(_Renamed, version)
    assert refusal is not None and reason in refusal


def test_untested_exporter_version_falls_back_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(exporters, "_installed_version", lambda package: "1.99.0")
    with caplog.at_level(logging.WARNING, logger="skewtrace"):
        exporter = exporters.otlp_span_exporter()
    try:
        assert type(exporter) is OTLPSpanExporter
        lines = [r.message for r in caplog.records if "SDK's OTLP encoder" in r.message]
        assert len(lines) == 1 and "1.99.0" in lines[0]
    finally:
        exporter.shutdown()


def test_failing_fast_encoder_falls_back_to_the_sdks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")

    def broken(self: FastSpanEncoder, spans: Any) -> bytes:
        raise ValueError("cannot encode")

    monkeypatch.setattr(FastSpanEncoder, "encode", broken)
    spans = SpanMaterializer(_identity(0), 1_000).materialize(_steps(1))
    exporter = exporters.otlp_span_exporter()
    try:
        with caplog.at_level(logging.WARNING, logger="skewtrace"):
            first = exporter._translate_data(spans)  # type: ignore[attr-defined]
            second = exporter._translate_data(spans)  # type: ignore[attr-defined]
        assert first == second == encode_spans(spans)
        assert sum("fast OTLP span encoder failed" in r.message for r in caplog.records) == 1
    finally:
        exporter.shutdown()
