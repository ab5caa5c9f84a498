"""The remedies' pure functions (issue 46): skewtrace.remedy.work_split and .partition.

What the simulations of tests/test_remedies_sim.py and benchmarks/remedies.py measure is these
functions; here each is checked against its definition: the split covers the batch once,
gives every part a sample, is deterministic and follows the weights; the partition and the
advice are the best ones an exhaustive search finds; the fit recovers the coefficients it was
fed; the 1F1B replay equals the closed form where there is one.
"""

from __future__ import annotations

import itertools
import random

import pytest

from skewtrace.remedy.partition import (
    advise_partition,
    best_partition,
    replay_1f1b,
    stage_costs,
)
from skewtrace.remedy.work_split import CostFit, TokenCost, split_by_count, split_by_work


def _lengths(rng: random.Random, n: int) -> list[int]:
    return [min(max(round(rng.lognormvariate(6.24, 1.0)), 16), 8192) for _ in range(n)]


# -- split_by_work ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("samples,parts", [(64, 8), (64, 64), (256, 32), (9, 4), (3, 5)])
def test_split_covers_every_sample_once_and_fills_every_part(
    seed: int, samples: int, parts: int
) -> None:
    cost = TokenCost.with_crossover(2048)
    costs = [cost(t) for t in _lengths(random.Random(seed), samples)]
    split = split_by_work(costs, parts)
    assert len(split) == parts
    assert sorted(i for part in split for i in part) == list(range(samples))
    assert all(part == sorted(part) for part in split)
    if samples >= parts:
        assert all(part for part in split)


@pytest.mark.parametrize("seed", range(5))
def test_split_is_deterministic_and_independent_of_the_callers_random_state(seed: int) -> None:
    costs = [TokenCost.with_crossover(2048)(t) for t in _lengths(random.Random(seed), 64)]
    first = split_by_work(costs, 8)
    random.seed(12345)  # what a training script does on every rank, differently or not
    random.random()
    assert split_by_work(list(costs), 8) == first
    assert split_by_work(tuple(costs), 8) == first


def test_split_ties_go_to_the_lower_part() -> None:
    assert split_by_work([1.0] * 4, 2) == [[0, 2], [1, 3]]
    assert split_by_work([1.0, 1.0], 4) == [[0], [1], [], []]


@pytest.mark.parametrize("seed", range(5))
def test_split_balances_better_than_equal_counts(seed: int) -> None:
    cost = TokenCost.with_crossover(2048)
    costs = [cost(t) for t in _lengths(random.Random(seed), 64)]

    def slowest(split: list[list[int]]) -> float:
        return max(sum(costs[i] for i in part) for part in split)

    by_work, by_count = slowest(split_by_work(costs, 8)), slowest(split_by_count(64, 8))
    assert by_work <= by_count
    # LPT: within 4/3 of the best makespan, which is at least the mean part and the largest sample
    assert by_work <= 4 / 3 * max(sum(costs) / 8, max(costs)) + 1e-9


def test_split_follows_the_weights() -> None:
    costs = [1.0] * 120
    split = split_by_work(costs, 3, weights=[1.0, 2.0, 3.0])
    assert [len(p) for p in split] == [20, 40, 60]
    rng = random.Random(7)
    costs = [rng.uniform(1, 2) for _ in range(600)]
    weights = [1.0, 1.0, 2.0, 4.0]
    work = [sum(costs[i] for i in p) for p in split_by_work(costs, 4, weights=weights)]
    for w, share in zip(work, weights, strict=True):
        assert w / sum(work) == pytest.approx(share / sum(weights), abs=0.01)


def test_split_refuses_what_it_cannot_split() -> None:
    with pytest.raises(ValueError):
        split_by_work([1.0], 0)
    with pytest.raises(ValueError):
        split_by_work([1.0], 2, weights=[1.0])
    with pytest.raises(ValueError):
        split_by_work([1.0], 1, weights=[0.0])
    with pytest.raises(ValueError):
        split_by_work([-1.0], 1)


