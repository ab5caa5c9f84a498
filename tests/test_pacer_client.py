"""The rank-side pacing client: real HTTP polling, fail-open, backoff, caps, and apply_delay.

The "good" server is the real pacer service. The misbehaving ones (500, garbage, hangs) are
small real HTTP servers in the test, because the pacer itself never answers that way.
There is no GPU here: the CUDA path is tested for its cycle arithmetic only, plus that a
failing CUDA call is swallowed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from conftest import free_port
from skewtrace.rank.pacing_client import (
    PacingClient,
    apply_delay,
    cuda_sleep_cycles,
    parse_decision,
)

POLL_S = 0.05


class ScriptedServer:
    """An HTTP server whose answer to each GET is decided by ``behaviour`` (swappable)."""

    def __init__(self, behaviour: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.behaviour = behaviour
        self.requests: list[tuple[float, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.requests.append((time.monotonic(), dict(self.headers)))
                outer.behaviour(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answer(status: int, body: bytes) -> Callable[[BaseHTTPRequestHandler], None]:
    def behaviour(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return behaviour


def decision(delays: dict[str, Any], active: bool = True, version: int = 7) -> bytes:
    return json.dumps({"job": "j", "version": version, "active": active, "delays": delays}).encode()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer(answer(200, decision({"1": 0.02})))
    yield srv
    srv.close()


def make_client(url: str, rank: int = 1, **kwargs: Any) -> PacingClient:
    kwargs.setdefault("max_delay_s", 0.05)
    kwargs.setdefault("poll_interval_s", POLL_S)
    return PacingClient(url, "j", rank, **kwargs)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def started() -> Iterator[list[PacingClient]]:
    clients: list[PacingClient] = []
    yield clients
    for client in clients:
        client.stop()


def start(clients: list[PacingClient], client: PacingClient) -> PacingClient:
    clients.append(client)
    client.start()
    return client


# ------------------------------------------------------------------ happy path


def test_reads_its_rank_and_caps_it(server: ScriptedServer, started: list[PacingClient]) -> None:
    server.behaviour = answer(200, decision({"0": 0.001, "1": 0.04}))
    capped = start(started, make_client(server.url, rank=1, max_delay_s=0.01))
    other = start(started, make_client(server.url, rank=0))
    absent = start(started, make_client(server.url, rank=5))
    assert wait_for(lambda: capped.current_delay() == (0.01, 7))
    assert wait_for(lambda: other.current_delay() == (0.001, 7))
    assert wait_for(lambda: absent.polls_ok > 0)
    assert absent.current_delay() == (0.0, 7)
    path = server.requests[0]
    assert path is not None


def test_inactive_decision_means_no_delay(
    server: ScriptedServer, started: list[PacingClient]
) -> None:
    server.behaviour = answer(200, decision({"1": 0.02}, active=False, version=3))
    client = start(started, make_client(server.url))
    assert wait_for(lambda: client.polls_ok > 0)
    assert client.current_delay() == (0.0, 3)


def test_against_the_real_pacer_with_token() -> None:
    from skewtrace._options import HostPort
    from skewtrace.controller.config import PacerConfig
    from skewtrace.controller.service import PacerService

    any_port = HostPort("127.0.0.1", 0)
    svc = PacerService(PacerConfig(otlp_grpc=any_port, http=any_port, token="tok"))
    svc.start()
    url = f"http://127.0.0.1:{svc.http_port}"
    good = make_client(url, token="tok")
    bad = make_client(url, token="nope")
    try:
        good.start()
        bad.start()
        assert wait_for(lambda: good.polls_ok > 0 and bad.polls_failed > 0)
        assert good.current_delay() == (0.0, 0)  # unknown job: inactive answer, version 0
        assert bad.polls_ok == 0
    finally:
        good.stop()
        bad.stop()
        svc.stop()


# ------------------------------------------------------------------ fail open


@pytest.mark.parametrize(
    ("name", "behaviour"),
    [
        ("http_500", answer(500, b'{"error": "boom"}')),
        ("http_401", answer(401, b"{}")),
        ("garbage", answer(200, b"\x00not json{")),
        ("json_array", answer(200, b"[1, 2]")),
        ("missing_version", answer(200, b'{"active": true, "delays": {"1": 0.02}}')),
        ("string_delay", answer(200, decision({"1": "0.02"}))),
        ("nan_delay", answer(200, b'{"version": 1, "active": true, "delays": {"1": NaN}}')),
        ("bool_active_missing", answer(200, b'{"version": 1, "delays": {"1": 0.02}}')),
    ],
)
def test_bad_answers_fail_open(
    name: str,
    behaviour: Callable[[BaseHTTPRequestHandler], None],
    server: ScriptedServer,
    started: list[PacingClient],
) -> None:
    client = start(started, make_client(server.url))
    assert wait_for(lambda: client.current_delay()[0] == 0.02)  # a good answer first
    server.behaviour = behaviour
    assert wait_for(lambda: client.polls_failed > 0)
    assert client.current_delay()[0] == 0.0, name


@pytest.mark.slow
def test_unreachable_pacer_logs_once_backs_off_and_recovers(
    caplog: pytest.LogCaptureFixture, started: list[PacingClient]
) -> None:
    caplog.set_level(logging.INFO, logger="skewtrace.rank.pacing_client")
    srv = ScriptedServer(answer(500, b"{}"))
    try:
        client = start(started, make_client(srv.url, max_backoff_s=0.4))
        assert wait_for(lambda: len(srv.requests) >= 8, timeout=15)
        gaps = [b[0] - a[0] for a, b in zip(srv.requests, srv.requests[1:], strict=False)]
        # The waits the client chose: 0.05, 0.1, 0.2, 0.4 (capped), 0.4, ...: growing, then
        # bounded (uncapped the seventh would be 3.2 s). What the clock shows depends on the
        # machine (a loaded one only lengthens the gaps between requests), so the waits are
        # checked as chosen, and the gaps only as at least as long.
        waits = list(client.retry_waits)[: len(gaps)]
        assert waits[:5] == pytest.approx([POLL_S, 2 * POLL_S, 4 * POLL_S, 0.4, 0.4]), waits
        assert all(w == pytest.approx(0.4) for w in waits[3:]), waits
        assert all(g >= 0.95 * w for g, w in zip(gaps, waits, strict=False)), (gaps, waits)
        warnings = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "skewtrace.rank.pacing_client"
        ]
        assert len(warnings) == 1 and "unusable" in warnings[0].getMessage()
        assert client.current_delay() == (0.0, 0)

        srv.behaviour = answer(200, decision({"1": 0.02}))
        assert wait_for(lambda: client.current_delay() == (0.02, 7))
        # The answer is stored, then the recovery logged: on a busy machine the check above
        # can run between the two (it did beside a CPU hog).
        assert wait_for(lambda: any("reachable again" in r.getMessage() for r in caplog.records))
    finally:
        srv.close()


def test_nothing_listening(started: list[PacingClient]) -> None:
    client = start(started, make_client(f"http://127.0.0.1:{free_port()}"))
    assert wait_for(lambda: client.polls_failed >= 2)
    assert client.current_delay() == (0.0, 0)


def test_slow_pacer_never_blocks_current_delay(started: list[PacingClient]) -> None:
    release = threading.Event()
    good = answer(200, decision({"1": 0.02}))
    hang_next = threading.Event()

    def behaviour(handler: BaseHTTPRequestHandler) -> None:
        if hang_next.is_set():
            release.wait(10)
        good(handler)

    srv = ScriptedServer(behaviour)
    try:
        client = start(
            started,
            make_client(srv.url, request_timeout_s=10.0, stale_after_s=0.3),
        )
        assert wait_for(lambda: client.current_delay()[0] == 0.02)
        hang_next.set()
        calls, worst = 0, 0.0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            began = time.perf_counter()
            seconds, _ = client.current_delay()
            worst = max(worst, time.perf_counter() - began)
            calls += 1
            time.sleep(0.001)
        # The poll is hung the whole time; the answer went stale after 0.3 s -> 0.
        assert seconds == 0.0
        # A current_delay that waited on the hung poll would take its 10 s. The bound is far
        # above a lookup (microseconds) so that a busy machine descheduling this thread for a
        # few milliseconds does not fail it (an earlier 5 ms bound was wall-clock luck).
        assert worst < 0.5, f"current_delay took {worst * 1e3:.2f} ms"
        assert calls > 20
    finally:
        release.set()
        srv.close()


def test_stop_is_prompt_and_leaves_no_delay(
    server: ScriptedServer, started: list[PacingClient]
) -> None:
    client = make_client(server.url, poll_interval_s=30.0)
    client.start()
    assert wait_for(lambda: client.polls_ok > 0)
    began = time.monotonic()
    client.stop()
    # A stop that waited out the poll interval would take 30 s.
    assert time.monotonic() - began < 10.0
    assert client.current_delay() == (0.0, 7)


def test_bearer_header_is_sent(server: ScriptedServer, started: list[PacingClient]) -> None:
    client = start(started, make_client(server.url, token="abc"))
    assert wait_for(lambda: client.polls_ok > 0)
    assert server.requests[0][1].get("Authorization") == "Bearer abc"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"url": "127.0.0.1:4320"}, "http"),
        ({"max_delay_s": -1.0}, "max_delay_s"),
        ({"poll_interval_s": 0.0}, "poll_interval_s"),
        ({"job_id": ""}, "job_id"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], needle: str) -> None:
    args: dict[str, Any] = {
        "url": "http://127.0.0.1:1",
        "job_id": "j",
        "rank": 0,
        "max_delay_s": 0.05,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=needle):
        PacingClient(args.pop("url"), args.pop("job_id"), args.pop("rank"), **args)


def test_parse_decision_clamps_negative() -> None:
    body = {"version": 2, "active": True, "delays": {"0": -0.5}}
    assert parse_decision(body, 0, 0.05) == (0.0, 2)


# ------------------------------------------------------------------ apply_delay


def test_apply_delay_sleeps_on_cpu() -> None:
    began = time.perf_counter()
    apply_delay(0.02)
    elapsed = time.perf_counter() - began
    assert 0.019 <= elapsed < 2.0
    # Nothing to sleep: no sleep at all (inf would never return; the bound leaves a busy
    # machine's scheduling noise room).
    for nothing in (0.0, -1.0, float("nan"), float("inf")):
        began = time.perf_counter()
        apply_delay(nothing)
        assert time.perf_counter() - began < 0.5


def test_apply_delay_on_a_cpu_torch_device_sleeps() -> None:
    torch = pytest.importorskip("torch")
    began = time.perf_counter()
    apply_delay(0.01, torch.device("cpu"))
    assert time.perf_counter() - began >= 0.0095


@pytest.mark.parametrize(
    ("seconds", "clock_khz", "expected"),
    [
        (0.001, 1_980_000, [1_980_000]),  # H100/H200 boost clock: 1.98 GHz
        (0.01, 1_410_000, [14_100_000]),  # A100: 1.41 GHz
        (0.05, 1_980_000, [20_000_000] * 4 + [19_000_000]),  # split into bounded kernels
        (0.02, 1_000_000, [20_000_000]),  # exactly one full kernel, no empty remainder
        (0.0, 1_980_000, []),
        (-0.01, 1_980_000, []),
        (float("nan"), 1_980_000, []),
        (0.01, 0, []),
    ],
)
def test_cuda_sleep_cycles(seconds: float, clock_khz: int, expected: list[int]) -> None:
    assert cuda_sleep_cycles(seconds, clock_khz) == expected


def test_cuda_delay_without_a_gpu_is_swallowed() -> None:
    """No GPU here: a cuda device object makes torch.cuda raise, which must not escape."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; this checks the no-GPU failure path")
    began = time.perf_counter()
    apply_delay(2.0, torch.device("cuda", 0))
    # it neither raised nor fell back to blocking the host for the delay (a 2 s delay against
    # a 1 s bound: torch.cuda's first failing call alone can take tens of milliseconds)
    assert time.perf_counter() - began < 1.0


