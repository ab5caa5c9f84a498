"""Who may talk to otelcol-skewtrace: localhost by default, token and TLS on the network.

Real collector processes (tests/collector_harness.py), real OTLP over real sockets:

- the default configs (otelcol.yaml, gateway.yaml, passthrough.yaml), started with no
  endpoint variables, listen on 127.0.0.1 only (the kernel's socket table of the process);
- with collector-config/network-auth.yaml the OTLP receivers take a request with the right
  bearer token over TLS and refuse one without a token or with a wrong one (gRPC
  UNAUTHENTICATED, HTTP 401), a plaintext request, and a client that does not trust the
  certificate; metrics-auth.yaml does the same for the Prometheus endpoint;
- a rank's exporter (skewtrace's own factory, the OTel SDK underneath) reaches such a
  collector from the standard OTEL_EXPORTER_OTLP_HEADERS / _CERTIFICATE variables alone;
- tier 1 of the gateway with gateway-auth.yaml sends its own token to tier 2 over TLS;
- the exporter to the pacer sends SKEWTRACE_PACER_TOKEN as a bearer token.

The CA and the collector's certificate are made with `openssl` in a temporary directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

import needs
from collector_harness import (
    CONFIG_DIR,
    FILE_EXPORT_YAML,
    GATEWAY_YAML,
    OTELCOL_YAML,
    PASSTHROUGH_YAML,
    CollectorPorts,
    CollectorProcess,
    loadgen_for_tests,
    run_loadgen_send,
)

pytestmark = [pytest.mark.slow, pytest.mark.collector]

NETWORK_AUTH_YAML = CONFIG_DIR / "network-auth.yaml"
GATEWAY_AUTH_YAML = CONFIG_DIR / "gateway-auth.yaml"
METRICS_AUTH_YAML = CONFIG_DIR / "metrics-auth.yaml"

# What the configs listen on when no variable says otherwise.
DEFAULT_PORTS = {
    "otelcol.yaml": {4317, 4318, 8889, 13133, 8888},
    "gateway.yaml": {4317, 4318, 13133, 8888},
    "passthrough.yaml": {4317, 4318, 13133, 8888},
}


# -- certificates --------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    other_ca_cert: Path
    """A CA that signed nothing here: a client trusting only it must refuse the collector."""


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"openssl {' '.join(args)}:\n{result.stderr}"


def _make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", key.name, "-out", cert.name, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=directory,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    if shutil.which("openssl") is None:
        needs.unavailable("openssl is not installed (needed to make test certificates)")
    directory = tmp_path_factory.mktemp("tls")
    ca_cert, ca_key = _make_ca(directory, "test-ca")
    other_ca_cert, _ = _make_ca(directory, "other-ca")
    (directory / "server.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", ca_cert.name, "-CAkey", ca_key.name,
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext",
        cwd=directory,
    )  # fmt: skip
    return TlsFiles(ca_cert, directory / "server.crt", directory / "server.key", other_ca_cert)


def _server_env(tls: TlsFiles, token: str) -> dict[str, str]:
    """What network-auth.yaml needs."""
    return {
        "SKEWTRACE_OTLP_TOKEN": token,
        "SKEWTRACE_TLS_CERT_FILE": str(tls.server_cert),
        "SKEWTRACE_TLS_KEY_FILE": str(tls.server_key),
    }


# -- OTLP requests by hand -----------------------------------------------------------------


def _string(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _traces_request(span_name: str) -> trace_service_pb2.ExportTraceServiceRequest:
    """One span that barrierskew forwards unchanged (not a collective, not a phase)."""
    now = time.time_ns()
    span = Span(
        trace_id=secrets.token_bytes(16),
        span_id=secrets.token_bytes(8),
        name=span_name,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=now - 1_000_000,
        end_time_unix_nano=now,
    )
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[_string("service.name", "auth-test")]),
                scope_spans=[ScopeSpans(spans=[span])],
            )
        ]
    )


def _grpc_export(
    endpoint: str,
    span_name: str,
    *,
    token: str | None,
    root_cert: Path | None,
    plaintext: bool = False,
) -> grpc.StatusCode:
    """Send one span by OTLP/gRPC; the status the server (or the channel) answered."""
    if plaintext:
        channel = grpc.insecure_channel(endpoint)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=root_cert.read_bytes() if root_cert else None
        )
        channel = grpc.secure_channel(endpoint, credentials)
    metadata = [("authorization", f"Bearer {token}")] if token is not None else []
    with channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        try:
            stub.Export(_traces_request(span_name), metadata=metadata, timeout=5)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


def _http_post(url: str, body: bytes, *, token: str | None, ca_cert: Path | None) -> int | str:
    """POST OTLP/HTTP protobuf; the HTTP status, or the error when there was no answer."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"}
    )
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    context = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else None
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (urllib.error.URLError, OSError) as err:
        return f"{type(err).__name__}: {err}"


