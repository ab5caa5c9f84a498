"""The pacer service over real sockets: OTLP/gRPC metrics in, HTTP decisions out.

Requests are built from the generated opentelemetry-proto messages and sent with a real grpc
channel to the service's real gRPC server; decisions are read with urllib from its real HTTP
server. The service's clock is injected (a fake monotonic clock the test advances) and the
decision loop is driven with ``tick(now)``, so scenarios that take tens of seconds of
"job time" run in well under a second.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from conftest import free_port
from skewtrace import semconv
from skewtrace._options import FieldError, HostPort
from skewtrace.controller.config import PacerConfig
from skewtrace.controller.policies import job_policies, job_policy_entries
from skewtrace.controller.policies.pacing import PolicyParams
from skewtrace.controller.service import PacerService
from skewtrace.controller.state import JobWindows
from skewtrace.decision import BODY_VERSION

ANY_PORT = HostPort("127.0.0.1", 0)
CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
START_NS = 1_700_000_000_000_000_000
BOUNDS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _kv(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _bucket_of(value: float) -> int:
    return next((i for i, b in enumerate(BOUNDS) if value <= b), len(BOUNDS))


def _buckets(count: int, total: float) -> list[int]:
    """All observations in the bucket of their mean (for points whose buckets do not matter)."""
    counts = [0] * (len(BOUNDS) + 1)
    counts[_bucket_of(total / count if count else 0.0)] = count
    return counts


def histogram(
    name: str,
    temporality: int,
    points: list[tuple[dict[str, str | int], int, float]]
    | list[tuple[dict[str, str | int], int, float, list[int]]],
    start_ns: int = START_NS,
) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=name, unit="s")
    metric.histogram.aggregation_temporality = temporality
    for attrs, count, total, *buckets in points:
        point = metric.histogram.data_points.add(
            start_time_unix_nano=start_ns,
            time_unix_nano=start_ns + 1,
            count=count,
            sum=total,
            explicit_bounds=BOUNDS,
            bucket_counts=buckets[0] if buckets else _buckets(count, total),
        )
        point.attributes.extend(_kv(k, v) for k, v in attrs.items())
    return metric


def request(*metrics: metrics_pb2.Metric) -> metrics_service_pb2.ExportMetricsServiceRequest:
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    rm = req.resource_metrics.add(
        resource=Resource(attributes=[_kv(semconv.SERVICE_NAME, "otelcol-skewtrace")])
    )
    rm.scope_metrics.add().metrics.extend(metrics)
    return req


@dataclass
class SimulatedJob:
    """Per-rank running totals of what the barrierskew connector would have counted.

    Each step has ``collectives_per_step`` collectives; with ``overlapping`` (DDP's async
    gradient buckets) the early ranks wait for the late one at every one of them at once,
    otherwise the first collective absorbs the whole wait and the others see none.
    """

    job_id: str
    world: int = 4
    step_s: float = 0.130
    late_rank: int | None = 3
    lateness_s: float = 0.030
    collectives_per_step: int = 3
    overlapping: bool = False
    applies_delays: bool = True
    """Closed loop: the ranks apply the pacer's delays (as PacingClient would)."""
    paced_effect: float = 0.0
    """What the delays do to the step time: while any is applied the step is this fraction
    shorter (negative: longer), as pacing that keeps traffic apart would (or would not)."""
    delays: dict[int, float] = field(default_factory=dict)
    totals: dict[tuple[str, int], list[Any]] = field(default_factory=dict)

    def _add(self, metric: str, rank: int, values: list[float], steps: int) -> None:
        total = self.totals.setdefault((metric, rank), [0, 0.0, [0] * (len(BOUNDS) + 1)])
        for value in values:
            total[0] += steps
            total[1] += steps * value
            total[2][_bucket_of(value)] += steps

    def run_steps(self, steps: int) -> None:
        applied = self.delays if self.applies_delays else {}
        least = min((applied.get(r, 0.0) for r in range(self.world)), default=0.0)
        for rank in range(self.world):
            late = self.late_rank is not None
            delay = applied.get(rank, 0.0)
            if not late:
                wait, lateness = 0.0, 0.0
            elif rank == self.late_rank:
                wait, lateness = 0.0, self.lateness_s - least
            else:  # an early rank: its delay moves it toward the late one
                wait, lateness = max(0.0, self.lateness_s - delay), delay - least
            n = self.collectives_per_step
            rest = [wait] * (n - 1) if self.overlapping else [0.0] * (n - 1)
            rest_late = [lateness] * (n - 1) if self.overlapping else [0.0] * (n - 1)
            paced = any(d > 0 for d in applied.values())
            step_s = self.step_s * (1 - self.paced_effect) if paced else self.step_s
            self._add(semconv.METRIC_STEP_DURATION, rank, [step_s], steps)
            self._add(semconv.METRIC_RANK_WAIT, rank, [wait, *rest], steps)
            self._add(semconv.METRIC_RANK_LATENESS, rank, [lateness, *rest_late], steps)

    def export(self, temporality: int, previous: dict[Any, list[Any]] | None = None) -> Any:
        metrics = []
        for metric in (
            semconv.METRIC_STEP_DURATION,
            semconv.METRIC_RANK_WAIT,
            semconv.METRIC_RANK_LATENESS,
        ):
            points = []
            for rank in range(self.world):
                empty = [0, 0.0, [0] * (len(BOUNDS) + 1)]
                count, total, buckets = self.totals.get((metric, rank), empty)
                if temporality == DELTA and previous is not None:
                    before = previous.get((metric, rank), empty)
                    count, total = count - before[0], total - before[1]
                    buckets = [a - b for a, b in zip(buckets, before[2], strict=True)]
                attrs: dict[str, str | int] = {
                    semconv.JOB_ID: self.job_id,
                    semconv.RANK: rank,
                    semconv.HOST_NAME: f"node{rank // 2}",
                    semconv.SWITCH: "leaf0",
                    semconv.NIC: "eth0",
                }
                points.append((attrs, int(count), total, list(buckets)))
            metrics.append(histogram(metric, temporality, points))
        return request(*metrics)

    def snapshot(self) -> dict[Any, list[Any]]:
        return {k: [v[0], v[1], list(v[2])] for k, v in self.totals.items()}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


