"""The interleave policy's loop through the pacer service: the Collector's group-phase gauges
in over OTLP/gRPC, a schedule both jobs agree on out over HTTP, and each rank's hold from it
(skewtrace.controller.state, .service, .decision; skewtrace.rank.pacing_client)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from skewtrace import semconv
from skewtrace.controller.policies.interleave import InterleaveParams
from skewtrace.controller.service import PacerService
from skewtrace.controller.state import JobWindows
from skewtrace.decision import DecisionBody
from skewtrace.rank.pacing_client import PacingClient
from test_pacer_service import CUMULATIVE, FakeClock, _start, get, histogram, request

SWITCHES = "leaf-00,leaf-01"


def phase_gauges(
    job: str,
    *,
    pg: str = "0",
    start: Any = 0.1,
    duration: Any = 0.105,
    hosts: str | None = None,
    op: str = "all_reduce",
    switches: str = SWITCHES,
) -> list[metrics_pb2.Metric]:
    """The connector's two group-phase gauges for one group and op of a job."""
    out = []
    for name, value in (
        (semconv.METRIC_GROUP_PHASE_START, start),
        (semconv.METRIC_GROUP_PHASE_DURATION, duration),
    ):
        metric = metrics_pb2.Metric(name=name, unit="s")
        point = metric.gauge.data_points.add(time_unix_nano=1)
        if isinstance(value, float):
            point.as_double = value
        attrs = {
            semconv.JOB_ID: job,
            semconv.COLLECTIVE_PG: pg,
            semconv.COLLECTIVE_OP: op,
            semconv.GROUP_SWITCHES: switches,
            semconv.GROUP_HOSTS: hosts or f"{job}-n0,{job}-n1",
        }
        point.attributes.extend(
            KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()
        )
        out.append(metric)
    return out


def steps(job: str, count: int, step_s: float) -> metrics_pb2.Metric:
    """Cumulative step-duration histograms of the job's two ranks after ``count`` steps."""
    return histogram(
        semconv.METRIC_STEP_DURATION,
        CUMULATIVE,
        [({semconv.JOB_ID: job, semconv.RANK: rank}, count, count * step_s) for rank in (0, 1)],
    )


def test_the_window_reads_group_phases_and_counts_bad_points() -> None:
    windows = JobWindows(window_s=10.0, job_timeout_s=60.0)
    for at, count in ((0.5, 10), (1.0, 20)):  # a job steps: its count goes up
        good = request(*phase_gauges("A"), *phase_gauges("B"), steps("A", count, 0.205))
        assert windows.ingest_request(good.resource_metrics, at) == 0
    bad = request(
        *phase_gauges("A", pg=""),  # no group
        *phase_gauges("A", start=-0.1, duration=float("nan")),  # negative, not finite
        *phase_gauges("A", start=None, duration=None),  # no value
    )
    assert windows.ingest_request(bad.resource_metrics, 2.0) == 6
    assert windows.counters.points_invalid == 6
    window = windows.window("A", 3.0)
    assert window.job == "A"
    (own,) = window.groups
    assert (own.pg, own.phases, own.switches, own.hosts, own.job) == (
        "0",
        ((0.1, 0.105),),
        ("leaf-00", "leaf-01"),
        ("A-n0", "A-n1"),
        "A",
    )
    assert own.step_s == pytest.approx(0.205)
    # B sent phases but no steps: not known to be running, so not on the fabric.
    assert window.fabric == ()
    # Phases older than the window are not read; a silent job's series are forgotten.
    assert windows.window("A", 20.0).groups == ()
    windows.expire(100.0)
    assert windows.window("A", 100.0).groups == ()


@pytest.fixture
def service() -> Iterator[tuple[PacerService, FakeClock]]:
    clock = FakeClock()
    svc = _start(
        clock,
        policy_names="interleave",
        policy_params=(InterleaveParams(interleave_effect_pairs=0),),
        job_timeout_s=60.0,
    )
    yield svc, clock
    svc.stop()


