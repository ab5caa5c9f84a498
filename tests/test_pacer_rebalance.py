"""The rebalancing policy, its composition with pacing, and the pacer serving it.

Most scenarios run the real policy objects in closed loop against ``tests/hetero_model.py``:
ranks of unequal speed whose work per step is their share of the global batch over their
speed, with the pacer's metrics lag, a poll's lag and the sampler's sync points between a
decision and the steps it changes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc

import hetero_model as model
from skewtrace import semconv
from skewtrace._options import FieldError
from skewtrace.cli import build_pacer_config, build_parser
from skewtrace.controller.policies import ComposedPolicy, build_policy, policy_names
from skewtrace.controller.policies.pacing import PacingPolicy, PolicyParams
from skewtrace.controller.policies.rebalance import (
    REASON_BALANCED,
    REASON_IMBALANCED,
    REASON_INCOMPLETE,
    REASON_NO_COMPUTE_TIME,
    REASON_RANKS_CHANGED,
    REASON_REBALANCED,
    REASON_REBALANCING,
    REASON_SETTLING,
    RebalanceParams,
    RebalancePolicy,
    RebalanceState,
    compute_per_step,
    decide,
    floored_shares,
)
from skewtrace.controller.window import JobWindow, RankWindow
from skewtrace.decision import BODY_VERSION
from skewtrace.rank.pacing_client import parse_decision, parse_shares
from test_pacer_service import CUMULATIVE, FakeClock, _points, _start, get, histogram, request

PARAMS = RebalanceParams()


def rebalance(params: RebalanceParams = PARAMS) -> RebalancePolicy:
    return RebalancePolicy(params)


def composed(params: RebalanceParams = PARAMS) -> ComposedPolicy:
    return ComposedPolicy(PacingPolicy(PolicyParams()), RebalancePolicy(params))


def window(now: float, compute: dict[int, float], *, step_s: float | None = None) -> JobWindow:
    """Ranks that computed ``compute[r]`` per step and waited for the slowest, 20 steps."""
    slowest = max(compute.values())
    step = slowest + 0.005 if step_s is None else step_s
    return JobWindow(
        now=now,
        ranks={
            r: RankWindow(20, 20 * step, 20 * (slowest - c), 20 * (c - min(compute.values())))
            for r, c in compute.items()
        },
    )


# ------------------------------------------------------------------ pure pieces


def test_floored_shares_are_proportional_sum_to_one_and_respect_the_floor() -> None:
    assert floored_shares({0: 1.0, 1: 1.0}, 0.1) == {0: 0.5, 1: 0.5}
    shares = floored_shares({0: 0.5, 1: 1.0, 2: 1.0, 3: 1.0}, 0.25 / 4)
    assert shares[0] == pytest.approx(0.5 / 3.5)
    assert sum(shares.values()) == pytest.approx(1.0)
    floored = floored_shares({0: 0.01, 1: 1.0, 2: 1.0, 3: 1.0}, 0.25 / 4)
    assert floored[0] == pytest.approx(0.0625)
    assert floored[1] == floored[2] == floored[3] == pytest.approx((1 - 0.0625) / 3)
    assert floored_shares({0: 1.0, 1: 2.0}, 0.5) == {0: 0.5, 1: 0.5}  # floor = equal share


def test_compute_is_step_minus_wait_minus_pacing_delay() -> None:
    rank = RankWindow(10, 10 * 0.100, 10 * 0.030, 0.0, applied_delay_s=0.010)
    assert compute_per_step(rank) == pytest.approx(0.060)
    assert math.isnan(compute_per_step(RankWindow(0, 0.0, 0.0, 0.0)))


def test_balanced_ranks_keep_equal_shares() -> None:
    decision = decide(
        window(10.0, {0: 0.05, 1: 0.051, 2: 0.049, 3: 0.05}), RebalanceState(), PARAMS
    )
    assert decision.reason == REASON_BALANCED
    assert decision.shares == {}
    assert decision.gain is not None and decision.gain < PARAMS.rebalance_threshold


def test_a_change_waits_for_the_hold_then_moves_at_most_max_step() -> None:
    params = RebalanceParams(rebalance_hold_s=2.0, rebalance_max_step=0.2)
    slow = {0: 0.10, 1: 0.05, 2: 0.05, 3: 0.05}
    first = decide(window(10.0, slow), RebalanceState(), params)
    assert first.reason == REASON_IMBALANCED and first.shares == {}
    held = decide(window(11.5, slow), first.state, params)
    assert held.reason == REASON_IMBALANCED
    moved = decide(window(12.0, slow), held.state, params)
    assert moved.reason == REASON_REBALANCED
    assert sum(moved.shares.values()) == pytest.approx(1.0)
    assert max(abs(s - 0.25) for s in moved.shares.values()) == pytest.approx(0.2 * 0.25)
    # (the 5 ms per step outside compute in ``window`` makes the estimate err toward equal)
    assert moved.shares[0] < 0.25 and moved.target[0] == pytest.approx(0.5 / 3.5, rel=0.05)
    # Nothing moves while the new shares settle, however imbalanced the window looks.
    settling = decide(window(12.0 + PARAMS.rebalance_settle_s - 0.5, slow), moved.state, params)
    assert settling.reason == REASON_SETTLING and settling.shares == moved.shares


@pytest.mark.parametrize("cause", [semconv.CAUSE_STAGE_IMBALANCE, semconv.CAUSE_DATA_IMBALANCE])
def test_a_flagged_imbalance_holds_the_shares_and_says_why(cause: str) -> None:
    """A long pipeline stage (all of its replicas slow) or data that varies per step reads as
    ranks of different speeds, but shares of the batch fix neither: shares hold, and the
    composed decision declines pacing for the same reason."""
    params = RebalanceParams(rebalance_hold_s=0.0)
    slow = {0: 0.10, 1: 0.05, 2: 0.05, 3: 0.05}
    moved = decide(window(10.0, slow), RebalanceState(), params)
    assert moved.reason == REASON_REBALANCED
    flagged = replace(window(30.0, slow), declines=(cause,))
    held = decide(flagged, moved.state, params)
    assert held.reason == cause and held.shares == moved.shares
    outcome = composed(params).decide(flagged, composed(params).initial_state())
    assert outcome.reason == cause and not outcome.active and not any(outcome.delays.values())


def test_pacing_delay_is_not_read_as_slowness() -> None:
    # Equal compute (35 ms); rank 1 was delayed 20 ms, so it arrived last and the others
    # waited for it: its step is no longer than theirs once the delay is taken out.
    ranks = {
        0: RankWindow(20, 20 * 0.055, 20 * 0.020, 0.0),
        1: RankWindow(20, 20 * 0.055, 0.0, 20 * 0.020, applied_delay_s=0.020),
        2: RankWindow(20, 20 * 0.055, 20 * 0.020, 0.0),
    }
    decision = decide(JobWindow(10.0, ranks), RebalanceState(), PARAMS)
    assert decision.compute == pytest.approx({0: 0.035, 1: 0.035, 2: 0.035})
    assert decision.reason == REASON_BALANCED


def test_missing_ranks_hold_new_ranks_reset_bad_data_holds() -> None:
    state = RebalanceState({0: 0.1, 1: 0.3, 2: 0.3, 3: 0.3}, changed_at=0.0, changes=1)
    incomplete = decide(window(30.0, {0: 0.05, 1: 0.05, 2: 0.05}), state, PARAMS)
    assert incomplete.reason == REASON_INCOMPLETE and incomplete.shares == state.shares
    grown = decide(window(30.0, {r: 0.05 for r in range(5)}), state, PARAMS)
    assert grown.reason == REASON_RANKS_CHANGED and grown.shares == {}
    assert grown.state.changes == 2
    nonsense = JobWindow(30.0, {r: RankWindow(20, 0.1, 0.5, 0.0) for r in range(4)})
    held = decide(nonsense, state, PARAMS)
    assert held.reason == REASON_NO_COMPUTE_TIME and held.shares == state.shares


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("rebalance_floor", 0.0),
        ("rebalance_floor", 1.5),
        ("rebalance_max_step", 0.0),
        ("rebalance_threshold", 1.0),
        ("rebalance_settle_s", 0.0),
        ("rebalance_min_steps", 0),
    ],
)
def test_invalid_params_name_the_field(field_name: str, value: float) -> None:
    with pytest.raises(FieldError) as raised:
        RebalanceParams(**{field_name: value})
    assert raised.value.field == field_name


# ------------------------------------------------------------------ closed loop


@pytest.mark.parametrize("speed", [0.5, 0.75])
def test_slow_rank_gets_its_speed_share_and_throughput_reaches_the_ideal(speed: float) -> None:
    job = model.HeteroJob([speed, 1.0, 1.0, 1.0])
    on = model.run(job, rebalance(), 90.0)
    off = model.run(job, rebalance(RebalanceParams(rebalance_threshold=0.99)), 90.0)
    ideal = model.ideal_throughput(job)
    final = on.final_shares()
    assert final[0] == pytest.approx(speed / (speed + 3), rel=0.08)
    assert sum(final) == pytest.approx(1.0)
    # Shares only ever moved toward the target: no overshoot, no oscillation.
    slow_share = [shares[0] for _, shares in on.applied_shares]
    assert slow_share == sorted(slow_share, reverse=True)
    assert len(on.share_changes()) <= 3
    assert on.throughput(start=40.0) >= 0.9 * ideal
    # Without rebalancing everyone runs at the slow rank's pace: speed * 4 / (speed + 3) of
    # the ideal, a little more with the per-step costs that do not scale with the batch.
    assert off.throughput(start=40.0) <= (speed * 4 / (speed + 3)) * 1.06 * ideal


def test_changes_are_bounded_settled_and_spaced() -> None:
    job = model.HeteroJob([0.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    params = RebalanceParams(rebalance_max_step=0.3)
    run = model.run(job, rebalance(params), 120.0)
    changes = [(t, o.shares) for t, o in run.decisions if o.reason == REASON_REBALANCED]
    assert len(changes) >= 2  # the bound forces more than one step
    for (t_a, _), (t_b, _) in itertools.pairwise(changes):
        assert t_b - t_a >= params.rebalance_settle_s + params.rebalance_hold_s
    previous = {r: 1 / 8 for r in range(8)}
    for _, shares in changes:
        assert shares is not None
        assert max(abs(shares[r] - previous[r]) for r in shares) <= 0.3 / 8 + 1e-9
        assert min(shares.values()) >= 0.25 / 8 - 1e-9
        previous = dict(shares)


def test_rank_below_the_floor_stays_at_the_floor() -> None:
    job = model.HeteroJob([0.05, 1.0, 1.0, 1.0], batch_work_s=0.1)
    final = model.run(job, rebalance(), 90.0).final_shares()
    assert final[0] == pytest.approx(0.25 / 4, rel=1e-3)
    assert final[1] == pytest.approx((1 - 0.0625) / 3, rel=0.02)


def test_noise_and_equal_speeds_never_move_shares() -> None:
    job = model.HeteroJob([1.0] * 8, noise=0.05)
    run = model.run(job, rebalance(), 120.0)
    assert run.share_changes() == []
    assert {o.reason for _, o in run.decisions[20:]} == {REASON_BALANCED}


def test_shares_return_to_equal_when_the_slow_rank_recovers() -> None:
    job = model.HeteroJob([0.5, 1.0, 1.0, 1.0], speed_changes=[(60.0, 0, 1.0)])
    run = model.run(job, rebalance(), 150.0)
    at_60 = [s for t, s in run.applied_shares if t < 60.0][-1]
    assert at_60[0] < 0.16
    final = run.final_shares()
    assert all(abs(s - 0.25) < 0.25 * PARAMS.rebalance_threshold * 2 for s in final), final


# ------------------------------------------------------------------ pacing and rebalancing


def test_pacing_and_rebalancing_together_neither_undoes_the_other() -> None:
    """One half-speed rank, arrival jitter on two others."""
    job = model.HeteroJob([0.5, 1.0, 1.0, 1.0], jitter_s={1: 0.03, 3: 0.03}, batch_work_s=0.3)
    alone = model.run(job, rebalance(), 120.0, seed=3)
    both = model.run(job, composed(), 120.0, seed=3)
    # Pacing does not undo rebalancing: the same shares, the same throughput.
    assert both.final_shares() == pytest.approx(alone.final_shares(), abs=0.01)
    assert both.final_shares()[0] < 0.16
    assert both.throughput(start=60.0) >= 0.97 * alone.throughput(start=60.0)
    # Rebalancing does not undo pacing: while shares settle pacing is held off (no delays
    # published against a window that mixes old and new shares) ...
    for _, outcome in both.decisions:
        if outcome.info["rebalance"]["reason"] in (REASON_REBALANCED, REASON_SETTLING):
            assert outcome.reason == REASON_REBALANCING and not outcome.delays
    # ... and the slow rank, the latest, is never delayed.
    assert all(not o.delays.get(0) for _, o in both.decisions)


def test_at_the_floor_both_act_and_pacing_keeps_its_delays_off_the_slow_rank() -> None:
    """A rank too slow for its floor stays the latest: rebalancing has done what it may, and
    pacing paces the early ranks as it would alone, without shares moving because of it."""
    job = model.HeteroJob([0.1, 1.0, 1.0, 1.0], batch_work_s=0.12)
    alone = model.run(job, rebalance(), 90.0, seed=5)
    both = model.run(job, composed(), 90.0, seed=5)
    assert both.final_shares() == pytest.approx(alone.final_shares(), abs=0.005)
    late = [o for t, o in both.decisions if t > 45.0]
    assert all(o.active for o in late), [o.reason for o in late]
    delays = [o.delays for o in late]
    assert all(d.get(0, 0.0) == 0.0 for d in delays)
    assert all(d.get(r, 0.0) > 0.0 for d in delays[-5:] for r in (1, 2, 3))
    assert len(both.share_changes()) == len(alone.share_changes())


# ------------------------------------------------------------------ configuration


def test_policy_names_are_canonical_and_checked() -> None:
    assert policy_names("pacing") == "pacing"
    assert policy_names(" Rebalance , pacing,pacing") == "pacing,rebalance"
    with pytest.raises(ValueError, match="unknown policy"):
        policy_names("pacing,magic")
    with pytest.raises(ValueError):
        policy_names(" , ")
    assert isinstance(build_policy("rebalance"), RebalancePolicy)
    assert isinstance(build_policy("pacing,rebalance"), ComposedPolicy)
    assert build_policy("pacing").name == "pacing"


def _config(*argv: str, env: dict[str, str] | None = None) -> Any:
    parser = build_parser()
    args = parser.parse_args(["pacer", *argv])
    return build_pacer_config(args.parser, args, env or {})[0]


def test_cli_policy_flag_and_variable() -> None:
    assert _config().policy_names == "pacing"
    config = _config("--policy", "rebalance,pacing", "--rebalance-floor", "0.5")
    assert config.policy_names == "pacing,rebalance"
    assert config.params_for(RebalanceParams).rebalance_floor == 0.5
    config = _config(env={"SKEWTRACE_PACER_POLICY": "rebalance"})
    assert config.policy_names == "rebalance"
    config = _config("--rebalance-settle-millis", "15000", "--rebalance-hold-millis", "500")
    assert config.params_for(RebalanceParams).rebalance_settle_s == 15.0
    assert config.params_for(RebalanceParams).rebalance_hold_s == 0.5


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--policy", "bogus"], "--policy='bogus': unknown policy bogus"),
        (["--rebalance-floor", "0"], "--rebalance-floor='0': must be in (0, 1]"),
        (
            ["--policy", "rebalance", "--window-millis", "12000"],
            "--rebalance-settle-millis (default 10000): must exceed --window-millis",
        ),
    ],
)
def test_cli_bad_policy_settings_exit_2_naming_the_flag(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _config(*argv)
    assert exited.value.code == 2
    assert needle in capsys.readouterr().err


# ------------------------------------------------------------------ the service and the API


def _export(job_id: str, compute: dict[int, float], steps: int, totals: dict[Any, Any]) -> Any:
    """Cumulative step-duration and wait histograms after ``steps`` more steps."""
    slowest = max(compute.values())
    metrics = []
    for name, value in (
        (semconv.METRIC_STEP_DURATION, lambda c: slowest + 0.004),
        (semconv.METRIC_RANK_WAIT, lambda c: slowest - c),
        (semconv.METRIC_RANK_LATENESS, lambda c: c - min(compute.values())),
    ):
        points = []
        for rank, c in compute.items():
            count, total = totals.get((name, rank), (0, 0.0))
            count, total = count + steps, total + steps * value(c)
            totals[(name, rank)] = (count, total)
            attrs: dict[str, str | int] = {semconv.JOB_ID: job_id, semconv.RANK: rank}
            points.append((attrs, count, total))
        metrics.append(histogram(name, CUMULATIVE, points))
    return request(*metrics)


def test_service_publishes_shares_versioned_and_old_clients_ignore_them() -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    clock = FakeClock()
    reader = InMemoryMetricReader()
    service = _start(clock, reader, policy_names="pacing,rebalance", job_timeout_s=60.0)
    channel = grpc.insecure_channel(f"127.0.0.1:{service.otlp_port}")
    stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
    try:
        totals: dict[Any, Any] = {}
        shares = {r: 0.25 for r in range(4)}
        bodies = []
        for half_second in range(80):  # 40 s: the ranks apply each decision's shares
            clock.now += 0.5
            compute = {r: 0.4 * shares[r] / (0.5 if r == 0 else 1.0) for r in range(4)}
            if half_second % 2 == 1:
                stub.Export(_export("hetero", compute, 8, totals), timeout=5)
            service.tick()
            status, body = get(service, "/v1/pacing?job=hetero")
            assert status == 200
            bodies.append(body)
            found, _ = parse_shares(body)
            if found:
                shares = found
        first = next(b for b in bodies if "shares" in b)
        final = bodies[-1]
        gauge = {
            p.attributes[semconv.RANK]: p.value
            for p in _points(reader)[semconv.METRIC_REBALANCE_SHARE]
        }
        assert gauge == {int(r): v for r, v in final["shares"].items()}
    finally:
        channel.close()
        service.stop()
    assert final["policy"] == "pacing,rebalance"
    assert set(final["shares"]) == {"0", "1", "2", "3"}
    assert sum(final["shares"].values()) == pytest.approx(1.0, abs=1e-5)
    assert final["shares"]["0"] == pytest.approx(0.5 / 3.5, rel=0.05)
    assert final["shares_version"] >= 1 and final["rebalance"]["changes"] >= 1
    assert first["version"] >= 1
    # Every change of shares bumped the decision's version.
    by_shares = {json_key(b.get("shares")): b["version"] for b in bodies if "shares" in b}
    assert len(set(by_shares.values())) == len(by_shares)
    # A rank client of before shares reads only what it knows: no delay, no error.
    assert parse_decision(final, 0, 0.05) == (0.0, final["version"])
    assert parse_decision(final, 2, 0.05)[0] >= 0.0


def json_key(shares: dict[str, float] | None) -> str:
    return repr(sorted((shares or {}).items()))


def test_unknown_job_and_pacing_only_bodies_have_no_shares() -> None:
    clock = FakeClock()
    service = _start(clock)
    try:
        status, body = get(service, "/v1/pacing?job=nobody")
        assert status == 200 and body == {
            "job": "nobody",
            "version": 0,
            "active": False,
            "delays": {},
            "body_version": BODY_VERSION,
        }
        assert parse_shares(body) == (None, 0)
    finally:
        service.stop()


@pytest.mark.parametrize(
    "raw",
    [
        {"version": 1, "shares": {"0": 0.5, "1": "x"}},
        {"version": 1, "shares": {"0": -0.1, "1": 1.1}},
        {"version": 1, "shares": {"a": 0.5, "1": 0.5}},
        {"version": 1, "shares": {"0": 0.0, "1": 0.0}},
        {"version": 1, "shares": [0.5, 0.5]},
        {"version": 1, "shares": {"0": math.inf, "1": 0.5}},
    ],
)
def test_malformed_shares_mean_equal_shares(raw: dict[str, Any]) -> None:
    assert parse_shares(raw)[0] is None


def test_shares_are_normalised() -> None:
    shares, version = parse_shares({"shares": {"0": 1, "1": 3}, "shares_version": 4})
    assert shares == {0: 0.25, 1: 0.75} and version == 4


# ------------------------------------------------------------------ the wait a step idled


BOUNDS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]


def _histogram_of(values: list[float]) -> list[int]:
    counts = [0] * (len(BOUNDS) + 1)
    for value in values:
        counts[next((i for i, b in enumerate(BOUNDS) if value <= b), len(BOUNDS))] += 1
    return counts


@pytest.mark.parametrize(
    ("waits_per_step", "expected"),
    [
        ([0.048, 0.0008], 0.048),  # the long wait, then a loss all-reduce's moment
        ([0.030, 0.030, 0.030], 0.030),  # overlapping gradient buckets: once
        ([0.048], 0.048),
        ([0.0, 0.0], 0.0),
        ([0.040, 0.002, 0.001, 0.0007], 0.040),
    ],
)
def test_top_sum_finds_the_wait_a_step_idled(waits_per_step: list[float], expected: float) -> None:
    from skewtrace.controller.window_stats import top_sum

    steps = 40
    values = waits_per_step * steps
    counts = _histogram_of(values)
    estimate = top_sum(BOUNDS, counts, sum(values), steps) / steps
    assert estimate == pytest.approx(expected, rel=0.05, abs=2e-4)


def test_window_gives_rebalancing_the_top_waits_and_pacing_its_conservative_sum() -> None:
    from skewtrace.controller.state import JobWindows
    from test_pacer_service import DELTA

    windows = JobWindows(window_s=4.0, job_timeout_s=60.0)
    attrs: dict[str, str | int] = {semconv.JOB_ID: "j", semconv.RANK: 0}
    steps, waits = 20, [0.048, 0.0008]
    values = waits * steps
    req = request(
        histogram(semconv.METRIC_STEP_DURATION, DELTA, [(attrs, steps, steps * 0.1)]),
        histogram(
            semconv.METRIC_RANK_WAIT,
            DELTA,
            [(attrs, len(values), sum(values), _histogram_of(values))],
        ),
    )
    # (the service tests' BOUNDS differ from these; the window reads the point's own bounds)
    for metric in req.resource_metrics[0].scope_metrics[0].metrics:
        for point in metric.histogram.data_points:
            if metric.name == semconv.METRIC_RANK_WAIT:
                del point.explicit_bounds[:]
                point.explicit_bounds.extend(BOUNDS)
    assert windows.ingest_request(req.resource_metrics, now=10.0) == 0
    rank = windows.window("j", now=10.5).ranks[0]
    assert rank.wait_per_step_s == pytest.approx(sum(waits) / 2)  # pacing: errs low
    assert rank.wait_top_sum_s is not None
    assert rank.wait_top_sum_s / steps == pytest.approx(0.048, rel=0.02)
    assert compute_per_step(rank) == pytest.approx(0.1 - 0.048, rel=0.05)


def test_bucket_layouts_are_bounded() -> None:
    """Clients cannot grow the pacer's memory with new bucket layouts or huge bucket lists:
    past the caps a wait series keeps no buckets and the estimate falls back."""
    from skewtrace.controller import deltas
    from skewtrace.controller.state import JobWindows
    from test_pacer_service import DELTA

    windows = JobWindows(window_s=4.0, job_timeout_s=60.0)
    for i in range(deltas._MAX_LAYOUTS + 10):
        attrs: dict[str, str | int] = {semconv.JOB_ID: "j", semconv.RANK: i}
        metric = histogram(semconv.METRIC_RANK_WAIT, DELTA, [(attrs, 4, 0.04)])
        point = metric.histogram.data_points[0]
        del point.explicit_bounds[:]
        point.explicit_bounds.extend([0.001 * (i + 1), 1.0])
        del point.bucket_counts[:]
        point.bucket_counts.extend([0, 4, 0])
        windows.ingest_request(request(metric).resource_metrics, now=1.0)
    assert len(windows._histograms._layouts) == deltas._MAX_LAYOUTS
    kept = [d.buckets is not None for ds in windows._table.jobs["j"].deltas.values() for d in ds]
    assert kept.count(True) == deltas._MAX_LAYOUTS and kept.count(False) == 10


def test_a_composition_publishes_every_policys_blocks() -> None:
    """pacing's ``effect`` block reaches a composed job's body as it does a lone policy's
    (the composition once kept only the blocks of the policies after the first, so a
    ``pacing,rebalance`` job never had an effect gauge)."""
    from skewtrace.controller.policies.base import Outcome

    class Fixed:
        def __init__(self, name: str, info: dict[str, Any]) -> None:
            self.name, self.info = name, info

        def initial_state(self) -> None:
            return None

        def decide(self, window: JobWindow, previous: None) -> Outcome:
            return Outcome(reason=self.name, state=None, info=self.info)

    effect = {"state": "measuring", "gain": 0.01}
    composed = ComposedPolicy(
        Fixed("pacing", {"effect": effect}), Fixed("rebalance", {"rebalance": {"changes": 1}})
    )
    outcome = composed.decide(JobWindow(now=0.0, ranks={}), composed.initial_state())
    assert outcome.info == {"effect": effect, "rebalance": {"changes": 1}}
    assert outcome.reason == "pacing"