def _start(
    clock: FakeClock, reader: InMemoryMetricReader | None = None, **overrides: Any
) -> PacerService:
    """A service the test ticks itself. Without ``policy_params`` pacing has no effect guard
    (``effect_pairs=0``): these tests drive a job for seconds to check the service's
    mechanics, and the guard withholds a policy's first 10 s; the guard through the service
    is ``test_pacing_is_kept_where_it_pays_and_backs_off_where_it_does_not``."""
    overrides.setdefault("policy_params", (PolicyParams(effect_pairs=0),))
    config = PacerConfig(
        otlp_grpc=ANY_PORT,
        http=ANY_PORT,
        decision_interval_s=3600.0,  # the test drives tick(now) itself
        **overrides,
    )
    provider = MeterProvider(metric_readers=[reader]) if reader else MeterProvider()
    service = PacerService(config, meter_provider=provider, clock=clock)
    service.start()
    return service


@pytest.fixture
def service(clock: FakeClock, reader: InMemoryMetricReader) -> Iterator[PacerService]:
    svc = _start(clock, reader, job_timeout_s=30.0)
    yield svc
    svc.stop()


@pytest.fixture
def stub(service: PacerService) -> Iterator[metrics_service_pb2_grpc.MetricsServiceStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{service.otlp_port}")
    yield metrics_service_pb2_grpc.MetricsServiceStub(channel)
    channel.close()


def get(service: PacerService, path: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://127.0.0.1:{service.http_port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def drive(
    service: PacerService,
    stub: metrics_service_pb2_grpc.MetricsServiceStub,
    clock: FakeClock,
    jobs: list[SimulatedJob],
    seconds: float,
    temporality: int = CUMULATIVE,
) -> None:
    """Run the jobs for ``seconds``: 1 s flushes from the 'collector', 0.5 s decision ticks."""
    previous = {job.job_id: job.snapshot() for job in jobs}
    for half_second in range(int(seconds * 2)):
        clock.now += 0.5
        for job in jobs:
            job.run_steps(4)  # ~130 ms steps
        if half_second % 2 == 1:
            for job in jobs:
                response = stub.Export(job.export(temporality, previous[job.job_id]), timeout=5)
                assert response.partial_success.rejected_data_points == 0
                previous[job.job_id] = job.snapshot()
        service.tick()
        for job in jobs:
            body = service.decision_body(job.job_id) or {}
            job.delays = {int(r): v for r, v in body.get("delays", {}).items()}


# ------------------------------------------------------------------ decisions


@pytest.mark.parametrize("overlapping", [False, True], ids=["sequential", "overlapping"])
@pytest.mark.parametrize("temporality", [CUMULATIVE, DELTA], ids=["cumulative", "delta"])
def test_straggler_job_is_paced_over_grpc_and_http(
    service: PacerService, stub: Any, clock: FakeClock, temporality: int, overlapping: bool
) -> None:
    """The same 30 ms per step whether one collective absorbs it or three overlap on it."""
    job = SimulatedJob("job-a", overlapping=overlapping)
    status, body = get(service, "/v1/pacing?job=job-a")
    assert status == 200 and body == {
        "job": "job-a",
        "version": 0,
        "active": False,
        "delays": {},
        "body_version": BODY_VERSION,
    }

    drive(service, stub, clock, [job], 10.0, temporality)
    status, body = get(service, "/v1/pacing?job=job-a")
    assert status == 200
    assert body["active"] is True
    assert body["version"] >= 1
    assert set(body["delays"]) == {"0", "1", "2"}, body  # never the late rank
    for delay in body["delays"].values():
        # the ranks apply their delays: d = 0.5 * (30 ms - d) settles at 10 ms
        assert 0.008 < delay <= 0.0115
    # the natural spread still sees the whole 30 ms (applied delays added back)
    assert body["spread"] == pytest.approx(0.030 / 0.130, rel=0.15)


def _drive_slow_steps(
    service: PacerService,
    stub: Any,
    clock: FakeClock,
    job: SimulatedJob,
    seconds: float,
    period_s: float,
) -> list[dict[str, Any]]:
    """One step every ``period_s`` seconds, 1 s flushes, 0.5 s decision ticks; returns the
    decision bodies seen."""
    previous, bodies = job.snapshot(), []
    ticks_per_step = round(period_s / 0.5)
    for tick in range(int(seconds * 2)):
        clock.now += 0.5
        if tick % ticks_per_step == ticks_per_step - 1:
            job.run_steps(1)
        if tick % 2 == 1:
            stub.Export(job.export(CUMULATIVE, previous), timeout=5)
            previous = job.snapshot()
        service.tick()
        body = service.decision_body(job.job_id) or {}
        job.delays = {int(r): v for r, v in body.get("delays", {}).items()}
        bodies.append(body)
    return bodies


@pytest.mark.parametrize(
    ("window_steps", "step_s", "lateness_s"),
    [(4, 5.0, 1.0), (4, 0.2, 0.04), (1, 5.0, 1.0)],
    ids=["long-steps", "short-steps-far-apart", "fixed-window"],
)
def test_a_job_with_long_steps_is_judged(
    clock: FakeClock, window_steps: int, step_s: float, lateness_s: float
) -> None:
    """One step every 5 s (a large model's) against the default 4 s window and min_steps 3:
    the window stretches to hold 4 steps (20 s) and the rank timeout with it, so the job is
    judged and paced, whether the steps themselves last 5 s or 0.2 s with pauses between
    them (the step period is also read from how far apart the steps arrive). With the window
    held at 4 s (window_steps 1, the behaviour before) a window never holds 3 steps and each
    rank drops out between two steps: never paced."""
    job = SimulatedJob("slow-steps", step_s=step_s, lateness_s=lateness_s)
    service = _start(clock, window_steps=window_steps)
    channel = grpc.insecure_channel(f"127.0.0.1:{service.otlp_port}")
    try:
        bodies = _drive_slow_steps(
            service, metrics_service_pb2_grpc.MetricsServiceStub(channel), clock, job, 60.0, 5.0
        )
    finally:
        channel.close()
        service.stop()
    paced = [b for b in bodies if b.get("active") and b.get("delays")]
    if window_steps == 1:
        assert not paced, paced[:1]
        return
    assert paced, bodies[-1]
    assert set(paced[-1]["delays"]) == {"0", "1", "2"}, paced[-1]  # never the late rank
    assert paced[-1]["spread"] == pytest.approx(lateness_s / step_s, rel=0.2)


def test_a_stretched_window_is_bounded() -> None:
    """The window holds window_steps of the job's steps, never less than window_s nor more
    than max_window_s; the step period is smoothed from the step-duration deltas."""
    windows = JobWindows(4.0, 600.0, window_steps=4, max_window_s=30.0)
    job = SimulatedJob("bounded", step_s=0.1)
    job.run_steps(10)
    windows.ingest_request(job.export(CUMULATIVE).resource_metrics, now=1.0)
    assert windows.stretch_s("bounded") == 0.0  # 4 x 0.1 s < 4 s
    slow = SimulatedJob("slower", step_s=3.0)
    slow.run_steps(2)
    windows.ingest_request(slow.export(CUMULATIVE).resource_metrics, now=1.0)
    assert windows.stretch_s("slower") == pytest.approx(4 * 3.0 - 4.0)
    slowest = SimulatedJob("slowest", step_s=20.0)
    slowest.run_steps(1)
    windows.ingest_request(slowest.export(CUMULATIVE).resource_metrics, now=1.0)
    assert windows.stretch_s("slowest") == pytest.approx(30.0 - 4.0)
    assert windows.stretch_s("unknown") == 0.0
    # Short steps that arrive 2.5 s apart: the period is the time between them.
    apart = SimulatedJob("apart", step_s=0.1)
    for at in (1.0, 3.5, 6.0):
        apart.run_steps(1)
        windows.ingest_request(apart.export(CUMULATIVE).resource_metrics, now=at)
    assert windows.stretch_s("apart") == pytest.approx(4 * 2.5 - 4.0)
    with pytest.raises(ValueError, match="max_window_s"):
        JobWindows(4.0, 600.0, max_window_s=2.0)


def test_job_that_does_not_apply_its_delays_is_no_longer_paced(
    service: PacerService, stub: Any, clock: FakeClock
) -> None:
    job = SimulatedJob("deaf", applies_delays=False)
    drive(service, stub, clock, [job], 4.0)
    first = get(service, "/v1/pacing?job=deaf")[1]
    assert first["active"] and first["delays"]
    drive(service, stub, clock, [job], 10.0)
    later = get(service, "/v1/pacing?job=deaf")[1]
    assert later["active"] is True and later["delays"] == {}
    assert later["reason"] == "ineffective"


def test_cumulative_and_delta_give_the_same_decisions(clock: FakeClock) -> None:
    answers = []
    for temporality in (CUMULATIVE, DELTA):
        clock.now = 1000.0
        svc = _start(clock)
        channel = grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
        try:
            stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
            drive(svc, stub, clock, [SimulatedJob("j")], 8.0, temporality)
            _, body = get(svc, "/v1/pacing?job=j")
            answers.append((body["active"], body["version"], body["delays"]))
        finally:
            channel.close()
            svc.stop()
    assert answers[0] == answers[1]
    assert answers[0][0] is True


def test_jobs_are_independent_and_forgotten_after_timeout(
    service: PacerService, stub: Any, clock: FakeClock
) -> None:
    unstable, stable = SimulatedJob("unstable"), SimulatedJob("stable", late_rank=None)
    drive(service, stub, clock, [unstable, stable], 10.0)
    assert get(service, "/v1/pacing?job=unstable")[1]["active"] is True
    stable_body = get(service, "/v1/pacing?job=stable")[1]
    assert stable_body["active"] is False and stable_body["delays"] == {}
    assert sorted(get(service, "/v1/jobs")[1]["jobs"]) == ["stable", "unstable"]

    # "unstable" stops reporting; "stable" goes on
    previous = stable.snapshot()
    for _ in range(40):  # 40 s > job_timeout_s (30)
        clock.now += 1.0
        stable.run_steps(8)
        stub.Export(stable.export(CUMULATIVE, previous), timeout=5)
        service.tick()
    assert get(service, "/v1/jobs")[1]["jobs"] == ["stable"]
    body = get(service, "/v1/pacing?job=unstable")[1]
    assert body == {
        "job": "unstable",
        "version": 0,
        "active": False,
        "delays": {},
        "body_version": BODY_VERSION,
    }


def test_pacing_turns_off_when_the_straggler_recovers(
    service: PacerService, stub: Any, clock: FakeClock
) -> None:
    job = SimulatedJob("recovering")
    drive(service, stub, clock, [job], 10.0)
    on = get(service, "/v1/pacing?job=recovering")[1]
    assert on["active"] is True
    job.late_rank = None
    drive(service, stub, clock, [job], 10.0)
    off = get(service, "/v1/pacing?job=recovering")[1]
    assert off["active"] is False and off["delays"] == {}
    assert off["version"] > on["version"]


def test_counter_reset_is_not_a_negative_delta(
    service: PacerService, stub: Any, clock: FakeClock
) -> None:
    job = SimulatedJob("restarted")
    drive(service, stub, clock, [job], 6.0)
    # The collector restarts: new start time, totals from zero.
    job.totals.clear()
    job.run_steps(8)
    req = job.export(CUMULATIVE)
    for metric in req.resource_metrics[0].scope_metrics[0].metrics:
        for point in metric.histogram.data_points:
            point.start_time_unix_nano = START_NS + 10**12
    stub.Export(req, timeout=5)
    health = get(service, "/healthz")[1]
    assert health["resets"] == 12  # 3 metrics x 4 ranks
    service.tick()
    body = get(service, "/v1/pacing?job=restarted")[1]
    assert all(0 <= d <= 0.05 for d in body["delays"].values())


# ------------------------------------------------------------------ bad input


def test_bad_points_are_counted_rejected_and_ignored(
    service: PacerService, stub: Any, clock: FakeClock
) -> None:
    good = {semconv.JOB_ID: "j", semconv.RANK: 0}
    no_rank = {semconv.JOB_ID: "j"}
    no_job = {semconv.RANK: 1}
    bad_rank = {semconv.JOB_ID: "j", semconv.RANK: "three"}
    wait_as_gauge = metrics_pb2.Metric(name=semconv.METRIC_RANK_WAIT)
    wait_as_gauge.gauge.data_points.add(as_double=1.0)
    req = request(
        histogram(
            semconv.METRIC_RANK_WAIT,
            CUMULATIVE,
            [(good, 3, 0.01), (no_rank, 3, 0.01), (no_job, 3, 0.01), (bad_rank, 1, 0.0)],
        ),
        histogram(semconv.METRIC_STEP_DURATION, CUMULATIVE, [(good, 1, float("nan"))]),
        histogram(semconv.METRIC_STEP_DURATION, 0, [(good, 1, 0.1)]),  # unspecified temporality
        histogram("some.other.metric", CUMULATIVE, [(good, 1, 0.1), (good, 2, 0.2)]),
        histogram(semconv.METRIC_BARRIER_SKEW, CUMULATIVE, [(good, 1, 0.1)]),
        wait_as_gauge,
    )
    response = stub.Export(req, timeout=5)
    assert response.partial_success.rejected_data_points == 6
    assert "dropped" in response.partial_success.error_message
    health = get(service, "/healthz")[1]
    assert health["points_accepted"] == 1
    assert health["points_invalid"] == 6
    assert health["points_unknown_metric"] == 2
    assert health["points_unused"] == 1

    # A request that is not protobuf at all: INVALID_ARGUMENT, counted, server still serves.
    channel = grpc.insecure_channel(f"127.0.0.1:{service.otlp_port}")
    raw = channel.unary_unary(
        "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff\xff garbage", timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    assert get(service, "/healthz")[1]["otlp_requests_undecodable"] == 1
    service.tick()
    assert get(service, "/healthz")[0] == 200


def test_http_errors(service: PacerService) -> None:
    assert get(service, "/v1/pacing")[0] == 400
    assert get(service, "/v1/pacing?job=a&job=b")[0] == 400
    assert get(service, "/v1/pacing?job=" + "x" * 300)[0] == 400
    status, body = get(service, "/nope")
    assert status == 404 and "error" in body


def test_bearer_token(clock: FakeClock) -> None:
    svc = _start(clock, token="s3cret")
    try:
        assert get(svc, "/v1/pacing?job=j")[0] == 401
        assert get(svc, "/v1/pacing?job=j", token="wrong")[0] == 401
        assert get(svc, "/v1/jobs")[0] == 401
        assert get(svc, "/v1/pacing?job=j", token="s3cret")[0] == 200
        assert get(svc, "/healthz")[0] == 200  # liveness stays open
    finally:
        svc.stop()


# ------------------------------------------------------------------ own metrics


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def test_own_metrics(
    service: PacerService, stub: Any, clock: FakeClock, reader: InMemoryMetricReader
) -> None:
    drive(service, stub, clock, [SimulatedJob("m"), SimulatedJob("calm", late_rank=None)], 10.0)
    points = _points(reader)
    active = {p.attributes[semconv.JOB_ID]: p.value for p in points["skewtrace.pacing.active"]}
    assert active == {"m": 1, "calm": 0}
    delays = {
        (p.attributes[semconv.JOB_ID], p.attributes[semconv.RANK]): p.value
        for p in points["skewtrace.pacing.delay"]
    }
    assert set(delays) == {("m", 0), ("m", 1), ("m", 2)}
    assert all(0 < v <= 0.05 for v in delays.values())
    decisions = {
        p.attributes[semconv.JOB_ID]: p.value for p in points["skewtrace.pacing.decisions"]
    }
    # one per job per 0.5 s tick, from the first export (1 s into the 10 s) on
    assert decisions == {"m": 19, "calm": 19}


@pytest.mark.slow
def test_unreachable_metrics_endpoint_does_not_hurt(clock: FakeClock) -> None:
    """Own metrics to a port nobody listens on: decisions are still served, stop is bounded."""
    config = PacerConfig(
        otlp_grpc=ANY_PORT,
        http=ANY_PORT,
        decision_interval_s=0.05,
        metrics_endpoint=f"127.0.0.1:{free_port()}",
        metrics_interval_s=0.1,
    )
    svc = PacerService(config)  # the real SDK provider with the OTLP exporter
    svc.start()
    try:
        time.sleep(0.5)
        assert get(svc, "/healthz")[0] == 200
        assert get(svc, "/v1/pacing?job=x")[1]["active"] is False
    finally:
        started = time.monotonic()
        svc.stop()
        assert time.monotonic() - started < 8.0


# ------------------------------------------------------------------ the console script


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skewtrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--window-millis", "0"], {}, "--window-millis='0': must be a positive number"),
        (["--http", "localhost"], {}, "--http='localhost': expected HOST:PORT"),
        ([], {"SKEWTRACE_PACER_GAIN": "2"}, "--gain (from SKEWTRACE_PACER_GAIN)='2': must be in"),
        (
            ["--activate-threshold", "0.05", "--deactivate-threshold", "0.1"],
            {},
            "--deactivate-threshold='0.1': must be lower than --activate-threshold",
        ),
        (
            ["--activate-threshold", "0.04"],
            {},
            "--deactivate-threshold (default 0.05): must be lower than --activate-threshold",
        ),
        (["--log-level", "loud"], {}, "--log-level='loud': must be one of"),
        # The deprecated names (seconds) are still checked, under the name that was used.
        (["--window-s", "-1"], {}, "--window-s='-1': must be a positive number"),
        (
            [],
            {"SKEWTRACE_PACER_MAX_DELAY": "x"},
            "--max-delay-millis (from SKEWTRACE_PACER_MAX_DELAY)='x': expected a number",
        ),
    ],
)
def test_cli_bad_config_exits_2_naming_the_flag(
    args: list[str], env: dict[str, str], needle: str
) -> None:
    result = _cli("pacer", *args, env=env)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr


def test_cli_serves_and_stops_on_sigterm() -> None:
    http_port, otlp_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "skewtrace.cli", "pacer", "--otlp-grpc", f"127.0.0.1:{otlp_port}"],
        env={**os.environ, "SKEWTRACE_PACER_HTTP": f"127.0.0.1:{http_port}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        body = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{http_port}/healthz", timeout=1
                ) as r:
                    body = json.loads(r.read())
                    break
            except OSError:
                time.sleep(0.2)
        assert body is not None and body["status"] == "ok"
        channel = grpc.insecure_channel(f"127.0.0.1:{otlp_port}")
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        stub.Export(SimulatedJob("cli").export(CUMULATIVE), timeout=5)
        channel.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert "pacer listening" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_policy_params_reach_the_service(clock: FakeClock) -> None:
    svc = _start(clock, policy_params=(PolicyParams(max_delay_s=0.004, effect_pairs=0),))
    channel = grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
    try:
        drive(
            svc,
            metrics_service_pb2_grpc.MetricsServiceStub(channel),
            clock,
            [SimulatedJob("capped")],
            8.0,
        )
        body = get(svc, "/v1/pacing?job=capped")[1]
        assert body["active"] is True
        assert body["delays"] and all(d <= 0.004 for d in body["delays"].values())
    finally:
        channel.close()
        svc.stop()