def test_two_colliding_jobs_get_one_schedule_over_the_wire(service) -> None:
    svc, clock = service
    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
    )
    for second in range(1, 4):
        clock.now += 1.0
        stub.Export(
            request(
                *phase_gauges("A"),
                *phase_gauges("B"),
                steps("A", 5 * second, 0.205),
                steps("B", 5 * second, 0.205),
            ),
            timeout=5,
        )
        svc.tick(clock.now)
    bodies = {}
    for job in ("A", "B"):
        status, body = get(svc, f"/v1/pacing?job={job}")
        assert status == 200 and body["reason"] == "interleaving" and body["active"]
        assert isinstance(body["served_unix"], float)
        bodies[job] = DecisionBody.from_json(body)
    a, b = bodies["A"].schedule, bodies["B"].schedule
    assert a is not None and b is not None
    assert a.period_s == b.period_s == pytest.approx(0.215)
    assert (a.slots, b.slots) == ({"0": 0.0}, {"0": 0.1075})
    # Each job's ranks hold to their own slot: half a period apart on the pacer's clock.
    at = 1000.0 * a.period_s  # a multiple of the period: A's slot now
    assert bodies["A"].hold_for(["0"], at, 1.0) == pytest.approx(0.0, abs=1e-9)
    assert bodies["B"].hold_for(["0"], at, 1.0) == pytest.approx(0.1075)
    # The schedule was in force: the next window says so, and the schedule is kept.
    assert svc._windows.window("A", clock.now).scheduled > 0