# ------------------------------------------------------------------ shares (--policy rebalance)


def test_shares_are_read_alongside_the_delay(
    server: ScriptedServer, started: list[PacingClient]
) -> None:
    body = {
        "job": "j",
        "version": 9,
        "active": True,
        "delays": {"1": 0.02},
        "shares": {"0": 0.1, "1": 0.3, "2": 0.3, "3": 0.3},
        "shares_version": 2,
        "policy": "pacing,rebalance",
    }
    server.behaviour = answer(200, json.dumps(body).encode())
    client = start(started, make_client(server.url, rank=0))
    assert wait_for(lambda: client.current_shares()[0] is not None)
    assert client.current_shares() == ({0: 0.1, 1: 0.3, 2: 0.3, 3: 0.3}, 2)
    assert client.current_delay() == (0.0, 9)


def test_shares_fail_open_to_equal(server: ScriptedServer, started: list[PacingClient]) -> None:
    good = {"version": 3, "active": True, "delays": {"1": 0.02}, "shares": {"0": 0.4, "1": 0.6}}
    server.behaviour = answer(200, json.dumps(good).encode())
    client = start(started, make_client(server.url, stale_after_s=0.5))
    assert wait_for(lambda: client.current_shares()[0] == {0: 0.4, 1: 0.6})
    # Malformed shares cost the shares, never the delay.
    bad = {**good, "shares": {"0": "lots", "1": 0.6}}
    server.behaviour = answer(200, json.dumps(bad).encode())
    assert wait_for(lambda: client.current_shares()[0] is None)
    assert client.current_delay()[0] == 0.02
    # A failing pacer: no shares (equal), as no delay.
    server.behaviour = answer(200, json.dumps(good).encode())
    assert wait_for(lambda: client.current_shares()[0] is not None)
    server.behaviour = answer(500, b"{}")
    assert wait_for(lambda: client.current_shares()[0] is None)
    client.stop()
    assert client.current_shares()[0] is None
