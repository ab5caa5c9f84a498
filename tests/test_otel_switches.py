"""OpenTelemetry's own switches, obeyed by skewtrace's private exporters as the SDK obeys them.

- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: unset is OTLP, ``none`` builds
  nothing, ``console`` (or any installed exporter's name) builds that one, a list builds each,
  an unknown name is a ConfigError from ``instrument()``; ``none`` for traces leaves the hooks
  on and exports nothing;
- per-signal endpoints over real sockets: for http/protobuf ``OTEL_EXPORTER_OTLP_ENDPOINT``
  gets ``/v1/traces`` (``/v1/metrics``) appended and a per-signal endpoint is used as it is;
  for gRPC the per-signal endpoint wins;
- ``OTEL_SDK_DISABLED``: only ``true`` disables, as in the SDK;
- ``OTEL_METRICS_EXPORTER=none`` against an OTLP/HTTP server with no metrics route (a
  Collector without a metrics pipeline answers 404): not one metrics request, not one
  exporter log line; without it, the 404s come and are logged (so the check can fail);
- the private exporters' log limit stays on through the final flush.
"""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

import skewtrace
from otlp_sink import OtlpSink
from skewtrace import _log_limit, semconv
from skewtrace.rank._events import StepEvent
from skewtrace.rank._export import exporters
from skewtrace.rank._export.materialize import Identity, SpanMaterializer
from skewtrace.rank.config import ConfigError, Settings
from skewtrace.rank.resource import RankInfo, build_resource

OTEL_VARS = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)


class _Recording(http.server.BaseHTTPRequestHandler):
    """Answers every POST with 200 and an empty body, except ``/v1/metrics`` when
    ``metrics_route`` is off (404, as a Collector without a metrics pipeline)."""

    paths: list[str]
    metrics_route: bool

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.paths.append(self.path)
        if self.path == "/v1/metrics" and not self.metrics_route:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


class _Server:
    def __init__(self, metrics_route: bool = True) -> None:
        self.paths: list[str] = []
        handler = type("H", (_Recording,), {"paths": self.paths, "metrics_route": metrics_route})
        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def _spans() -> list[Any]:
    identity = Identity("job-s", 0, build_resource("job-s", RankInfo(0, 0, 1), host_name="n"))
    materializer = SpanMaterializer(identity, 0, None, None)
    return materializer.materialize([StepEvent(0, 10, 20)], final=True)


# ------------------------------------------------------------------ which exporters


@pytest.mark.parametrize(
    ("value", "names"),
    [
        (None, ["otlp"]),
        ("", ["otlp"]),
        ("none", []),
        (" NONE ", []),
        ("otlp, console", ["otlp", "console"]),
    ],
)
def test_exporter_names_read_as_the_sdk_reads_them(value: str | None, names: list[str]) -> None:
    env = {} if value is None else {"OTEL_TRACES_EXPORTER": value, "OTEL_METRICS_EXPORTER": value}
    assert exporters.exporter_names("traces", env) == names
    assert exporters.exporter_names("metrics", env) == names


def test_none_with_others_and_unknown_names_are_config_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="none cannot be combined"):
        exporters.exporter_names("traces", {"OTEL_TRACES_EXPORTER": "none,otlp"})
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ConfigError, match=r"OTEL_TRACES_EXPORTER: no exporter named 'zipkin'"):
        exporters.span_exporter_factory()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    with pytest.raises(ConfigError, match="OTEL_METRICS_EXPORTER"):
        exporters.metric_exporter_factories()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    with pytest.raises(ConfigError, match=r"^OTEL_EXPORTER_OTLP_METRICS_PROTOCOL='http/json'"):
        exporters.metric_exporter_factories()


def test_traces_exporter_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    factory = exporters.span_exporter_factory()
    assert factory is not None and isinstance(factory(), Grpc)  # the default: OTLP/gRPC
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    factory = exporters.span_exporter_factory()
    assert factory is not None and isinstance(factory(), Http)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp_proto_grpc")  # the name fixes it
    factory = exporters.span_exporter_factory()
    assert factory is not None and isinstance(factory(), Grpc)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    factory = exporters.span_exporter_factory()
    assert factory is not None and isinstance(factory(), ConsoleSpanExporter)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    factory = exporters.span_exporter_factory()
    assert factory is not None
    both = factory()
    assert isinstance(both, exporters.FanOutSpanExporter)
    assert [type(e) for e in both.exporters] == [Http, ConsoleSpanExporter]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert exporters.span_exporter_factory() is None


def test_metrics_exporter_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    (reader,) = exporters.metric_readers(60_000)
    assert isinstance(reader, PeriodicExportingMetricReader)
    assert isinstance(reader._exporter, OTLPMetricExporter)
    reader.shutdown()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    (reader,) = exporters.metric_readers(60_000)
    assert isinstance(reader._exporter, ConsoleMetricExporter)
    reader.shutdown()
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert exporters.metric_readers(60_000) == []


# ------------------------------------------------------------------ where to, real sockets


def test_http_endpoints_general_gets_the_signal_path_per_signal_is_as_is(
    server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.sdk.metrics import MeterProvider

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url + "/base")

    def send_both() -> None:
        factory = exporters.span_exporter_factory()
        assert factory is not None
        exporter = factory()
        exporter.export(_spans())
        exporter.shutdown()
        readers = exporters.metric_readers(60_000)
        provider = MeterProvider(metric_readers=readers)
        provider.get_meter("t").create_counter("c").add(1)
        provider.shutdown()  # collects and exports once

    send_both()
    assert sorted(server.paths) == ["/base/v1/metrics", "/base/v1/traces"]
    server.paths.clear()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", server.url + "/my/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", server.url + "/my/metrics")
    send_both()
    assert sorted(server.paths) == ["/my/metrics", "/my/traces"]


