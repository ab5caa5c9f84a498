"""The decision body (skewtrace.decision): one type for the server and the ranks.

The server's JSON keeps the bytes of before for every field (``body_version`` is appended);
the new client reads the bodies of before; and a deployed client of before (a frozen copy of
its parse code, below) reads the new server's bodies as it read the old ones.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from skewtrace.controller.policies.pacing import PolicyParams
from skewtrace.controller.policies.rebalance import RebalanceParams
from skewtrace.decision import (
    BODY_VERSION,
    DecisionBody,
    DecisionError,
    Effect,
    RebalanceStatus,
    Schedule,
)
from skewtrace.rank.pacing_client import PacingClient, parse_decision, parse_shares
from test_pacer_client import ScriptedServer, answer, make_client, wait_for
from test_pacer_rebalance import _export
from test_pacer_service import CUMULATIVE, FakeClock, SimulatedJob, _start, get

# ------------------------------------------------------------------ the deployed client
# A frozen copy of the rank client's parse code before the typed body (parse_decision and
# parse_shares of src/skewtrace/rank/pacing_client.py): what ranks already running read
# answers with.
# Do not update it with the client.


def deployed_parse_decision(body: Any, rank: int, max_delay_s: float) -> tuple[float, int]:
    """This rank's (delay, version) from a decision body; raises ValueError when malformed."""
    if not isinstance(body, dict):
        raise ValueError("pacer answer is not a JSON object")
    version = body.get("version")
    active = body.get("active")
    delays = body.get("delays")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError("pacer answer has no integer 'version'")
    if not isinstance(active, bool):
        raise ValueError("pacer answer has no boolean 'active'")
    if not isinstance(delays, dict):
        raise ValueError("pacer answer has no 'delays' object")
    if not active:
        return 0.0, version
    raw = delays.get(str(rank), 0.0)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ValueError(f"pacer delay for rank {rank} is not a finite number: {raw!r}")
    return min(max(float(raw), 0.0), max_delay_s), version


def deployed_parse_shares(body: Any) -> tuple[dict[int, float] | None, int]:
    """(shares, shares version) from a decision body; None when it has no usable shares."""
    if not isinstance(body, dict):
        return None, 0
    version = body.get("shares_version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        version = 0
    raw = body.get("shares")
    if not isinstance(raw, dict) or not raw:
        return None, version
    shares: dict[int, float] = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isdigit()):
            return None, version
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, version
        if not (math.isfinite(value) and value >= 0):
            return None, version
        shares[int(key)] = float(value)
    total = sum(shares.values())
    if not total > 0:
        return None, version
    return {rank: share / total for rank, share in sorted(shares.items())}, version


# ------------------------------------------------------------------ bodies


def wire(body: dict[str, Any]) -> dict[str, Any]:
    """What a rank gets: the body through JSON as the HTTP server writes it."""
    loaded: dict[str, Any] = json.loads(json.dumps(body, separators=(",", ":")))
    return loaded


FULL = DecisionBody(
    job="run-42",
    version=17,
    active=True,
    delays={0: 0.0101, 2: 0.0102},
    spread=0.231,
    reason="active",
    ranks=4,
    policy="pacing,rebalance",
    updated_unix=1764424000.1,
    shares={0: 0.148, 1: 0.2816, 2: 0.284, 3: 0.2863},
    shares_version=3,
    effect=Effect("kept", 0.031, 0.012, 0.05, 3),
    rebalance=RebalanceStatus("balanced", 0.021, 3),
)


