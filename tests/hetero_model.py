"""A closed-loop model of a synchronous job on ranks of unequal speed, driving a real policy.

Used by ``tests/test_pacer_rebalance.py`` and, for 8 and 64 ranks, by
``benchmarks/rebalance.py``. It is a model, not a measurement: each step every rank's own work
is a per-step cost that does not depend on its batch (``fixed_s``) plus its share of the
global batch times the work of the whole batch at unit speed over its speed, with
multiplicative noise and optional jitter; a pacing delay comes on top. The step ends when the
latest rank is done plus a transfer. From these the model derives what the Collector would
export (per-rank step time, wait at the barrier, lateness) and hands the policy object the
pacer's window of them, ``metrics_lag_s`` late, every ``tick_s``; the decision reaches the
ranks one poll later, and shares take effect at the next sync point (every ``sync_every``
steps), as :class:`skewtrace.rank.rebalance_sampler.ShareSampler` applies them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skewtrace.controller.policies.base import ControllerPolicy, Outcome
from skewtrace.controller.window import JobWindow, RankWindow
from skewtrace.rank.rebalance_sampler import batch_sizes


@dataclass
class HeteroJob:
    speeds: Sequence[float]
    """Relative speed per rank (1: nominal)."""
    batch_work_s: float = 0.4
    """Work of the whole global batch on one rank at speed 1 (equal shares: this / ranks)."""
    global_batch: int = 1024
    fixed_s: float = 0.004
    """Per-step own work that does not depend on the batch (optimizer, launch overheads)."""
    transfer_s: float = 0.004
    noise: float = 0.02
    """Relative standard deviation of each rank's work per step."""
    jitter_s: Mapping[int, float] = field(default_factory=dict)
    """Rank -> uniform 0..amount seconds added to its work per step."""
    speed_changes: Sequence[tuple[float, int, float]] = ()
    """(time, rank, new speed): e.g. a throttled part that recovers."""


@dataclass
class Sample:
    t: float
    step_s: float
    samples: int


@dataclass
class ModelRun:
    steps: list[Sample] = field(default_factory=list)
    decisions: list[tuple[float, Outcome]] = field(default_factory=list)
    applied_shares: list[tuple[float, list[float]]] = field(default_factory=list)
    applied_delays: list[tuple[float, list[float]]] = field(default_factory=list)

    def throughput(self, start: float = 0.0, end: float = math.inf) -> float:
        chosen = [s for s in self.steps if start <= s.t < end]
        total = sum(s.step_s for s in chosen)
        return sum(s.samples for s in chosen) / total if total > 0 else 0.0

    def share_changes(self) -> list[tuple[float, list[float]]]:
        return self.applied_shares[1:]

    def final_shares(self) -> list[float]:
        return self.applied_shares[-1][1]


@dataclass
class _Record:
    t: float
    step_s: float
    wait_s: float
    lateness_s: float


def run(
    job: HeteroJob,
    policy: ControllerPolicy,
    duration_s: float,
    *,
    seed: int = 1,
    window_s: float = 4.0,
    tick_s: float = 0.5,
    metrics_lag_s: float = 2.0,
    poll_lag_s: float = 0.5,
    sync_every: int = 8,
) -> ModelRun:
    """Run ``job`` under ``policy`` for ``duration_s`` seconds of job time."""
    rng = random.Random(seed)
    count = len(job.speeds)
    speeds = list(job.speeds)
    changes = sorted(job.speed_changes)
    result = ModelRun()
    shares = [1.0 / count] * count
    delays = [0.0] * count
    result.applied_shares.append((0.0, list(shares)))
    records: list[list[_Record]] = [[] for _ in range(count)]
    published: list[tuple[float, Outcome]] = []  # (time ranks see it, outcome)
    delay_log: list[tuple[float, list[float]]] = [(0.0, [0.0] * count)]
    state: Any = policy.initial_state()
    t, next_tick, step = 0.0, tick_s, 0
    pending_shares: list[float] | None = None
    while t < duration_s:
        while changes and changes[0][0] <= t:
            _, rank, speed = changes.pop(0)
            speeds[rank] = speed
        # What the ranks have read by now (one poll after the decision).
        while published and published[0][0] <= t:
            _, outcome = published.pop(0)
            delays = [outcome.delays.get(r, 0.0) for r in range(count)]
            if outcome.shares is not None:
                pending_shares = (
                    [outcome.shares[r] for r in range(count)]
                    if set(outcome.shares) == set(range(count))
                    else [1.0 / count] * count
                )
            result.applied_delays.append((t, list(delays)))
        if step % sync_every == 0 and pending_shares is not None and pending_shares != shares:
            shares = pending_shares
            result.applied_shares.append((t, list(shares)))
        sizes = batch_sizes(shares, job.global_batch)
        own = []
        for rank in range(count):
            work = job.fixed_s + sizes[rank] / job.global_batch * job.batch_work_s / speeds[rank]
            work *= max(0.0, 1.0 + rng.gauss(0.0, job.noise))
            work += rng.uniform(0.0, job.jitter_s.get(rank, 0.0))
            own.append(work)
        arrival = [own[r] + delays[r] for r in range(count)]
        latest, earliest = max(arrival), min(arrival)
        step_s = latest + job.transfer_s
        for rank in range(count):
            records[rank].append(
                _Record(t, step_s, latest - arrival[rank], arrival[rank] - earliest)
            )
        result.steps.append(Sample(t, step_s, job.global_batch))
        t += step_s
        step += 1
        while next_tick <= t:
            visible_end = next_tick - metrics_lag_s
            window = _window(records, visible_end - window_s, visible_end, delay_log, next_tick)
            outcome = policy.decide(window, state)
            state = outcome.state
            result.decisions.append((next_tick, outcome))
            published.append((next_tick + poll_lag_s, outcome))
            delay_log.append((next_tick, [outcome.delays.get(r, 0.0) for r in range(count)]))
            next_tick += tick_s
    return result


def _window(
    records: list[list[_Record]],
    start: float,
    end: float,
    delay_log: list[tuple[float, list[float]]],
    now: float,
) -> JobWindow:
    ranks: dict[int, RankWindow] = {}
    for rank, mine in enumerate(records):
        chosen = [r for r in mine if start <= r.t < end]
        if not chosen:
            continue
        ranks[rank] = RankWindow(
            steps=len(chosen),
            step_time_sum_s=sum(r.step_s for r in chosen),
            wait_sum_s=sum(r.wait_s for r in chosen),
            lateness_sum_s=sum(r.lateness_s for r in chosen),
            applied_delay_s=_mean_published(delay_log, rank, now - (end - start), now),
        )
    return JobWindow(now=now, ranks=ranks)


def _mean_published(
    log: list[tuple[float, list[float]]], rank: int, start: float, end: float
) -> float:
    """Time-weighted mean of the delay published for ``rank`` over [start, end], as the
    pacer's windows compute it."""
    weighted = 0.0
    for index, (at, delays) in enumerate(log):
        until = log[index + 1][0] if index + 1 < len(log) else end
        lo, hi = max(at, start), min(until, end)
        if hi > lo:
            weighted += delays[rank] * (hi - lo)
    return weighted / (end - start) if end > start else 0.0


def ideal_throughput(job: HeteroJob) -> float:
    """The homogeneous job's throughput (every rank at speed 1, equal shares, no noise) times
    the sum of the speeds over the rank count: the sum of the ranks' individual speeds."""
    count = len(job.speeds)
    homogeneous_step = job.fixed_s + job.batch_work_s / count + job.transfer_s
    return job.global_batch / homogeneous_step * sum(job.speeds) / count