def test_window_typical_wait_ignores_one_stall() -> None:
    """Four deliveries a second apart, 10 steps each: 1 ms of wait per step, except one
    delivery in which another rank's 150 ms stall made this one wait once. The mean per step
    rises to ~4.7 ms; the typical wait (median over the window's quarters) stays at 1 ms."""
    windows = JobWindows(window_s=4.0, job_timeout_s=60.0)
    attrs: dict[str, str | int] = {semconv.JOB_ID: "j", semconv.RANK: 0}
    for i, wait in enumerate([0.010, 0.010, 0.010 + 0.150, 0.010]):
        req = request(
            histogram(semconv.METRIC_STEP_DURATION, DELTA, [(attrs, 10, 1.0)]),
            histogram(semconv.METRIC_RANK_WAIT, DELTA, [(attrs, 10, wait)]),
        )
        assert windows.ingest_request(req.resource_metrics, now=10.0 + i) == 0
    rank = windows.window("j", now=13.5).ranks[0]
    assert rank.steps == 40
    assert rank.wait_per_step_s == pytest.approx(0.190 / 40)
    assert rank.wait_typical_s == pytest.approx(0.001)


@pytest.mark.parametrize(
    ("waits_per_step", "expected_per_step"),
    [
        ([0.030, 0.0, 0.0], 0.030),  # the first collective absorbs the wait
        ([0.030, 0.030, 0.030], 0.030),  # overlapping buckets wait together: counted once
        ([0.0, 0.0, 0.0], 0.0),
        ([0.020, 0.010, 0.0], 0.015),  # in between: errs low (the true idle time is 20..30 ms)
    ],
)
def test_window_counts_overlapping_waits_once(
    waits_per_step: list[float], expected_per_step: float
) -> None:
    windows = JobWindows(window_s=4.0, job_timeout_s=60.0)
    attrs: dict[str, str | int] = {semconv.JOB_ID: "j", semconv.RANK: 0}
    steps = 20
    buckets = [0] * (len(BOUNDS) + 1)
    for wait in waits_per_step:
        buckets[_bucket_of(wait)] += steps
    req = request(
        histogram(semconv.METRIC_STEP_DURATION, DELTA, [(attrs, steps, steps * 0.1)]),
        histogram(
            semconv.METRIC_RANK_WAIT,
            DELTA,
            [(attrs, steps * len(waits_per_step), steps * sum(waits_per_step), buckets)],
        ),
    )
    assert windows.ingest_request(req.resource_metrics, now=10.0) == 0
    rank = windows.window("j", now=10.5).ranks[0]
    assert rank.steps == steps
    assert rank.wait_per_step_s == pytest.approx(expected_per_step)