def test_the_json_keeps_the_bytes_of_before_with_body_version_appended() -> None:
    pacing = DecisionBody(
        job="run-42",
        version=17,
        active=True,
        delays={0: 0.0101, 1: 0.0099, 2: 0.0102},
        spread=0.231,
        reason="active",
        ranks=4,
        policy="pacing",
        updated_unix=1764424000.1,
    )
    assert json.dumps(pacing.to_json(), separators=(",", ":")) == (
        '{"job":"run-42","version":17,"active":true,'
        '"delays":{"0":0.0101,"1":0.0099,"2":0.0102},"spread":0.231,"reason":"active",'
        '"ranks":4,"policy":"pacing","updated_unix":1764424000.1,"body_version":4}'
    )
    rebalance = DecisionBody(
        job="run-42",
        version=6,
        reason="balanced",
        ranks=4,
        policy="rebalance",
        updated_unix=1764424000.1,
        shares={0: 0.148, 1: 0.2816},
        shares_version=3,
        rebalance=RebalanceStatus("balanced", 0.021, 3),
    )
    assert json.dumps(rebalance.to_json(), separators=(",", ":")) == (
        '{"job":"run-42","version":6,"active":false,"delays":{},"spread":null,'
        '"reason":"balanced","ranks":4,"policy":"rebalance","updated_unix":1764424000.1,'
        '"shares":{"0":0.148,"1":0.2816},"shares_version":3,'
        '"rebalance":{"reason":"balanced","gain":0.021,"changes":3},"body_version":4}'
    )
    # Equal shares: no "shares", still a "shares_version".
    equal = DecisionBody(job="j", reason="balanced", policy="rebalance", shares_version=4)
    assert "shares" not in equal.to_json() and equal.to_json()["shares_version"] == 4
    unknown = DecisionBody("nobody").to_json()
    assert json.dumps(unknown, separators=(",", ":")) == (
        '{"job":"nobody","version":0,"active":false,"delays":{},"body_version":4}'
    )


def test_round_trip_server_to_client() -> None:
    assert DecisionBody.from_json(wire(FULL.to_json())) == FULL
    assert DecisionBody.from_json(wire(DecisionBody("nobody").to_json())) == DecisionBody("nobody")
    measuring = DecisionBody(
        job="j",
        version=2,
        reason="measuring",
        policy="pacing",
        ranks=4,
        updated_unix=1.5,
        effect=Effect("measuring", 0.0, None, None, 1),
    )
    assert DecisionBody.from_json(wire(measuring.to_json())) == measuring


def test_an_old_body_without_body_version_reads_as_version_1() -> None:
    old = {
        "job": "run-42",
        "version": 17,
        "active": True,
        "delays": {"0": 0.0101, "2": 0.0102},
        "spread": 0.231,
        "reason": "active",
        "ranks": 4,
        "policy": "pacing",
        "updated_unix": 1764424000.1,
    }
    body = DecisionBody.from_json(old)
    assert body.body_version == 1 and BODY_VERSION == 4
    assert (body.version, body.active, dict(body.delays)) == (17, True, {0: 0.0101, 2: 0.0102})
    assert (body.spread, body.reason, body.ranks, body.policy) == (0.231, "active", 4, "pacing")
    assert body.shares is None and body.shares_version is None and body.effect is None
    assert parse_decision(old, 2, 0.05) == (0.0102, 17)
    assert parse_decision(old, 1, 0.05) == (0.0, 17)
    # Re-served, it is the old body plus body_version.
    assert body.to_json() == {**old, "body_version": 1}
    # The smallest body any pacer ever sent.
    minimal = DecisionBody.from_json({"version": 3, "active": False, "delays": {}})
    assert minimal == DecisionBody(job="", version=3, body_version=1)


def _service_bodies() -> list[dict[str, Any]]:
    """Bodies of the real service, every policy, pacing on and off, shares moving, the effect
    measured: what the new server sends."""
    bodies: list[dict[str, Any]] = []
    for policy in ("pacing", "rebalance", "pacing,rebalance"):
        clock = FakeClock()
        service = _start(
            clock,
            policy_names=policy,
            policy_params=(
                PolicyParams(effect_pairs=2, effect_phase_s=3.0),
                RebalanceParams(rebalance_settle_s=6.0),
            ),
        )
        try:
            job = SimulatedJob("strag", paced_effect=0.1)
            previous, totals = job.snapshot(), {}
            for half_second in range(60):
                clock.now += 0.5
                job.run_steps(4)
                if half_second % 2 == 1:
                    service.ingest(job.export(CUMULATIVE, previous))
                    previous = job.snapshot()
                    slow = {r: 0.1 if r == 0 else 0.05 for r in range(4)}
                    service.ingest(_export("hetero", slow, 8, totals))
                service.tick()
                found = service.decision_body("strag") or {}
                job.delays = {int(r): v for r, v in found.get("delays", {}).items()}
                bodies += [get(service, f"/v1/pacing?job={j}")[1] for j in ("strag", "hetero")]
            bodies.append(get(service, "/v1/pacing?job=nobody")[1])
        finally:
            service.stop()
    return bodies