def test_split_by_count_is_consecutive_slices() -> None:
    assert split_by_count(10, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert split_by_count(64, 8)[7] == list(range(56, 64))


def test_token_cost_crossover() -> None:
    cost = TokenCost.with_crossover(2048)
    assert cost.quadratic * 2048 * 2048 == pytest.approx(cost.linear * 2048)
    assert cost(2048) == pytest.approx(2 * 2048)
    assert cost.of_batch([512, 2048]) == pytest.approx(cost(512) + cost(2048))


# -- best_partition ---------------------------------------------------------------------------


def exhaustive(costs: list[float], stages: int) -> list[tuple[int, ...]]:
    """Every contiguous partition of ``costs`` into ``stages`` non-empty stages."""
    n = len(costs)
    out = []
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        out.append(tuple(b - a for a, b in itertools.pairwise(bounds)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_best_partition_is_the_exhaustive_minimum(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 11)
    stages = rng.randint(1, min(n, 5))
    costs = [rng.choice((rng.uniform(0.1, 3.0), float(rng.randint(1, 4)))) for _ in range(n)]
    advice = best_partition(costs, stages)
    everything = exhaustive(costs, stages)
    least = min(max(stage_costs(costs, p)) for p in everything)
    assert advice.slowest == pytest.approx(least, rel=1e-12)
    assert advice.layers in everything
    assert advice.costs == stage_costs(costs, advice.layers)

    # and its tie-breaks: the least sum of squares, then the smallest counts
    def key(p: tuple[int, ...]) -> tuple[float, float, tuple[int, ...]]:
        c = stage_costs(costs, p)
        return (round(max(c), 9), round(sum(x * x for x in c), 9), p)

    assert advice.layers == min(everything, key=key)


def test_best_partition_of_the_headed_model() -> None:
    costs = [1.0] * 16 + [1.6]
    advice = best_partition(costs, 4)
    assert advice.slowest == pytest.approx(5.0)
    assert advice.layers == (4, 4, 5, 4)
    assert advice.split_points == (4, 8, 13)
    assert best_partition([1.0] * 16, 4).layers == (4, 4, 4, 4)


def test_best_partition_refuses_what_it_cannot_partition() -> None:
    with pytest.raises(ValueError):
        best_partition([1.0, 2.0], 3)
    with pytest.raises(ValueError):
        best_partition([1.0], 0)
    with pytest.raises(ValueError):
        best_partition([float("nan"), 1.0], 1)


# -- advise_partition -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_advise_partition_is_the_exhaustive_best_by_its_rule(seed: int) -> None:
    """The least slowest stage, then the shortest 1F1B replay, then the least sum of squares,
    then the smallest counts: by brute force over every contiguous partition (integer costs
    make ties common, so the tie-breaks are exercised)."""
    rng = random.Random(1000 + seed)
    n = rng.randint(2, 11)
    stages = rng.randint(1, min(n, 5))
    microbatches = rng.choice((1, 2, 4, 8))
    forward = [float(rng.randint(1, 3)) for _ in range(n)]
    backward = [f * rng.choice((1.0, 2.0, 2.5)) for f in forward]
    costs = [f + b for f, b in zip(forward, backward, strict=True)]
    advice = advise_partition(forward, backward, stages, microbatches)
    everything = exhaustive(costs, stages)

    def replayed(p: tuple[int, ...]) -> float:
        f = [c / microbatches for c in stage_costs(forward, p)]
        b = [c / microbatches for c in stage_costs(backward, p)]
        return replay_1f1b(f, b, microbatches)

    def key(p: tuple[int, ...]) -> tuple[float, float, float, tuple[int, ...]]:
        c = stage_costs(costs, p)
        return (round(max(c), 9), round(replayed(p), 9), round(sum(x * x for x in c), 9), p)

    assert advice.layers == min(everything, key=key)
    assert advice.costs == stage_costs(costs, advice.layers)
    assert advice.slowest == pytest.approx(best_partition(costs, stages).slowest, rel=1e-12)


def test_advise_partition_of_the_headed_model() -> None:
    """16 equal layers and a head of 1.6 (backward twice the forward): 5/4/4/4 from 8
    micro-batches on, not the most even tie 4/4/5/4; 5/5/4/3 at 4."""
    forward = [1.0] * 16 + [1.6]
    backward = [2 * f for f in forward]
    for microbatches in (8, 16, 32):
        advice = advise_partition(forward, backward, 4, microbatches)
        assert advice.layers == (5, 4, 4, 4) and advice.split_points == (5, 9, 13)
    assert advise_partition(forward, backward, 4, 4).layers == (5, 5, 4, 3)
    assert advise_partition([1.0] * 16, [2.0] * 16, 4, 8).layers == (4, 4, 4, 4)


# -- CostFit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("linear,quadratic", [(2e-6, 1e-9), (1e-6, 0.0), (0.0, 3e-10)])
def test_cost_fit_recovers_the_coefficients(linear: float, quadratic: float) -> None:
    rng = random.Random(3)
    fit = CostFit()
    intercept = 0.004
    for _ in range(200):
        lengths = _lengths(rng, 8)
        seconds = intercept + sum(linear * t + quadratic * t * t for t in lengths)
        assert fit.observe(lengths, seconds * rng.uniform(0.999, 1.001))
    model = fit.model()
    assert model is not None
    assert model.linear == pytest.approx(linear, rel=0.05, abs=2e-8)
    assert model.quadratic == pytest.approx(quadratic, rel=0.05, abs=2e-12)


def test_cost_fit_merged_statistics_equal_one_fit() -> None:
    rng = random.Random(4)
    one, parts = CostFit(), [CostFit(), CostFit()]
    for k in range(40):
        lengths = _lengths(rng, 8)
        seconds = 0.002 + sum(1e-6 * t + 5e-10 * t * t for t in lengths)
        one.observe(lengths, seconds)
        parts[k % 2].observe(lengths, seconds)
    summed = [a + b for a, b in zip(parts[0].statistics(), parts[1].statistics(), strict=True)]
    merged = CostFit.merged(summed).model()
    assert merged is not None and one.model() is not None
    assert merged.linear == pytest.approx(one.model().linear, rel=1e-9)
    assert merged.quadratic == pytest.approx(one.model().quadratic, rel=1e-9)


def test_cost_fit_waits_for_enough_observations() -> None:
    fit = CostFit(min_observations=8)
    for t in range(7):
        fit.observe([100 * (t + 1)], 0.001 * (t + 1))
    assert fit.model() is None
    assert not fit.observe([], 1.0)
    assert not fit.observe([10], float("nan"))


# -- replay_1f1b ------------------------------------------------------------------------------


@pytest.mark.parametrize("stages", [1, 2, 4, 8])
@pytest.mark.parametrize("microbatches", [1, 3, 8, 16, 32])
def test_replay_equals_the_closed_form_for_equal_stages(stages: int, microbatches: int) -> None:
    f, b = 1.25, 2.5
    step = replay_1f1b([f] * stages, [b] * stages, microbatches)
    assert step == pytest.approx((microbatches + stages - 1) * (f + b), rel=1e-12)


def test_replay_prices_the_headed_model() -> None:
    costs = [1.0] * 16 + [1.6]
    before = stage_costs(costs, (4, 4, 4, 5))
    after = best_partition(costs, 4).costs
    for microbatches, gain in ((8, 0.088), (16, 0.102), (32, 0.110)):
        old = replay_1f1b(list(before), [2 * c for c in before], microbatches)
        new = replay_1f1b(list(after), [2 * c for c in after], microbatches)
        assert old / new - 1 == pytest.approx(gain, abs=0.001), microbatches