def flag_gauge(name: str, attrs: dict[str, str | int], value: float) -> metrics_pb2.Metric:
    metric = metrics_pb2.Metric(name=name, unit="1")
    point = metric.gauge.data_points.add(time_unix_nano=START_NS, as_double=value)
    point.attributes.extend(_kv(k, v) for k, v in attrs.items())
    return metric


def imbalance_gauge(job: str, cause: str, stage: int, value: float) -> metrics_pb2.Metric:
    """The connector's training.imbalance gauge point of one (cause, stage) of a job."""
    return flag_gauge(
        semconv.METRIC_IMBALANCE,
        {semconv.JOB_ID: job, semconv.STRAGGLER_CAUSE: cause, semconv.PIPELINE_STAGE: stage},
        value,
    )


@pytest.mark.parametrize(
    ("cause", "stage"),
    [(semconv.CAUSE_STAGE_IMBALANCE, 3), (semconv.CAUSE_DATA_IMBALANCE, -1)],
)
def test_flagged_imbalance_is_declined_and_said(
    service: PacerService, stub: Any, clock: FakeClock, cause: str, stage: int
) -> None:
    """Issue 21: a stage longer than the others, or data that varies from step to step, is not
    fixed by delaying early ranks. While the Collector flags one, the job is not paced and
    the decision says why; once the gauge goes back to 0, pacing decides as before."""
    job = SimulatedJob("job-i")
    drive(service, stub, clock, [job], 10.0)
    assert (get(service, "/v1/pacing?job=job-i")[1])["active"] is True

    response = stub.Export(request(imbalance_gauge("job-i", cause, stage, 1.0)), timeout=5)
    assert response.partial_success.rejected_data_points == 0
    drive(service, stub, clock, [job], 2.0)
    status, body = get(service, "/v1/pacing?job=job-i")
    assert status == 200
    assert body["active"] is False and body["reason"] == cause, body
    assert not any(body["delays"].values()), body

    stub.Export(request(imbalance_gauge("job-i", cause, stage, 0.0)), timeout=5)
    drive(service, stub, clock, [job], 10.0)
    body = get(service, "/v1/pacing?job=job-i")[1]
    assert body["active"] is True and body["reason"] != cause, body