@pytest.fixture(scope="module")
def service_bodies() -> list[dict[str, Any]]:
    return _service_bodies()


def test_the_service_serves_every_kind_of_body(service_bodies: list[dict[str, Any]]) -> None:
    reasons = {b.get("reason") for b in service_bodies}
    assert {"active", "measuring", "rebalancing", "rebalanced", "settling", None} <= reasons
    assert any(b["active"] and b["delays"] for b in service_bodies)
    assert any("shares" in b for b in service_bodies)
    assert any("effect" in b for b in service_bodies)
    assert all(b["body_version"] == BODY_VERSION for b in service_bodies)
    assert all(list(b)[-1] == "body_version" for b in service_bodies)


def test_the_new_client_reads_every_body_the_server_sends(
    service_bodies: list[dict[str, Any]],
) -> None:
    for raw in service_bodies:
        body = DecisionBody.from_json(raw)
        assert body.to_json() == raw  # nothing lost, nothing added
        assert DecisionBody.from_json(wire(body.to_json())) == body


def test_the_deployed_client_reads_the_new_server_as_before(
    service_bodies: list[dict[str, Any]],
) -> None:
    for raw in service_bodies:
        for rank in range(5):
            assert deployed_parse_decision(raw, rank, 0.05) == parse_decision(raw, rank, 0.05)
        assert deployed_parse_shares(raw) == parse_shares(raw)
        # Without the new field the deployed client reads exactly the same.
        old = {k: v for k, v in raw.items() if k != "body_version"}
        assert deployed_parse_decision(old, 0, 0.05) == deployed_parse_decision(raw, 0, 0.05)


# ------------------------------------------------------------------ tolerant reading


def test_unknown_fields_are_ignored_and_bad_informational_ones_defaulted() -> None:
    body = DecisionBody.from_json(
        {
            "version": 5,
            "active": True,
            "delays": {"1": 0.02, "x": "y", "01": 0.5},
            "from_the_future": {"a": [1, 2]},
            "spread": "wide",
            "reason": 7,
            "ranks": True,
            "policy": None,
            "updated_unix": "now",
            "effect": {"state": "kept"},
            "rebalance": [],
            "shares_version": "3",
            "body_version": BODY_VERSION + 1,
        }
    )
    assert body == DecisionBody(
        job="",
        version=5,
        active=True,
        delays={1: 0.02},
        shares_version=0,
        body_version=BODY_VERSION + 1,
    )


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ([1, 2], "not a JSON object"),
        ({"active": True, "delays": {}}, "integer 'version'"),
        ({"version": True, "active": True, "delays": {}}, "integer 'version'"),
        ({"version": 1, "active": 1, "delays": {}}, "boolean 'active'"),
        ({"version": 1, "active": True, "delays": []}, "'delays' object"),
        ({"version": 1, "active": True, "delays": {}, "body_version": "2"}, "body_version"),
    ],
)
def test_what_a_rank_needs_must_be_right(raw: Any, needle: str) -> None:
    with pytest.raises(DecisionError, match=needle):
        DecisionBody.from_json(raw)
    with pytest.raises(ValueError, match=needle):
        parse_decision(raw, 0, 0.05)


def test_a_bad_delay_costs_only_its_own_rank_and_only_while_active() -> None:
    raw = {"version": 4, "active": True, "delays": {"0": 0.01, "1": "x", "2": math.nan}}
    body = DecisionBody.from_json(raw)
    assert body.delay_for(0, 0.05) == 0.01
    for rank in (1, 2):
        with pytest.raises(DecisionError, match=f"rank {rank} is not a finite number"):
            body.delay_for(rank, 0.05)
        with pytest.raises(ValueError):
            deployed_parse_decision(raw, rank, 0.05)
    assert parse_decision({**raw, "active": False}, 1, 0.05) == (0.0, 4)
    assert parse_decision({"version": 1, "active": True, "delays": {"0": 10**400}}, 1, 0.05) == (
        0.0,
        1,
    )


@pytest.fixture
def started() -> Any:
    clients: list[PacingClient] = []
    yield clients
    for client in clients:
        client.stop()