def _wait(check: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _exported_names(collector: CollectorProcess) -> set[str]:
    return {span.name for span in collector.exported_spans()}


def _probe_name(label: str) -> str:
    return f"auth.probe.{label}.{secrets.token_hex(4)}"


# -- defaults: loopback only ---------------------------------------------------------------


def _listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    listening = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address_hex, port_hex = local.split(":")
            raw = bytes.fromhex(address_hex)
            # /proc prints the address as 32-bit words in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            listening.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return listening


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize(
    "config", [OTELCOL_YAML, GATEWAY_YAML, PASSTHROUGH_YAML], ids=lambda p: p.name
)
def test_default_config_listens_on_loopback_only(
    otelcol_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: Path
) -> None:
    expected_ports = DEFAULT_PORTS[config.name]
    busy = sorted(p for p in expected_ports if not _port_is_free(p))
    if busy:
        pytest.skip(f"default ports {busy} are in use on this machine")
    # The process gets no endpoint variable at all: what it binds is the config's default.
    ports = CollectorPorts(otlp_grpc=4317, otlp_http=4318, prometheus=8889, health=13133)
    collector = CollectorProcess(otelcol_path, [config], tmp_path, ports=ports)
    for name in ports.env():
        collector.env.pop(name, None)
        monkeypatch.delenv(name, raising=False)
    with collector:
        listening = _wait(
            lambda: (
                (s := _listening_sockets(collector.pid))
                and {p for _, p in s} >= expected_ports
                and s
            ),
            timeout_s=10,
        )
        assert listening, f"{config.name}: not listening on {sorted(expected_ports)}"
        assert {port for _, port in listening} >= expected_ports
        assert {address for address, _ in listening} == {"127.0.0.1"}, listening


# -- network-auth.yaml: token and TLS ------------------------------------------------------


@pytest.fixture(scope="module")
def secured(
    otelcol_path: Path, tls_files: TlsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[CollectorProcess, str]]:
    """otelcol.yaml + file-export.yaml + network-auth.yaml + metrics-auth.yaml, one token."""
    token = secrets.token_urlsafe(24)
    collector = CollectorProcess(
        otelcol_path,
        [OTELCOL_YAML, FILE_EXPORT_YAML, NETWORK_AUTH_YAML, METRICS_AUTH_YAML],
        tmp_path_factory.mktemp("secured"),
        name="secured",
        env=_server_env(tls_files, token),
    )
    with collector:
        yield collector, token


def test_grpc_needs_token_and_tls(secured: tuple[CollectorProcess, str], tls_files: TlsFiles):
    collector, token = secured
    endpoint = collector.otlp_grpc_endpoint
    ca = tls_files.ca_cert
    names = {label: _probe_name(label) for label in ("no-token", "wrong", "plain", "untrusted")}
    refused = {
        "no-token": _grpc_export(endpoint, names["no-token"], token=None, root_cert=ca),
        "wrong": _grpc_export(endpoint, names["wrong"], token=token + "x", root_cert=ca),
        "plain": _grpc_export(
            endpoint, names["plain"], token=token, root_cert=None, plaintext=True
        ),
        "untrusted": _grpc_export(
            endpoint, names["untrusted"], token=token, root_cert=tls_files.other_ca_cert
        ),
    }
    assert refused == {
        "no-token": grpc.StatusCode.UNAUTHENTICATED,
        "wrong": grpc.StatusCode.UNAUTHENTICATED,
        "plain": grpc.StatusCode.UNAVAILABLE,
        "untrusted": grpc.StatusCode.UNAVAILABLE,
    }

    accepted = _probe_name("grpc-ok")
    assert _grpc_export(endpoint, accepted, token=token, root_cert=ca) == grpc.StatusCode.OK
    assert _wait(lambda: accepted in _exported_names(collector), timeout_s=10), (
        "the accepted span never came out of the collector"
    )
    time.sleep(0.5)
    assert not set(names.values()) & _exported_names(collector)


def test_http_needs_token_and_tls(secured: tuple[CollectorProcess, str], tls_files: TlsFiles):
    collector, token = secured
    address = f"127.0.0.1:{collector.ports.otlp_http}"
    ca = tls_files.ca_cert

    def post(label: str, *, token: str | None, scheme: str = "https") -> tuple[str, int | str]:
        name = _probe_name(label)
        body = _traces_request(name).SerializeToString()
        return name, _http_post(f"{scheme}://{address}/v1/traces", body, token=token, ca_cert=ca)

    no_token, wrong, plaintext = (
        post("no-token", token=None),
        post("wrong", token="not-" + token),
        post("plain", token=token, scheme="http"),
    )
    assert no_token[1] == 401
    assert wrong[1] == 401
    # Go's TLS server answers a plaintext request with 400 and closes.
    assert plaintext[1] != 200

    accepted, status = post("http-ok", token=token)
    assert status == 200
    assert _wait(lambda: accepted in _exported_names(collector), timeout_s=10)
    time.sleep(0.5)
    assert not {no_token[0], wrong[0], plaintext[0]} & _exported_names(collector)


def test_metrics_endpoint_needs_token_and_tls(
    secured: tuple[CollectorProcess, str], tls_files: TlsFiles
) -> None:
    collector, token = secured
    url = f"https://127.0.0.1:{collector.ports.prometheus}/metrics"
    context = ssl.create_default_context(cafile=str(tls_files.ca_cert))

    def get(headers: dict[str, str], target: str = url) -> int | str:
        try:
            request = urllib.request.Request(target, headers=headers)
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return int(response.status)
        except urllib.error.HTTPError as err:
            return int(err.code)
        except (urllib.error.URLError, OSError) as err:
            return f"{type(err).__name__}: {err}"

    assert get({}) == 401
    assert get({"Authorization": "Bearer nope"}) == 401
    assert get({"Authorization": f"Bearer {token}"}, url.replace("https:", "http:")) != 200
    assert get({"Authorization": f"Bearer {token}"}) == 200


def _clear_exporter_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        # requests lets these override the CA the OTLP/HTTP exporter was given (see below).
        if name.startswith("OTEL_EXPORTER_OTLP_") or name in _REQUESTS_CA_VARIABLES:
            monkeypatch.delenv(name)


_REQUESTS_CA_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def _sdk_spans(name: str) -> Any:
    """One finished SDK span, as a rank's span processor hands it to the exporter."""
    from opentelemetry.sdk.resources import Resource as SdkResource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=SdkResource.create({"service.name": "rank-0"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("auth-test").start_span(name).end()
    provider.shutdown()
    return memory.get_finished_spans()


def test_rank_exporter_sends_token_from_otel_variables(
    secured: tuple[CollectorProcess, str],
    tls_files: TlsFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """skewtrace's private exporter is the SDK's: the standard variables carry token and CA."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from skewtrace.rank._export.exporters import otlp_span_exporter

    collector, token = secured
    spans = _sdk_spans

    _clear_exporter_env(monkeypatch)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tls_files.ca_cert))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    endpoints = {
        "grpc": f"https://127.0.0.1:{collector.ports.otlp_grpc}",
        "http/protobuf": f"https://127.0.0.1:{collector.ports.otlp_http}",
    }
    for protocol, endpoint in endpoints.items():
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20wrong")
        refused_name = _probe_name(f"rank-{protocol}-wrong")
        exporter = otlp_span_exporter()
        assert exporter.export(spans(refused_name)) == SpanExportResult.FAILURE, protocol
        exporter.shutdown()

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{token}")
        accepted_name = _probe_name(f"rank-{protocol}")
        exporter = otlp_span_exporter()
        assert exporter.export(spans(accepted_name)) == SpanExportResult.SUCCESS, protocol
        exporter.shutdown()
        assert _wait(lambda name=accepted_name: name in _exported_names(collector), timeout_s=10), (
            protocol
        )
        assert refused_name not in _exported_names(collector)


@pytest.mark.xfail(
    strict=True,
    reason="opentelemetry-exporter-otlp-proto-http sets requests.Session.verify, which "
    "requests replaces with REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE when either is set "
    "(psf/requests#3829, #4726): OTEL_EXPORTER_OTLP_CERTIFICATE is then ignored",
)
def test_http_exporter_certificate_survives_requests_ca_bundle(
    secured: tuple[CollectorProcess, str],
    tls_files: TlsFiles,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Documents a pitfall for ranks on http/protobuf (docs/deployment.md); gRPC is immune."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from skewtrace.rank._export.exporters import otlp_span_exporter

    collector, token = secured
    _clear_exporter_env(monkeypatch)
    import certifi

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(tls_files.ca_cert))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_ENDPOINT", f"https://127.0.0.1:{collector.ports.otlp_http}"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{token}")
    exporter = otlp_span_exporter()
    try:
        assert exporter.export(_sdk_spans(_probe_name("ca-bundle"))) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


# -- gateway-auth.yaml: tier 1 to tier 2 ---------------------------------------------------


def test_tier1_sends_its_token_to_tier2_over_tls(
    otelcol_path: Path, tls_files: TlsFiles, tmp_path: Path
) -> None:
    ranks_token, tier2_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    tier2 = CollectorProcess(
        otelcol_path,
        [OTELCOL_YAML, FILE_EXPORT_YAML, NETWORK_AUTH_YAML],
        tmp_path,
        name="tier2",
        env=_server_env(tls_files, tier2_token),
    )

    def tier1(name: str, token_sent_to_tier2: str) -> CollectorProcess:
        return CollectorProcess(
            otelcol_path,
            [GATEWAY_YAML, NETWORK_AUTH_YAML, GATEWAY_AUTH_YAML],
            tmp_path,
            name=name,
            env={
                **_server_env(tls_files, ranks_token),
                "SKEWTRACE_TIER2_ENDPOINTS": f"[{tier2.otlp_grpc_endpoint}]",
                "SKEWTRACE_TIER2_TOKEN": token_sent_to_tier2,
                "SKEWTRACE_TIER2_CA_FILE": str(tls_files.ca_cert),
            },
        )

    good, bad = tier1("tier1", tier2_token), tier1("tier1-wrong-token", "not-" + tier2_token)
    with tier2, good, bad:
        ca = tls_files.ca_cert
        # Tier 2 takes only its own token: the ranks' token is tier 1's business.
        assert (
            _grpc_export(
                tier2.otlp_grpc_endpoint, _probe_name("x"), token=ranks_token, root_cert=ca
            )
            == grpc.StatusCode.UNAUTHENTICATED
        )
        routed = _probe_name("via-tier1")
        assert (
            _grpc_export(good.otlp_grpc_endpoint, routed, token=ranks_token, root_cert=ca)
            == grpc.StatusCode.OK
        )
        lost = _probe_name("via-wrong-tier1")
        assert (
            _grpc_export(bad.otlp_grpc_endpoint, lost, token=ranks_token, root_cert=ca)
            == grpc.StatusCode.OK
        )
        assert _wait(lambda: routed in _exported_names(tier2), timeout_s=15)
        assert _wait(lambda: "Unauthenticated" in bad.log_text(), timeout_s=15), bad.log_tail()
        assert lost not in _exported_names(tier2)


# -- otlp_grpc/pacer: the pacer's token ----------------------------------------------------


class _RecordingMetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    """Stands in for `skewtrace pacer`'s OTLP input and keeps each request's authorization."""

    def __init__(self) -> None:
        self.authorizations: list[str | None] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        headers = dict(context.invocation_metadata())
        with self._lock:
            self.authorizations.append(headers.get("authorization"))
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def seen(self) -> list[str | None]:
        with self._lock:
            return list(self.authorizations)


@pytest.mark.parametrize(
    ("pacer_token", "pacer_tls"),
    [("pacer-s3cret", False), ("", False), ("pacer-s3cret", True)],
    ids=["token", "no-token", "token-over-tls"],
)
def test_pacer_exporter_sends_the_pacer_token(
    otelcol_path: Path, tmp_path: Path, tls_files: TlsFiles, pacer_token: str, pacer_tls: bool
) -> None:
    service = _RecordingMetricsService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(service, server)
    env = {}
    if pacer_tls:
        # As a pacer on another host serves its OTLP input.
        credentials = grpc.ssl_server_credentials(
            [(tls_files.server_key.read_bytes(), tls_files.server_cert.read_bytes())]
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
        env["SKEWTRACE_PACER_OTLP_INSECURE"] = "false"
        env["SKEWTRACE_PACER_CA_FILE"] = str(tls_files.ca_cert)
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env["SKEWTRACE_PACER_OTLP_ENDPOINT"] = f"127.0.0.1:{port}"
        if pacer_token:
            env["SKEWTRACE_PACER_TOKEN"] = pacer_token
        with CollectorProcess(otelcol_path, [OTELCOL_YAML], tmp_path, env=env) as collector:
            sent = run_loadgen_send(
                loadgen_for_tests(), collector.otlp_grpc_endpoint,
                "-job", "auth", "-ranks", "4", "-steps", "3", "-collectives", "1",
            )  # fmt: skip
            assert sent["failed_requests"] == 0
            seen = _wait(service.seen, timeout_s=15)
            # Each request got through grpcio's server (the pacer's) to the handler, so the
            # header's value is legal also when it is only "Bearer ".
            assert seen, "the collector sent no metrics to the pacer"
    finally:
        server.stop(grace=None).wait()
    if pacer_token:
        assert set(seen) == {f"Bearer {pacer_token}"}
    else:
        assert {(value or "").strip() for value in seen} == {"Bearer"}
