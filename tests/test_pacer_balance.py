"""The work-balance policy (``--policy balance``, skewtrace.controller.policies.balance): each
global batch split by work while the Collector flags a ``data_imbalance``, kept only while the
effect guard measures a real gain, and what the ranks are served of it.

Synthetic closed loop: the job's step time is ``count_s`` while its batches are split by count
(and then the Collector flags the imbalance) and ``work_s`` while they are split by work (and
then it does not), with noise; the window at a phase's end sees only that phase's steps.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import pytest

from skewtrace.controller.policies import build_policy
from skewtrace.controller.policies.balance import BalanceParams, BalancePolicy
from skewtrace.controller.publish import publish
from skewtrace.controller.window import REASON_DATA_IMBALANCE, JobWindow, RankWindow
from skewtrace.decision import DecisionBody
from skewtrace.rank.pacing_client import PacingClient, as_rank_pacer

TICK_S = 0.5
PARAMS = BalanceParams(
    balance_effect_pairs=3, balance_effect_phase_s=5.0, balance_effect_backoff_s=60.0
)


def window(now: float, step_s: float, flagged: bool) -> JobWindow:
    ranks = {r: RankWindow(40, 40 * step_s, 0.0, 0.0) for r in range(4)}
    declines = (REASON_DATA_IMBALANCE,) if flagged else ()
    return JobWindow(now=now, ranks=ranks, declines=declines)


def run(
    count_s: float,
    work_s: float,
    seconds: float,
    *,
    flag_from: float = 2.0,
    policy: str = "balance",
    noise: float = 0.01,
) -> list[tuple[float, Any]]:
    """(time, outcome) of every tick; the steps follow the split last published."""
    rng = random.Random(3)
    chosen = build_policy(policy, [PARAMS])
    state = chosen.initial_state()
    split = "count"
    out = []
    t = 0.0
    while t < seconds:
        step = (work_s if split == "work" else count_s) * (1 + rng.gauss(0, noise))
        flagged = t >= flag_from and split != "work"
        outcome = chosen.decide(window(t, step, flagged), state)
        state = outcome.state
        split = outcome.balance or "count"
        out.append((t, outcome))
        t += TICK_S
    return out


def test_by_count_until_a_data_imbalance_is_flagged() -> None:
    policy = BalancePolicy(PARAMS)
    state = policy.initial_state()
    quiet = policy.decide(window(0.0, 0.1, False), state)
    assert (quiet.balance, quiet.reason) == ("count", "balanced")
    asked = policy.decide(window(1.0, 0.1, True), quiet.state)
    assert (asked.balance, asked.reason) == ("work", "balancing")
    # The imbalance gone (the remedy's own effect) is not the cause's end: still by work.
    after = policy.decide(window(2.0, 0.08, False), asked.state)
    assert after.balance == "work"


def test_the_split_by_work_is_kept_with_a_real_gain() -> None:
    ticks = run(count_s=0.120, work_s=0.100, seconds=45.0)
    before = [o for t, o in ticks if t < 2.0]
    assert all(o.balance == "count" and "effect" not in o.info for o in before)
    # The guard's first phase withholds it (by count), then alternates; three pairs of 5 s.
    first = next(t for t, o in ticks if o.reason == "measuring")
    assert first == pytest.approx(2.0)
    last = ticks[-1][1]
    effect = last.info["effect"]
    assert effect["state"] == "kept" and effect["pairs"] == 3
    assert effect["gain"] == pytest.approx(1 - 100 / 120, abs=0.02)
    assert last.balance == "work" and last.reason == "balancing"


@pytest.mark.parametrize("work_s", [0.120, 0.130], ids=["no_gain", "harm"])
def test_a_split_that_does_not_pay_is_withheld(work_s: float) -> None:
    ticks = run(count_s=0.120, work_s=work_s, seconds=45.0)
    last = ticks[-1][1]
    assert last.info["effect"]["state"] == "no_gain"
    assert last.balance == "count" and last.reason == "no_gain"


def test_the_body_serves_the_split_and_its_version_changes_exactly_with_it() -> None:
    ticks = run(count_s=0.120, work_s=0.100, seconds=45.0)
    published = None
    versions: list[tuple[str | None, int | None]] = []
    for _, outcome in ticks:
        published = publish("job", "balance", outcome, published, lambda: 1.0)
        body = DecisionBody.from_json(published.json)
        versions.append((body.balance, body.balance_version))
        assert published.json["balance"] == body.balance
        # Nothing for pacing's readers: no delay, never active.
        assert body.active is False and dict(body.delays) == {}
    changes = sum(1 for a, b in itertools.pairwise(versions) if a[0] != b[0])
    assert versions[-1][1] == 1 + changes  # 1: the first body's "count"
    for a, b in itertools.pairwise(versions):
        assert (a[0] == b[0]) == (a[1] == b[1])


def test_a_body_without_a_split_or_with_a_bad_one_reads_as_none() -> None:
    base = {"job": "j", "version": 1, "active": False, "delays": {}}
    assert DecisionBody.from_json(base).balance is None
    assert DecisionBody.from_json({**base, "balance": "tokens"}).balance is None
    assert DecisionBody.from_json({**base, "balance": 1}).balance is None
    body = DecisionBody.from_json({**base, "balance": "work", "balance_version": "x"})
    assert (body.balance, body.balance_version) == ("work", 0)


def test_the_rank_client_reads_the_split_and_fails_open() -> None:
    client = PacingClient("http://127.0.0.1:9", "j", 0, max_delay_s=0.05, stale_after_s=5.0)
    assert client.current_balance() == (None, 0)
    body = DecisionBody.from_json(
        {
            "job": "j",
            "version": 3,
            "active": False,
            "delays": {},
            "balance": "work",
            "balance_version": 2,
        }
    )
    client._latest_body = (body, time.monotonic())
    assert client.current_balance() == ("work", 2)
    client._latest_body = (body, time.monotonic() - 10.0)  # stale
    assert client.current_balance() == (None, 0)

    class UserSource:
        def current_delay(self) -> tuple[float, int]:
            return 0.0, 0

    assert as_rank_pacer(UserSource()).current_balance() == (None, 0)


def test_with_pacing_pacing_stays_out_of_the_imbalance_and_the_split_is_composed() -> None:
    ticks = run(count_s=0.120, work_s=0.100, seconds=45.0, policy="pacing,balance")
    for _, outcome in ticks:
        assert not any(d > 0 for d in outcome.delays.values())
    assert ticks[-1][1].balance == "work"
    # Pacing never measured anything (it declined throughout): the effect served is the
    # split's (a block both guards add would be the later one's under its name).
    assert ticks[-1][1].info["effect"]["state"] == "kept"