def test_shares_that_the_old_client_choked_on_mean_equal_shares(
    started: list[PacingClient],
) -> None:
    """A share keyed by a non-ASCII digit made the old client's int() raise in its poll
    thread, after the decision was taken: the thread ended. Now: equal shares, delay kept."""
    raw = {"version": 2, "active": True, "delays": {"1": 0.02}, "shares": {"\u00b2": 1.0}}
    assert parse_shares(raw) == (None, 0)
    with pytest.raises(ValueError):
        deployed_parse_shares(raw)
    server = ScriptedServer(answer(200, json.dumps(raw).encode()))
    try:
        client = make_client(server.url)
        started.append(client)
        client.start()
        assert wait_for(lambda: client.polls_ok >= 2)
        assert client.current_delay() == (0.02, 2)
        assert client.current_shares() == (None, 0)
    finally:
        server.close()


def test_offsets_and_schedule_round_trip_and_give_each_rank_its_hold() -> None:
    within = DecisionBody(job="j", version=3, active=True, offsets={"dp1": 0.1})
    assert DecisionBody.from_json(wire(within.to_json())) == within
    assert within.hold_for(["dp1", "tp0"], 0.0, 0.05) == 0.05  # the rank's own cap
    assert within.hold_for(["dp1"], 0.0, 0.5) == 0.1
    assert within.hold_for(["dp0"], 0.0, 0.5) == 0.0  # not listed: no hold

    across = DecisionBody(
        job="a",
        version=4,
        active=True,
        schedule=Schedule(0.16, {"dp0": 0.0, "dp1": 0.052}),
        served_unix=1000.0,
    )
    assert DecisionBody.from_json(wire(across.to_json())) == across
    # Slot 0.052 of a 0.16 s period; at controller time 1000.0 (1000.0 mod 0.16 = 0.0) the
    # next slot is 0.052 away; just after it passed, no hold (late: run at once); before the
    # slot by more than half a period it is reached by waiting less than half a period.
    assert abs(across.hold_for(["dp1"], 1000.0, 0.5) - 0.052) < 1e-9
    assert across.hold_for(["dp1"], 1000.06, 0.5) == 0.0
    assert abs(across.hold_for(["dp0"], 1000.1, 0.5) - 0.06) < 1e-9
    assert across.hold_for(["tp"], 1000.0, 0.5) == 0.0
    assert replace(across, active=False).hold_for(["dp1"], 1000.0, 0.5) == 0.0


def test_a_malformed_schedule_or_offsets_cost_the_hold_only() -> None:
    body = {"version": 2, "active": True, "delays": {"0": 0.01}}
    for bad in (
        {"schedule": {"period_s": 0, "slots": {"dp0": 0.0}}},
        {"schedule": {"period_s": 0.1, "slots": {"dp0": 0.2}}},
        {"schedule": {"period_s": 0.1, "slots": {"dp0": -1}}},
        {"schedule": "soon"},
        {"offsets": {"dp0": "x"}},
        {"offsets": [0.1]},
    ):
        read = DecisionBody.from_json({**body, **bad})
        assert read.schedule is None and read.offsets is None
        assert read.hold_for(["dp0"], 0.0, 1.0) == 0.0
        assert read.delay_for(0, 1.0) == 0.01


def test_an_old_client_reads_a_body_with_a_schedule() -> None:
    # A rank of before this field parses delays with parse_decision and ignores the rest.
    new = DecisionBody(
        job="a",
        version=5,
        active=True,
        delays={1: 0.02},
        schedule=Schedule(0.2, {"dp0": 0.1}, late_s=0.02),
        served_unix=5.0,
    ).to_json()
    assert parse_decision(wire(new), 1, 0.05) == (0.02, 5)
    assert parse_decision(wire(new), 0, 0.05) == (0.0, 5)
    assert deployed_parse_decision(wire(new), 1, 0.05) == (0.02, 5)
    # A client of body version 2 reads the schedule without late_s: half a period.
    assert "late_s" in new["schedule"]
    version_2 = Schedule.from_json({k: v for k, v in new["schedule"].items() if k != "late_s"})
    assert version_2 == Schedule(0.2, {"dp0": 0.1}) and version_2.run_late_within() == 0.1