def test_a_fault_of_the_fabric_is_declined_and_a_compute_flag_is_not(
    service: PacerService, stub: Any, clock: FakeClock
) -> None:
    """Issue 23: a rank late because of its network (the demo's throttled NIC), or a suspected
    part of the fabric, is not fixed by delaying the others: pacing declines while the
    Collector flags one (reason fabric_fault). A rank flagged for its compute is what pacing
    is for: still paced."""
    job = SimulatedJob("job-f")
    drive(service, stub, clock, [job], 10.0)
    rank3 = {semconv.JOB_ID: "job-f", semconv.RANK: 3, semconv.HOST_NAME: "node1"}
    compute = flag_gauge(
        semconv.METRIC_STRAGGLER, {**rank3, semconv.STRAGGLER_CAUSE: semconv.CAUSE_COMPUTE}, 1
    )
    assert stub.Export(request(compute), timeout=5).partial_success.rejected_data_points == 0
    drive(service, stub, clock, [job], 2.0)
    assert get(service, "/v1/pacing?job=job-f")[1]["active"] is True

    network = flag_gauge(
        semconv.METRIC_STRAGGLER, {**rank3, semconv.STRAGGLER_CAUSE: semconv.CAUSE_NETWORK}, 1
    )
    stub.Export(request(network), timeout=5)
    drive(service, stub, clock, [job], 2.0)
    body = get(service, "/v1/pacing?job=job-f")[1]
    assert body["active"] is False and body["reason"] == "fabric_fault", body

    # The rank's network flag clears; a suspected NIC keeps the job declined on its own.
    stub.Export(request(flag_gauge(semconv.METRIC_STRAGGLER, {**rank3,
        semconv.STRAGGLER_CAUSE: semconv.CAUSE_NETWORK}, 0)), timeout=5)  # fmt: skip
    nic = {
        semconv.JOB_ID: "job-f",
        semconv.SUSPECT_KIND: "nic",
        semconv.SUSPECT_NAME: "eth0",
        semconv.HOST_NAME: "node1",
    }
    stub.Export(request(flag_gauge(semconv.METRIC_FABRIC_SUSPECT, nic, 1)), timeout=5)
    drive(service, stub, clock, [job], 2.0)
    assert get(service, "/v1/pacing?job=job-f")[1]["reason"] == "fabric_fault"
    stub.Export(request(flag_gauge(semconv.METRIC_FABRIC_SUSPECT, nic, 0)), timeout=5)
    drive(service, stub, clock, [job], 10.0)
    assert get(service, "/v1/pacing?job=job-f")[1]["active"] is True