def test_grpc_per_signal_endpoint_wins() -> None:
    with OtlpSink() as general, OtlpSink() as traces:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": general.endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces.endpoint,
        }
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            factory = exporters.span_exporter_factory()
            assert factory is not None
            exporter = factory()
            assert exporter.export(_spans()).name == "SUCCESS"
            exporter.shutdown()
        assert sorted(s.name for s in traces.spans()) == ["train.step", "train.step.root"]
        assert general.spans() == []


# ------------------------------------------------------------------ OTEL_SDK_DISABLED


@pytest.mark.parametrize(
    ("value", "enabled"), [("true", False), (" TRUE ", False), ("false", True), ("", True)]
)
def test_sdk_disabled_as_the_sdk_reads_it(value: str, enabled: bool) -> None:
    assert Settings.from_env({"OTEL_SDK_DISABLED": value}).enabled is enabled


def test_sdk_disabled_other_values_do_not_disable_and_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="skewtrace.config"):
        assert Settings.from_env({"OTEL_SDK_DISABLED": "1"}).enabled
    assert "OTEL_SDK_DISABLED='1' is not 'true'" in caplog.text


# ------------------------------------------------------------------ in instrument()


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SKEWTRACE_JOB_ID", "switches")
    monkeypatch.setenv("SKEWTRACE_EXPORT_INTERVAL_MILLIS", "20")
    monkeypatch.setenv("SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS", "3000")
    yield
    skewtrace.uninstrument()


def _train(steps: int = 3) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    skewtrace.instrument(optimizer=optimizer)
    for _ in range(steps):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()


def test_traces_exporter_none_exports_nothing_and_says_so(
    world_of_one: None,
    job: None,
    server: _Server,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
    with caplog.at_level(logging.INFO, logger="skewtrace"):
        _train()
        session = skewtrace.SkewtraceInstrumentor().session
        assert session is not None
        skewtrace.uninstrument()
    assert server.paths == []
    assert session.exporter.stats.exported == 0 and session.recorder.dropped() == {}
    assert len(session.recorder.events) == 0  # drained all the same: memory stays bounded
    infos = [r.getMessage() for r in caplog.records if r.name == "skewtrace"]
    assert sum("OTEL_TRACES_EXPORTER=none" in m for m in infos) == 1, infos
    assert sum("OTEL_METRICS_EXPORTER=none" in m for m in infos) == 1, infos


def test_unknown_exporter_is_a_config_error_from_instrument(
    world_of_one: None, job: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(ConfigError, match="zipkin"):
        _train(0)
    assert not skewtrace.is_instrumented()


@pytest.mark.parametrize("metrics_exporter", ["none", "otlp"])
def test_metrics_exporter_none_against_a_collector_without_metrics_pipeline(
    world_of_one: None,
    job: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    metrics_exporter: str,
) -> None:
    server = _Server(metrics_route=False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", metrics_exporter)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "50")
    monkeypatch.setenv("SKEWTRACE_NODE_TELEMETRY_INTERVAL_MILLIS", "100")
    try:
        with caplog.at_level(logging.WARNING):
            _train()
            skewtrace.uninstrument()
    finally:
        server.close()
    exporter_lines = [r for r in caplog.records if r.name in _log_limit.EXPORTER_LOGGERS]
    assert "/v1/traces" in server.paths
    if metrics_exporter == "none":
        assert "/v1/metrics" not in server.paths
        assert exporter_lines == []
    else:  # the control: the same run does reach the missing route, and says so
        assert "/v1/metrics" in server.paths
        assert any("404" in r.getMessage() for r in exporter_lines), exporter_lines


@pytest.mark.slow
def test_log_limit_stays_through_the_final_flush(world_of_one: None, job: None) -> None:
    _train(1)
    session = skewtrace.SkewtraceInstrumentor().session
    assert session is not None
    seen: list[bool] = []
    shutdown = session.exporter.shutdown

    def watched(timeout_millis: int) -> bool:
        seen.append(_log_limit._installed is not None)
        return shutdown(timeout_millis)

    session.exporter.shutdown = watched  # type: ignore[method-assign]
    skewtrace.uninstrument()
    assert seen == [True]
    assert _log_limit._installed is None


def test_metrics_readers_stop_when_the_span_flush_used_the_whole_budget(
    world_of_one: None, job: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens at the default endpoint and the shutdown budget is 50 ms: the span
    exporter's final flush uses it all. The SDK's MeterProvider.shutdown skips every reader
    once its deadline has passed, which left the private providers' export threads running
    and retrying for the rest of the process; they stop now (within seconds, in the
    background)."""
    monkeypatch.setenv("SKEWTRACE_SHUTDOWN_TIMEOUT_MILLIS", "50")
    before = set(threading.enumerate())
    _train(1)
    ours = [t for t in set(threading.enumerate()) - before if "PeriodicExporting" in t.name]
    assert ours, "the private metrics providers should run a periodic reader"
    started = time.monotonic()
    skewtrace.uninstrument()
    assert time.monotonic() - started < 2  # the caller still waits only its budget
    deadline = time.monotonic() + 20
    while any(t.is_alive() for t in ours) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [t.name for t in ours if t.is_alive()]


def test_private_resource_carries_the_rank(world_of_one: None, job: None, server: _Server) -> None:
    """Self-metrics on the private provider start once the rank is known: with its resource."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        patch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", server.url)
        _train(1)
        session = skewtrace.SkewtraceInstrumentor().session
        assert session is not None
        provider = session.metrics._own_provider
        assert provider is not None
        assert provider._sdk_config.resource.attributes[semconv.JOB_ID] == "switches"
        skewtrace.uninstrument()