def test_a_step_later_than_late_s_waits_for_its_next_slot() -> None:
    body = DecisionBody(
        job="a", version=1, active=True, schedule=Schedule(0.2, {"dp0": 0.0}, late_s=0.02)
    )
    assert DecisionBody.from_json(wire(body.to_json())) == body
    # Controller time 1000.0 is slot 0 of a 0.2 s period (1000.0 mod 0.2 = 0).
    assert body.hold_for(["dp0"], 1000.0, 1.0) == pytest.approx(0.0, abs=1e-9)  # its slot
    assert body.hold_for(["dp0"], 1000.015, 1.0) == 0.0  # late by 15 ms: at once
    assert body.hold_for(["dp0"], 1000.03, 1.0) == pytest.approx(0.17)  # 30 ms: next slot
    # The rank's own cap: an early step holds as long as it allows; a late one that it
    # cannot hold to its next slot runs at once (holding part of the wait only delays it).
    assert body.hold_for(["dp0"], 1000.15, 0.01) == 0.01
    assert body.hold_for(["dp0"], 1000.03, 0.05) == 0.0
    assert body.hold_for(["dp0"], 1000.15, 1.0) == pytest.approx(0.05)  # early
    # A pacer of body version 2 (no late_s): a step late by up to half a period runs at once.
    before = replace(body, schedule=Schedule(0.2, {"dp0": 0.0}))
    assert before.hold_for(["dp0"], 1000.03, 1.0) == 0.0
    assert before.hold_for(["dp0"], 1000.09, 1.0) == 0.0
    assert before.hold_for(["dp0"], 1000.11, 1.0) == pytest.approx(0.09)
    # A malformed late_s costs only itself: the schedule stands, with half a period.
    for bad in (-0.01, 0.2, "soon", None, float("inf")):
        raw = {"period_s": 0.2, "slots": {"dp0": 0.0}, "late_s": bad}
        assert Schedule.from_json(raw) == Schedule(0.2, {"dp0": 0.0})


def _shared_uplink_steps(late_s: float | None, first_late_s: float) -> dict[str, int]:
    """Two jobs on one schedule (period 0.15 s, slots half a period apart) whose steps are
    0.05 s of compute then 0.06 s of all-reduce over an uplink they share (processor sharing:
    each at half rate while both transfer), stepped on a simulated clock through
    ``hold_for``; job A's first step starts ``first_late_s`` after its slot. Per job, the
    steps whose all-reduce overlapped the other's."""
    period, compute, transfer, dt = 0.15, 0.05, 0.06, 0.0002
    body = {
        job: DecisionBody(
            job=job, version=1, active=True, schedule=Schedule(period, {"g": slot}, late_s)
        )
        for job, slot in (("A", 0.0), ("B", period / 2))
    }
    # Per job: what it does, until when (or the bytes left, in seconds alone), its step.
    state = {"A": ["compute", first_late_s + compute, 0], "B": ["ask", period / 2, 0]}
    overlapped: dict[str, set[int]] = {"A": set(), "B": set()}
    now = 0.0
    while min(s[2] for s in state.values()) < 20:
        sharing = sum(s[0] == "transfer" for s in state.values())
        for job, s in state.items():
            if s[0] == "ask" and now >= s[1]:
                s[0], s[1] = "compute", now + body[job].hold_for(["g"], now, 1.0) + compute
            elif s[0] == "compute" and now >= s[1]:
                s[0], s[1] = "transfer", transfer
            elif s[0] == "transfer":
                s[1] -= dt / sharing
                if sharing > 1:
                    overlapped[job].add(s[2])
                if s[1] <= 0:
                    s[0], s[1], s[2] = "ask", now, s[2] + 1
        now += dt
    return {job: len(steps) for job, steps in overlapped.items()}


def test_a_collision_ends_in_one_slot_when_a_late_step_waits_for_its_next() -> None:
    """A step late by more than its turn's slack (0.01 s here) waits for its next slot: the
    collision its lateness starts ends with that step. Run at once while up to half a period
    late (body version 2), the collided steps (0.17 s against a 0.15 s period) start late
    again, and the collision carries on for steps."""
    for late in (0.04, 0.06, 0.08):
        assert _shared_uplink_steps(0.01, late) == {"A": 1, "B": 1}
    assert max(_shared_uplink_steps(None, late)["A"] for late in (0.04, 0.06, 0.08)) >= 3