class _Pacer(BaseHTTPRequestHandler):
    """A pacer whose wall clock runs ``skew`` seconds ahead of this host's."""

    skew = 0.0
    body: dict[str, Any] = {}

    def do_GET(self) -> None:
        import json

        payload = json.dumps({**self.body, "served_unix": time.time() + self.skew}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def _polling(handler: type[_Pacer], max_delay_s: float) -> Iterator[PacingClient]:
    """A rank client of job A polling a pacer served by ``handler`` every 0.05 s."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = PacingClient(
        f"http://127.0.0.1:{server.server_address[1]}",
        "A",
        0,
        max_delay_s=max_delay_s,
        poll_interval_s=0.05,
    )
    client.start()
    try:
        yield client
    finally:
        client.stop()
        server.shutdown()


def _await_polls(client: PacingClient, count: int, deadline: float) -> None:
    while client.polls_ok < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_the_rank_client_holds_to_its_slot_on_the_pacers_clock() -> None:
    """The client estimates the pacer's clock from served_unix (the pacer here runs 40 s
    ahead) and holds its groups to their slot; a stale or failing pacer holds nobody."""
    _Pacer.skew = 40.0
    _Pacer.body = {
        "version": 1,
        "active": True,
        "delays": {},
        "schedule": {"period_s": 10.0, "slots": {"dp1": 5.0}},
        "body_version": 2,
    }
    with _polling(_Pacer, max_delay_s=10.0) as client:
        _await_polls(client, 3, time.monotonic() + 10)
        assert client.clock_offset_s == pytest.approx(40.0, abs=0.05)
        hold = client.current_hold(["dp1", "tp0"])
        # On the pacer's clock the slot is at 5 s modulo 10 s.
        expected = (5.0 - (time.time() + 40.0)) % 10.0
        expected = 0.0 if expected > 5.0 else expected
        assert hold == pytest.approx(expected, abs=0.1)
        assert client.current_hold(["tp0"]) == 0.0
    assert client.current_hold(["dp1"]) == 0.0  # stopped: stale


def test_phase_series_are_bounded_per_job_and_in_all() -> None:
    windows = JobWindows(window_s=10.0, job_timeout_s=60.0, max_series=300)
    long_name = "x" * 300
    assert windows.ingest_request(request(*phase_gauges("A", pg=long_name)).resource_metrics, 1.0)
    assert windows.counters.points_too_long == 2
    many = [m for i in range(300) for m in phase_gauges("A", pg=f"g{i}")]
    rejected = windows.ingest_request(request(*many).resource_metrics, 2.0)
    # 256 series a job (each its start and duration point), the rest counted and dropped.
    assert rejected == 2 * 44 and windows.counters.points_over_series_limit == 88
    assert windows.series == 256
    windows.expire(100.0)
    assert windows.series == 0


def test_every_jobs_window_places_the_same_units() -> None:
    """Job A also has a group behind one switch that shares a host with its crossing group
    (a tensor-parallel group inside node A-n0), and a longer window (its steps are long):
    both jobs' decisions, from windows the state builds, still agree on the period and put
    the two all-reduces half a period apart."""
    from skewtrace.controller.policies.interleave import InterleavePolicy

    windows = JobWindows(window_s=4.0, job_timeout_s=60.0)
    for second in range(1, 4):
        export = request(
            *phase_gauges("A"),
            *phase_gauges(
                "A", pg="tp", start=0.02, duration=0.01, hosts="A-n0", switches="leaf-00"
            ),
            *phase_gauges("B"),
            steps("A", 5 * second, 0.205),
            steps("B", 5 * second, 0.205),
        )
        windows.ingest_request(export.resource_metrics, float(second))
    policy = InterleavePolicy(InterleaveParams(interleave_effect_pairs=0))
    a = policy.decide(windows.window("A", 3.5), policy.initial_state())
    b = policy.decide(windows.window("B", 3.5), policy.initial_state())
    period = a.info["schedule"]["period_s"]
    assert period == b.info["schedule"]["period_s"]
    gap = (b.info["schedule"]["slots"]["0"] - a.info["schedule"]["slots"]["0"]) % period
    assert gap == pytest.approx(period / 2, abs=2e-6)


def test_offsets_within_a_job_hold_from_tick_to_tick(service) -> None:
    """Two groups of one job collide; once offset, the phases observed start the offset
    later (the ranks hold it) and no longer overlap: the pacer reads the offset it published
    back out of the observed starts and keeps it, at the same decision version."""
    svc, clock = service
    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
    )
    versions, offsets = [], []
    for second in range(1, 9):
        clock.now += 1.0
        body = DecisionBody.from_json(get(svc, "/v1/pacing?job=J")[1])
        held = (body.offsets or {}).get("dp1", 0.0)
        # Alone an all-reduce takes 0.0525 s; at the same time, twice that.
        apart = held >= 0.05
        stub.Export(
            request(
                *phase_gauges("J", pg="dp0", duration=0.0525 if apart else 0.105, hosts="n0,n2"),
                *phase_gauges(
                    "J",
                    pg="dp1",
                    start=0.1 + held,
                    duration=0.0525 if apart else 0.105,
                    hosts="n1,n3",
                ),
                steps("J", 5 * second, 0.205),
            ),
            timeout=5,
        )
        svc.tick(clock.now)
        body = DecisionBody.from_json(get(svc, "/v1/pacing?job=J")[1])
        versions.append(body.version)
        offsets.append(dict(body.offsets or {}))
    # Its first step count is history: the job is on the fabric once the count goes up.
    assert offsets[:2] == [{}, {"dp1": 0.053}]
    # Once the window holds only offset steps, the offset is read back and kept.
    assert offsets[-3:] == [{"dp1": 0.053}] * 3
    assert len(set(versions[-3:])) == 1


def test_step_ages_sent_with_polls_place_the_jobs_phases_on_the_pacers_clock() -> None:
    """Ranks say with each poll how long ago their step started (``step_age``); the pacer
    places each job's phases on its own clock from it (no host clock trusted) and schedules
    only phases that meet there. Bad ages are counted at /healthz, and the poll is answered
    all the same; ages of a job the pacer has no metrics of are ignored."""
    from test_pacer_service import ANY_PORT, MeterProvider, PacerConfig

    clock = FakeClock()
    config = PacerConfig(
        otlp_grpc=ANY_PORT,
        http=ANY_PORT,
        decision_interval_s=3600.0,
        policy_names="interleave",
        policy_params=(InterleaveParams(interleave_effect_pairs=0),),
        job_timeout_s=60.0,
    )
    svc = PacerService(config, meter_provider=MeterProvider(), clock=clock, wall_clock=clock)
    svc.start()
    stub = metrics_service_pb2_grpc.MetricsServiceStub(
        grpc.insecure_channel(f"127.0.0.1:{svc.otlp_port}")
    )
    step = 0.205
    try:
        for second in range(1, 4):
            clock.now += 1.0
            stub.Export(
                request(
                    *phase_gauges("A", duration=0.05),
                    *phase_gauges("B", duration=0.05),
                    steps("A", 5 * second, step),
                    steps("B", 5 * second, step),
                ),
                timeout=5,
            )
            # A's step started just now, B's half a step (and 3 steps) ago: their phases,
            # 0.1 s to 0.15 s into each step, take turns on the pacer's clock.
            assert get(svc, "/v1/pacing?job=A&step_age=0")[0] == 200
            assert get(svc, f"/v1/pacing?job=B&step_age={3.5 * step:.6f}")[0] == 200
            svc.tick(clock.now)
        for job in ("A", "B"):
            status, body = get(svc, f"/v1/pacing?job={job}")
            assert status == 200 and body["reason"] == "no_collision" and not body["active"]
            assert body.get("schedule") is None
        # The same phases with the steps started together: a schedule for both.
        clock.now += 1.0
        assert get(svc, "/v1/pacing?job=A&step_age=0.01")[0] == 200
        assert get(svc, f"/v1/pacing?job=B&step_age={3 * step:.6f}")[0] == 200
        svc.tick(clock.now)
        for job in ("A", "B"):
            status, body = get(svc, f"/v1/pacing?job={job}")
            assert body["reason"] == "interleaving" and body["schedule"]["period_s"] == 0.215
        # Bad ages: counted, and each poll still answered.
        for bad in ("-1", "nan", "inf", "61", "soon"):
            status, body = get(svc, f"/v1/pacing?job=A&step_age={bad}")
            assert status == 200 and body["reason"] == "interleaving"
        assert get(svc, "/v1/pacing?job=nobody&step_age=0.1")[0] == 200
        status, health = get(svc, "/healthz")
        assert status == 200 and health["step_starts_invalid"] == 5
    finally:
        svc.stop()


def test_the_rank_client_sends_its_steps_age_with_each_poll() -> None:
    """The hooks set ``step_started_at`` (monotonic) once per step; each poll carries its age,
    and a client whose hooks set nothing sends none (as before)."""
    seen: list[str] = []

    class Recording(_Pacer):
        def do_GET(self) -> None:
            seen.append(self.path)
            super().do_GET()

    _Pacer.skew, _Pacer.body = 0.0, {"version": 1, "active": False, "delays": {}}
    with _polling(Recording, max_delay_s=1.0) as client:
        deadline = time.monotonic() + 10
        _await_polls(client, 2, deadline)
        assert seen and all("step_age" not in path for path in seen)
        client.step_started_at = time.monotonic() - 2.0
        _await_polls(client, client.polls_ok + 2, deadline)
        ages = [float(p.split("step_age=")[1]) for p in seen if "step_age=" in p]
        assert ages and all(2.0 <= age < 5.0 for age in ages)
        assert all(p.startswith("/v1/pacing?job=A&step_age=") for p in seen if "step_age" in p)


def test_a_job_that_stopped_stepping_leaves_the_other_jobs_windows() -> None:
    """The Collector re-sends an ended job's last phase gauges every metrics_resend_interval
    for series_idle_timeout (15 minutes by default): in issue 23's benchmark the jobs of the
    round before took turns in the next round's schedule. A job whose ranks have reported no
    step in its window is not on the fabric, whatever phases arrive for it."""
    windows = JobWindows(window_s=4.0, job_timeout_s=60.0)
    for second in range(1, 4):
        windows.ingest_request(
            request(
                *phase_gauges("A"),
                *phase_gauges("B"),
                steps("A", 5 * second, 0.205),
                steps("B", 5 * second, 0.205),
            ).resource_metrics,
            float(second),
        )
    assert [g.job for g in windows.window("A", 3.5).fabric] == ["B"]
    # B ended at 3 s; at 20 s A still steps, and B's phases arrive again (a resend) with
    # its unchanged step counts.
    for second in range(4, 21):
        windows.ingest_request(
            request(*phase_gauges("A"), steps("A", 5 * second, 0.205)).resource_metrics,
            float(second),
        )
    windows.ingest_request(
        request(*phase_gauges("B"), steps("B", 15, 0.205)).resource_metrics, 20.0
    )
    assert windows.window("A", 20.5).fabric == ()
    assert [g.job for g in windows.window("A", 20.5).groups] == ["A"]
    # Forgotten (job_timeout_s) and back with its phases only (a resend): still not there.
    windows.expire(90.0)
    assert "B" not in windows.job_ids()
    for second in (90, 91):
        windows.ingest_request(
            request(
                *phase_gauges("A"),
                *phase_gauges("B"),
                steps("A", 500 + second, 0.205),
                steps("B", 15, 0.205),  # its whole history: a first point once forgotten
            ).resource_metrics,
            float(second),
        )
    assert windows.window("A", 91.5).fabric == ()
    assert [g.job for g in windows.window("A", 91.5).groups] == ["A"]
