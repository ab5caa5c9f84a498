"""The pacer against hostile or careless clients (issue 14, items 4, 5 and 7).

- Item 4: the OTLP/gRPC input needs the same bearer token as the HTTP side (or mTLS); a real
  grpc client without it cannot push metrics that get a job's ranks delayed.
- Item 5: the state and the log stay bounded by size (series per job and in all, deltas per
  rank, 1 MiB job ids refused over OTLP as over HTTP, log lines with client text rate-limited),
  and the HTTP server closes half-sent requests within its read timeout, bounds its
  connections, and logs one short line (no traceback) per aborted request.
- Item 7: the scheme ``bearer`` is accepted in any case; undecodable and unauthenticated OTLP
  requests are counted in the pacer's own metrics as well as at ``/healthz``.

Servers, sockets and grpc channels are real; the decision clock is the fake one of
``test_pacer_service``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import subprocess
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from skewtrace import semconv
from skewtrace._options import FieldError
from skewtrace.cli import build_pacer_config, build_parser
from skewtrace.controller._auth import BearerToken, bearer_credentials
from skewtrace.controller._limits import LogBudget, loggable
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.service import PacerService
from skewtrace.controller.state import JobWindows
from test_pacer_service import (
    CUMULATIVE,
    DELTA,
    FakeClock,
    SimulatedJob,
    _points,
    _start,
    drive,
    get,
    histogram,
    request,
)

TOKEN = "s3cret-token"
EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _stub(service: PacerService) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"127.0.0.1:{service.otlp_port}")
    return channel, metrics_service_pb2_grpc.MetricsServiceStub(channel)


def _auth(value: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", value),)


class _WithMetadata:
    """A stub whose calls carry ``metadata`` (as the Collector's exporter's headers do)."""

    def __init__(self, stub: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._stub = stub
        self._metadata = metadata

    def Export(self, req: Any, timeout: float) -> Any:
        return self._stub.Export(req, metadata=self._metadata, timeout=timeout)


def _http_get(service: PacerService, path: str, authorization: str) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{service.http_port}{path}")
    req.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


# ------------------------------------------------------------------ item 4: OTLP auth


def test_otlp_without_the_token_cannot_get_ranks_delayed(clock: FakeClock) -> None:
    """The attack of item 4: fake straggler metrics pushed for 10 s without the token."""
    svc = _start(clock, token=TOKEN)
    channel, stub = _stub(svc)
    try:
        job = SimulatedJob("victim")
        refused = 0
        for _ in range(10):
            clock.now += 1.0
            job.run_steps(8)
            for metadata in (None, _auth("Bearer wrong"), _auth(TOKEN), _auth("Basic " + TOKEN)):
                with pytest.raises(grpc.RpcError) as err:
                    stub.Export(job.export(CUMULATIVE), metadata=metadata, timeout=5)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                refused += 1
            svc.tick()
        assert svc.decision_body("victim") is None
        status, body = get(svc, "/v1/pacing?job=victim", token=TOKEN)
        assert status == 200 and body["delays"] == {} and body["version"] == 0
        health = get(svc, "/healthz")[1]
        assert health["otlp_requests_unauthenticated"] == refused == 40
        assert health["otlp_requests"] == 0 and health["points_accepted"] == 0

        # The Collector's exporter with `headers: {authorization: "Bearer <token>"}`.
        job = SimulatedJob("victim")
        drive(svc, _WithMetadata(stub, _auth(f"Bearer {TOKEN}")), clock, [job], 10.0)
        body = get(svc, "/v1/pacing?job=victim", token=TOKEN)[1]
        assert body["active"] is True and body["delays"]
    finally:
        channel.close()
        svc.stop()


def test_without_a_token_the_otlp_input_stays_open(clock: FakeClock) -> None:
    """No token configured: any or no authorization metadata is accepted (as before)."""
    svc = _start(clock)
    channel, stub = _stub(svc)
    try:
        for metadata in (None, _auth("Bearer "), _auth("Bearer anything")):
            stub.Export(SimulatedJob("open").export(CUMULATIVE), metadata=metadata, timeout=5)
        assert get(svc, "/healthz")[1]["otlp_requests_unauthenticated"] == 0
    finally:
        channel.close()
        svc.stop()


def test_the_otel_sdk_otlp_exporter_with_the_authorization_header(clock: FakeClock) -> None:
    """An OTLP/gRPC exporter configured like the Collector's (the header in its config)."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    svc = _start(clock, token=TOKEN)
    try:
        results = []
        for headers in ({"authorization": f"Bearer {TOKEN}"}, None):
            exporter = OTLPMetricExporter(
                endpoint=f"127.0.0.1:{svc.otlp_port}", insecure=True, headers=headers, timeout=5
            )
            reader = InMemoryMetricReader()
            provider = MeterProvider(metric_readers=[reader])
            wait = provider.get_meter("test").create_histogram(semconv.METRIC_RANK_WAIT, unit="s")
            wait.record(0.02, {semconv.JOB_ID: "sdk", semconv.RANK: 1})
            data = reader.get_metrics_data()
            assert data is not None
            results.append(exporter.export(data, timeout_millis=5000))
            exporter.shutdown()
            provider.shutdown()
        assert results == [MetricExportResult.SUCCESS, MetricExportResult.FAILURE]
        health = get(svc, "/healthz")[1]
        assert health["points_accepted"] == 1
        assert health["otlp_requests_unauthenticated"] == 1
    finally:
        svc.stop()


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_certs(root: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-keyout", "ca.key", "-out", "ca.pem", "-subj", "/CN=skewtrace-test-ca",
        cwd=root,
    )  # fmt: skip
    (root / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (root / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN=skewtrace-test-{name}",
            cwd=root,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
            cwd=root,
        )  # fmt: skip
    return {p.name: p for p in root.iterdir()}


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_otlp_mtls_and_token(clock: FakeClock, tmp_path: Path) -> None:
    files = _make_certs(tmp_path)
    svc = _start(
        clock,
        token=TOKEN,
        otlp_tls_cert_file=str(files["server.pem"]),
        otlp_tls_key_file=str(files["server.key"]),
        otlp_tls_client_ca_file=str(files["ca.pem"]),
    )
    target = f"127.0.0.1:{svc.otlp_port}"
    ca = files["ca.pem"].read_bytes()
    req = SimulatedJob("tls").export(CUMULATIVE)

    def export(credentials: grpc.ChannelCredentials | None, token: str | None) -> Any:
        channel = (
            grpc.secure_channel(target, credentials)
            if credentials
            else grpc.insecure_channel(target)
        )
        try:
            stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
            metadata = _auth(f"Bearer {token}") if token else None
            return stub.Export(req, metadata=metadata, timeout=5)
        finally:
            channel.close()

    try:
        with_client_cert = grpc.ssl_channel_credentials(
            ca, files["client.key"].read_bytes(), files["client.pem"].read_bytes()
        )
        assert export(with_client_cert, TOKEN).partial_success.rejected_data_points == 0
        with pytest.raises(grpc.RpcError) as err:
            export(with_client_cert, None)  # the token is required on top of the certificate
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for credentials in (grpc.ssl_channel_credentials(ca), None):  # no client cert; plaintext
            with pytest.raises(grpc.RpcError) as err:
                export(credentials, TOKEN)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        health = get(svc, "/healthz")[1]
        assert health["otlp_requests"] == 1 and health["otlp_requests_unauthenticated"] == 1
    finally:
        svc.stop()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--otlp-tls-cert-file", "c.pem"], "--otlp-tls-key-file (default none): must be set"),
        (["--otlp-tls-key-file", "k.pem"], "--otlp-tls-cert-file (default none): must be set"),
        (
            ["--otlp-tls-client-ca-file", "ca.pem"],
            "--otlp-tls-client-ca-file='ca.pem': needs --otlp-tls-cert-file",
        ),
        (["--http-read-timeout-millis", "0"], "must be a positive number"),
        (["--http-max-connections", "0"], "must be an integer >= 1"),
        (["--max-series-per-job", "2"], "must be an integer >= 3"),
    ],
)
def test_cli_checks_the_new_options(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    args = parser.parse_args(["pacer", *argv])
    with pytest.raises(SystemExit) as exit_:
        build_pacer_config(args.parser, args, {})
    assert exit_.value.code == 2
    assert needle in capsys.readouterr().err


def test_unreadable_tls_file_is_an_error_naming_the_flag(clock: FakeClock) -> None:
    config = PacerConfig(otlp_tls_cert_file="/nonexistent/c.pem", otlp_tls_key_file="/x/k.pem")
    with pytest.raises(OSError, match=r"--otlp-tls-key-file='/x/k\.pem': cannot read it"):
        PacerService(config, meter_provider=MeterProvider(), clock=clock).start()
    with pytest.raises(FieldError):
        PacerConfig(otlp_tls_key_file="k.pem")


# ------------------------------------------------------------------ item 7: scheme, counters


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_bearer_scheme_in_any_case_on_http_and_grpc(clock: FakeClock, scheme: str) -> None:
    svc = _start(clock, token=TOKEN)
    channel, stub = _stub(svc)
    try:
        value = f"{scheme} {TOKEN}"
        assert _http_get(svc, "/v1/pacing?job=j", value) == 200
        stub.Export(SimulatedJob("j").export(CUMULATIVE), metadata=_auth(value), timeout=5)
        assert _http_get(svc, "/v1/pacing?job=j", f"{scheme} wrong") == 401
        assert _http_get(svc, "/v1/pacing?job=j", f"{scheme}{TOKEN}") == 401
        assert get(svc, "/healthz")[1]["otlp_requests"] == 1
    finally:
        channel.close()
        svc.stop()


def test_bearer_parsing() -> None:
    assert bearer_credentials("Bearer abc") == "abc"
    assert bearer_credentials("bearer   abc ") == "abc"
    assert bearer_credentials("Bearer") is None
    assert bearer_credentials("Basic abc") is None
    assert bearer_credentials(None) is None
    token = BearerToken("abc")
    assert token.accepts("BEARER abc") and not token.accepts("Bearer abcd")
    assert not token.accepts("Bearer ") and not token.accepts(None)
    assert "abc" not in repr(token)


def test_refused_requests_are_in_the_own_metrics(clock: FakeClock) -> None:
    reader = InMemoryMetricReader()
    svc = _start(clock, reader, token=TOKEN)
    channel, stub = _stub(svc)
    try:
        raw = channel.unary_unary(
            EXPORT, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\xff\xff\xff\xff garbage", metadata=_auth(f"Bearer {TOKEN}"), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for _ in range(2):
            with pytest.raises(grpc.RpcError):
                raw(b"\xff garbage", timeout=5)  # no token: refused before decoding
        long_job = {semconv.JOB_ID: "x" * 300, semconv.RANK: 0}
        stub.Export(
            request(histogram(semconv.METRIC_RANK_WAIT, CUMULATIVE, [(long_job, 1, 0.1)])),
            metadata=_auth(f"Bearer {TOKEN}"),
            timeout=5,
        )
        assert _http_get(svc, "/v1/jobs", "Bearer nope") == 401

        points = _points(reader)

        def by_reason(metric: str) -> dict[str, int]:
            return {p.attributes[semconv.REASON]: p.value for p in points[metric]}

        otlp = by_reason(semconv.METRIC_PACER_OTLP_REFUSED)
        assert otlp == {"unauthenticated": 2, "undecodable": 1, "ingest_failed": 0}
        rejected = by_reason(semconv.METRIC_PACER_POINTS_REJECTED)
        assert rejected["too_long"] == 1 and rejected["invalid"] == 0
        assert by_reason(semconv.METRIC_PACER_HTTP_REFUSED)["unauthenticated"] == 1
        health = get(svc, "/healthz")[1]
        assert health["otlp_requests_undecodable"] == 1
        assert health["otlp_requests_unauthenticated"] == 2
        assert health["http_refused_unauthenticated"] == 1
    finally:
        channel.close()
        svc.stop()


# ------------------------------------------------------------------ item 5: sizes


def _pacer_log(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("skewtrace.controller")]


def test_one_mib_job_id_over_otlp_is_rejected_counted_and_not_logged(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="skewtrace.controller")
    svc = _start(clock, job_timeout_s=5.0)
    channel, stub = _stub(svc)
    try:
        huge = "j" * (1 << 20)
        for i in range(10):
            points: list[tuple[dict[str, str | int], int, float]] = [
                ({semconv.JOB_ID: huge + str(i), semconv.RANK: r}, 4, 0.1) for r in range(4)
            ]
            points.append(({semconv.JOB_ID: "ok", semconv.RANK: "7" * 300}, 1, 0.1))
            response = stub.Export(
                request(histogram(semconv.METRIC_STEP_DURATION, CUMULATIVE, points)), timeout=10
            )
            assert response.partial_success.rejected_data_points == 5
            assert "too long" in response.partial_success.error_message
        for _ in range(3):
            clock.now += 10.0
            svc.tick()
        health = get(svc, "/healthz")[1]
        assert health["points_too_long"] == 50
        assert health["jobs"] == 0 and health["series"] == 0
        assert get(svc, "/v1/jobs")[1]["jobs"] == []
        logged = sum(len(r.getMessage()) for r in _pacer_log(caplog))
        assert logged < 4096, logged
    finally:
        channel.close()
        svc.stop()


def _series_request(job: str, n: int, start: int = 0) -> Any:
    """``n`` distinct series of one job: one rank, an attribute that differs per series."""
    points: list[tuple[dict[str, str | int], int, float]] = [
        ({semconv.JOB_ID: job, semconv.RANK: 0, "x": f"value-{i}"}, 1, 0.01)
        for i in range(start, start + n)
    ]
    return request(histogram(semconv.METRIC_RANK_WAIT, CUMULATIVE, points))


def test_series_per_job_and_in_all_are_capped() -> None:
    windows = JobWindows(4.0, 60.0, max_series_per_job=1000, max_series=1500)
    assert windows.ingest_request(_series_request("a", 3000).resource_metrics, 1.0) == 2000
    assert windows.series == 1000
    assert windows.counters.points_over_series_limit == 2000
    # Known series of the full job still update.
    assert windows.ingest_request(_series_request("a", 10).resource_metrics, 2.0) == 0
    # Another job gets the room left in all (500), then nothing.
    assert windows.ingest_request(_series_request("b", 800).resource_metrics, 2.0) == 300
    assert windows.series == 1500
    assert windows.ingest_request(_series_request("c", 1).resource_metrics, 2.0) == 1
    assert "c" not in windows.job_ids()  # a refused point makes no empty job
    # Forgotten series free their room.
    windows.expire(100.0)
    assert windows.series == 0 and windows.job_ids() == []
    assert windows.ingest_request(_series_request("c", 5).resource_metrics, 101.0) == 0


@pytest.mark.slow
def test_memory_of_many_series_is_bounded() -> None:
    """Item 5's 100k-series attack, scaled: 20k series into one job capped at 5k series.

    Before: every series was kept (about 1 kB each with these four attributes, more with
    longer ones: 100k took the pacer from 46 to 206 MiB). Now at most 5k are, at a fixed size
    whatever their attributes.
    """
    windows = JobWindows(4.0, 60.0, max_series_per_job=5000)
    req = _series_request("big", 20_000)
    long_attrs = _series_request("big2", 2000)
    for point in long_attrs.resource_metrics[0].scope_metrics[0].metrics[0].histogram.data_points:
        point.attributes.add(key="padding").value.string_value = "p" * 2000
    # Only what the pacer's own code allocated: a background thread another test left running
    # (an exporter retrying, say) allocates meanwhile too, and once made this 524 B a series.
    pacer_only = [tracemalloc.Filter(True, "*/skewtrace/controller/*")]

    def held(snapshot: tracemalloc.Snapshot) -> int:
        return sum(s.size for s in snapshot.filter_traces(pacer_only).statistics("filename"))

    tracemalloc.start()
    try:
        windows.ingest_request(req.resource_metrics, 1.0)
        capped = held(tracemalloc.take_snapshot())
        windows.ingest_request(long_attrs.resource_metrics, 1.0)
        both = held(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    assert windows.series == 7000
    assert windows.counters.points_over_series_limit == 15_000
    per_series = capped / 5000
    print(f"pacer state: {per_series:.0f} B per series (target < 512 B, fixed by the cap)")
    assert per_series < 512
    # 2 kB attribute values cost a series no more than short ones.
    assert (both - capped) / 2000 < 512


def test_deltas_per_rank_are_bounded_however_often_points_arrive() -> None:
    windows = JobWindows(4.0, 60.0)
    attrs: dict[str, str | int] = {semconv.JOB_ID: "j", semconv.RANK: 0}
    now = 10.0
    for _ in range(4000):  # 1000 requests per second for 4 s
        now += 0.001
        req = request(
            histogram(semconv.METRIC_STEP_DURATION, DELTA, [(attrs, 1, 0.1)]),
            histogram(semconv.METRIC_RANK_WAIT, DELTA, [(attrs, 1, 0.01)]),
        )
        windows.ingest_request(req.resource_metrics, now)
    held = len(windows._table.jobs["j"].deltas[0])
    assert held <= 2 * 17, held  # per kind at most window / (window / 16) + 1
    rank = windows.window("j", now + 0.01).ranks[0]
    # Merged, not lost: only the oldest merged delta (window / 16 wide) may straddle the
    # window's start and leave it whole.
    assert 4000 - 4000 / 16 - 20 <= rank.steps <= 4000
    assert rank.step_time_sum_s == pytest.approx(rank.steps * 0.1)


def test_log_lines_with_client_text_are_bounded(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="skewtrace.controller")
    svc = _start(clock, job_timeout_s=5.0)
    try:
        for i in range(300):
            job = f"job-{i}-" + "\n" * 5 + "z" * 200
            svc.ingest(
                request(
                    histogram(
                        semconv.METRIC_STEP_DURATION,
                        CUMULATIVE,
                        [({semconv.JOB_ID: job, semconv.RANK: 0}, 4, 0.4)],
                    )
                )
            )
        svc.tick()
        clock.now += 10.0
        svc.tick()  # forgets 300 jobs
        lines = [r.getMessage() for r in _pacer_log(caplog) if "forgot job" in r.getMessage()]
        assert 1 <= len(lines) <= 20
        assert all(len(line) < 160 and "\n" not in line for line in lines)
    finally:
        svc.stop()


def test_log_budget_reports_what_it_held_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock()
    budget = LogBudget(burst=3, interval_s=60.0, clock=clock)
    log = logging.getLogger("skewtrace.controller.test")
    passed = [budget.log(log, logging.INFO, "job %s gone", loggable(str(i))) for i in range(10)]
    assert passed == [True] * 3 + [False] * 7
    clock.now += 61.0
    assert budget.log(log, logging.INFO, "job %s gone", "'x'")
    assert "[7 similar lines held back]" in caplog.records[-1].getMessage()
    assert loggable("a" * 1000).endswith("... (1000 chars)") and len(loggable("a" * 1000)) < 90


# ------------------------------------------------------------------ item 5: the HTTP server


def _half_open(port: int, payload: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(payload)
    return sock


def _closed_by_server(sock: socket.socket, within_s: float) -> tuple[bool, bytes]:
    """Whether the server closed the connection within ``within_s``; what it sent first."""
    sock.settimeout(within_s)
    received = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return True, received
            received += chunk
    except TimeoutError:
        return False, received
    except ConnectionResetError:
        return True, received


@pytest.mark.slow
def test_half_sent_requests_are_closed_within_the_read_timeout(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Slowloris: more half-sent requests than connections allowed, two of them dripping."""
    caplog.set_level(logging.DEBUG, logger="skewtrace.controller")
    svc = _start(clock, http_read_timeout_s=1.0, http_max_connections=8)
    threads_before = threading.active_count()
    partial = b"GET /v1/pacing?job=x HTTP/1.1\r\nHost: pacer\r\n"
    held: list[socket.socket] = []
    extra: list[socket.socket] = []
    try:
        drippers = [_half_open(svc.http_port, b"GET /v1/pa") for _ in range(2)]
        held = drippers + [_half_open(svc.http_port, partial) for _ in range(6)]
        deadline = time.monotonic() + 5
        while svc.health()["http_connections"] < 8 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert svc.health()["http_connections"] == 8
        started = time.monotonic()
        extra = [_half_open(svc.http_port, partial) for _ in range(22)]
        for sock in extra:  # refused at once, with a 503
            closed, answer = _closed_by_server(sock, 2.0)
            assert closed and (answer == b"" or answer.startswith(b"HTTP/1.1 503")), answer

        def drip() -> None:
            for _ in range(20):
                time.sleep(0.2)
                for sock in drippers:
                    try:
                        sock.send(b"c")
                    except OSError:
                        return

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        for sock in held:
            closed, _ = _closed_by_server(sock, max(0.1, started + 2.0 - time.monotonic()))
            assert closed, "a half-sent request outlived the read timeout"
        released_after = time.monotonic() - started
        deadline = time.monotonic() + 3
        while threading.active_count() > threads_before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() <= threads_before
        status, body = get(svc, "/v1/pacing?job=x")
        assert status == 200 and body["active"] is False
        deadline = time.monotonic() + 3
        while svc.health()["http_connections"] and time.monotonic() < deadline:
            time.sleep(0.02)  # the good request's thread ends just after its answer
        health = svc.health()
        assert health["http_connections"] == 0
        assert health["http_refused_timeout"] == 8
        assert health["http_refused_too_many_connections"] == 22
        assert released_after < 2.0
        dripper.join(timeout=5)
    finally:
        for sock in held + extra:
            sock.close()
        svc.stop()
    records = _pacer_log(caplog)
    assert not any(r.exc_info for r in records)
    assert all(len(r.getMessage()) < 200 for r in records)
    assert len([r for r in records if r.levelno >= logging.INFO]) <= 10
    assert "Traceback" not in capfd.readouterr().err


def test_aborted_requests_log_one_short_line_and_no_traceback(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    import struct

    caplog.set_level(logging.DEBUG, logger="skewtrace.controller")
    svc = _start(clock)
    aborts = 0
    try:
        for payload in (
            b"GET /v1/pacing?job=x HTTP/1.1\r\nHost: a\r\n",  # reset mid-headers
            b"GET /v1/jobs HTTP/1.1\r\nHost: a\r\n\r\n" * 200,  # reset before the answers
            b"GET /v1/pacing?job=" + b"x" * 70_000,  # an over-long request line, then reset
        ):
            sock = socket.create_connection(("127.0.0.1", svc.http_port))
            with contextlib.suppress(OSError):  # the server may cut an over-long line short
                sock.sendall(payload)
            time.sleep(0.1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()  # RST
            aborts += 1
        time.sleep(0.5)
        assert get(svc, "/healthz")[0] == 200
    finally:
        svc.stop()
    records = [r for r in _pacer_log(caplog) if r.levelno >= logging.INFO]
    records = [r for r in records if "pacer listening" not in r.getMessage()]
    assert len(records) <= aborts, [r.getMessage() for r in records]
    assert all(len(r.getMessage()) < 200 and not r.exc_info for r in records)
    assert not any(r.exc_info for r in _pacer_log(caplog))
    assert "Traceback" not in capfd.readouterr().err