def test_bad_imbalance_points_are_rejected(service: PacerService, stub: Any) -> None:
    metric = imbalance_gauge("job-x", "not_a_cause", 0, 1.0)
    response = stub.Export(request(metric), timeout=5)
    assert response.partial_success.rejected_data_points == 1
    wrong_kind = metrics_pb2.Metric(name=semconv.METRIC_IMBALANCE)
    wrong_kind.sum.data_points.add(as_double=1.0)
    assert stub.Export(request(wrong_kind), timeout=5).partial_success.rejected_data_points == 1


def test_pacing_is_kept_where_it_pays_and_backs_off_where_it_does_not(
    clock: FakeClock, reader: InMemoryMetricReader
) -> None:
    """Issue 23, do no harm: two jobs with the same straggler, where the delays shorten the
    step by 10% and where they lengthen it by 5%. Over three paced/unpaced pairs of 5 s
    phases the pacer measures both effects, keeps pacing the first and turns the second off
    with reason no_gain; the effect is on the decision body and the controller's gauge."""
    svc = _start(
        clock,
        reader,
        job_timeout_s=120.0,
        policy_params=(PolicyParams(effect_pairs=3, effect_phase_s=5.0, effect_backoff_s=300.0),),
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
    try:
        stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
        jobs = [SimulatedJob("helps", paced_effect=0.10), SimulatedJob("harms", paced_effect=-0.05)]
        drive(svc, stub, clock, jobs, 45.0)
        helps = get(svc, "/v1/pacing?job=helps")[1]
        harms = get(svc, "/v1/pacing?job=harms")[1]
        points = _points(reader)
    finally:
        channel.close()
        svc.stop()
    assert helps["active"] is True and helps["delays"], helps
    assert helps["effect"]["state"] == "kept" and helps["effect"]["low"] > 0, helps
    assert helps["effect"]["gain"] == pytest.approx(0.10, abs=0.03), helps
    assert harms["active"] is False and harms["reason"] == "no_gain" and not harms["delays"]
    assert harms["effect"]["state"] == "no_gain", harms
    assert harms["effect"]["gain"] == pytest.approx(-0.05, abs=0.03), harms
    effect = {
        p.attributes[semconv.JOB_ID]: p.value for p in points[semconv.METRIC_CONTROLLER_EFFECT]
    }
    assert effect == {"helps": helps["effect"]["gain"], "harms": harms["effect"]["gain"]}


def test_jobs_matching_a_job_policy_pattern_get_its_policies(clock: FakeClock) -> None:
    """``--job-policy``: the first pattern a job id matches chooses its policies; other jobs
    get ``--policy``. The same straggler is paced in the jobs whose policies include pacing,
    and only there."""
    svc = _start(
        clock,
        policy_names="pacing",
        job_policies="arm-rebalance=rebalance;arm-*=pacing,interleave",
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
    try:
        jobs = [SimulatedJob(name) for name in ("plain", "arm-rebalance", "arm-both")]
        drive(svc, metrics_service_pb2_grpc.MetricsServiceStub(channel), clock, jobs, 10.0)
        bodies = {job.job_id: get(svc, f"/v1/pacing?job={job.job_id}")[1] for job in jobs}
    finally:
        channel.close()
        svc.stop()
    assert {job: body["policy"] for job, body in bodies.items()} == {
        "plain": "pacing",
        "arm-rebalance": "rebalance",
        "arm-both": "pacing,interleave",
    }
    assert bodies["plain"]["active"] and bodies["plain"]["delays"]
    assert bodies["arm-both"]["active"] and bodies["arm-both"]["delays"], bodies["arm-both"]
    assert bodies["arm-rebalance"]["delays"] == {}, bodies["arm-rebalance"]


@pytest.mark.parametrize(
    "raw, problem",
    [
        ("arm-*", "expected PATTERN=POLICY"),
        ("=pacing", "expected PATTERN=POLICY"),
        ("arm-*=bogus", "unknown policy bogus"),
        ("arm-*=", "expected one or more of"),
    ],
)
def test_bad_job_policy_is_refused_naming_it(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        job_policies(raw)
    # A value given in code (not through the parser) is checked as well.
    with pytest.raises(FieldError, match="job_policies"):
        PacerConfig(job_policies=raw)


def test_job_policy_text_is_made_canonical() -> None:
    assert job_policies(" a-* = rebalance, PACING ; b=interleave;") == (
        "a-*=pacing,rebalance;b=interleave"
    )
    assert job_policy_entries("a-*=pacing,rebalance;b=interleave") == [
        ("a-*", "pacing,rebalance"),
        ("b", "interleave"),
    ]
    assert job_policy_entries(None) == []
