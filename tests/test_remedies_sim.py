"""The remedies' proof in simulated time (issue 46): their gains on the step simulator.

The jobs (tests/whatif/remedies.py) are the what-if generator's, generated twice from the same
seed, as they are and with the product's remedy applied (the same samples, the same jitter);
every figure is simulated time, so deterministic: the seeds fix it. benchmarks/remedies.py
prints the same figures beside their targets.

- data-parallel, 8 ranks, 64 log-normal sequences a step: split_by_work over equal counts at
  least +20% on each of 5 seeds (about +38% on average: tests/whatif/remedies.py states the
  timings);
- a 4-stage pipeline of 16 equal layers and a loss head (1.4x on the last stage): the advice
  (advise_partition: the least slowest stage, then the shortest 1F1B replay) is what an
  exhaustive search of the 560 contiguous partitions finds, and on the generator it is the
  fastest of the partitions with the least slowest stage on every seed; priced by the
  product's replay_1f1b it gains +12.6% at 16 micro-batches (+13.1% at 8, +12.3% at 32). On
  the generator at the stated timings (tests/whatif/remedies.py STAGE_TIMINGS: a 7B-class
  layer, 32 MiB messages, a quarter of a 7B model's collectives), with its point-to-point
  transfers, host gaps, jitter and the data-parallel collectives, it gains at least +10% on
  each of 5 seeds at 16 micro-batches (+10.6%, +10.5..+10.8%). The target depends on the
  ratio of compute to what does not move: at the generator's default timings it is about
  +9.2% (below the target; benchmarks/remedies.py prints the sensitivity);
- balanced jobs (equal lengths; equal layers, no head): neither remedy changes the step.
"""

from __future__ import annotations

import statistics

import pytest

from skewtrace.remedy.partition import (
    advise_partition,
    replay_1f1b,
    stage_costs,
    tied_partitions,
)
from whatif.generate import (
    JobSpec,
    Layers,
    TokenLengths,
    generate,
    token_lengths,
    token_split,
    with_remedy,
)
from whatif.remedies import (
    AS_IS,
    COMPUTE_ONLY,
    HEADED,
    SEEDS,
    STAGE_MICROBATCHES,
    STAGE_TIMINGS,
    data_job,
    exhaustive_best,
    measure,
    over_seeds,
    partitions,
    stage_job,
)


def test_five_seeds() -> None:
    assert len(SEEDS) == 5


# -- data -------------------------------------------------------------------------------------


def test_split_by_work_gains_at_least_20_percent_on_each_seed() -> None:
    gains = [g.gain for g in over_seeds(data_job)]
    assert min(gains) >= 0.20, gains
    assert statistics.mean(gains) == pytest.approx(0.376, abs=0.01)  # the figure documented


def test_both_runs_see_the_same_samples_and_the_same_jitter() -> None:
    spec = data_job(1, steps=3)
    remedied = with_remedy(spec)
    (cause,) = spec.causes
    (balanced,) = remedied.causes
    assert isinstance(cause, TokenLengths) and isinstance(balanced, TokenLengths)
    assert not cause.balanced and balanced.balanced
    for step in range(3):
        lengths = token_lengths(spec, cause, step)
        assert lengths == token_lengths(remedied, balanced, step)
        assert all(16 <= t <= 8192 for t in lengths) and len(lengths) == 64
        for split in (token_split(spec, cause, lengths), token_split(remedied, balanced, lengths)):
            assert sorted(i for part in split for i in part) == list(range(64))
            assert all(part for part in split)
        assert token_split(spec, cause, lengths) == [
            list(range(r * 8, r * 8 + 8)) for r in range(8)
        ]
    # Everything but the forward and backward is the same op for op: the same jitter (to the
    # microsecond: the rows round each start and end on its own).
    before, after = generate(spec), generate(remedied)
    for optype in ("optimizer", "dataloader", "optimizer-clip-main-grad"):
        ours, theirs = (
            [(r.rank, r.step, r.duration) for r in job.rows if r.optype == optype]
            for job in (before, after)
        )
        assert len(ours) == len(theirs) == 8 * 3
        for a, b in zip(ours, theirs, strict=True):
            assert a[:2] == b[:2] and abs(a[2] - b[2]) <= 1, optype


def test_split_moves_work_between_replicas_not_samples_out_of_the_batch() -> None:
    spec = JobSpec(
        "pp-tokens", dp=2, pp=2, microbatches=4, steps=2, seed=3, causes=(TokenLengths(samples=32),)
    )
    (cause,) = with_remedy(spec).causes
    assert isinstance(cause, TokenLengths)
    lengths = token_lengths(spec, cause, 0)
    split = token_split(spec, cause, lengths)
    assert len(split) == 8 and all(part for part in split)
    work = [sum(cause.cost(lengths[i]) for i in part) for part in split]
    replicas = [sum(work[:4]), sum(work[4:])]
    counts = token_split(spec, spec.causes[0], lengths)  # type: ignore[arg-type]
    counted = [
        sum(cause.cost(lengths[i]) for p in counts[r * 4 : r * 4 + 4] for i in p) for r in range(2)
    ]
    assert max(replicas) <= max(counted)
    assert sum(replicas) == pytest.approx(sum(counted))


# -- stage ------------------------------------------------------------------------------------


UNIT = STAGE_TIMINGS["forward"] / (sum(HEADED) / 4)
"""Seconds of forward a micro-batch per unit of layer cost in the stage job (backward: twice)."""


def advice(microbatches: int = STAGE_MICROBATCHES) -> tuple[int, ...]:
    """The product's advice for the headed model, from each layer's forward and backward
    seconds a step as the Collector gets them from the ranks' profiles (no transfer)."""
    return advise_partition(
        [c * UNIT * microbatches for c in HEADED],
        [2 * c * UNIT * microbatches for c in HEADED],
        4,
        microbatches,
    ).layers


def priced(layers: tuple[int, ...], microbatches: int = STAGE_MICROBATCHES) -> float:
    """1F1B replayed in units of layer cost (backward twice the forward), no transfer."""
    costs = stage_costs(HEADED, layers)
    return replay_1f1b(list(costs), [2 * c for c in costs], microbatches)


def test_the_advice_is_the_exhaustive_best() -> None:
    every = partitions(len(HEADED), 4)
    assert len(every) == 560  # C(16, 3)
    slowest = {p: max(stage_costs(HEADED, p)) for p in every}
    least = min(slowest.values())
    ties = sorted(p for p in every if slowest[p] <= least * (1 + 1e-12))
    assert least == pytest.approx(5.0) and len(ties) == 10
    assert ties == tied_partitions(HEADED, 4)
    # the least slowest stage, among those the shortest 1F1B replay (270.6 units at 16
    # micro-batches, three of them), then the most even (least sum of squares)
    replays = {p: priced(p) for p in ties}
    shortest = min(replays.values())
    fastest = [p for p in ties if replays[p] <= shortest * (1 + 1e-12)]
    assert fastest == [(5, 4, 4, 4), (5, 5, 3, 4), (5, 5, 4, 3)]
    assert shortest == pytest.approx(270.6)

    def squares(p: tuple[int, ...]) -> float:
        return sum(c * c for c in stage_costs(HEADED, p))

    assert min(fastest, key=squares) == (5, 4, 4, 4)
    assert advice() == (5, 4, 4, 4) == exhaustive_best(HEADED, 4)[2]
    assert max(stage_costs(HEADED, advice())) == least
    assert advice(8) == advice(32) == advice()
    # the advice is the generator's remedy
    (layers,) = with_remedy(stage_job(1)).causes
    assert isinstance(layers, Layers) and layers.partition == advice()


GENERATOR_TIE = 1e-3
"""Two partitions' simulated step times closer than this share of the step are a tie."""


def test_the_advice_is_the_fastest_tied_partition_on_the_generator() -> None:
    """The job itself: generated with each of the 10 partitions with the least slowest stage
    (and as it is), the advice is the fastest on every seed. (Over all 560 partitions, seed
    1: benchmarks/remedies.py; the advice is the fastest there too.) Measured margin: the next,
    (5, 5, 4, 3), is about 0.9% slower; a tie within 0.1% would pass."""
    ties = tied_partitions(HEADED, 4)
    for seed in SEEDS:
        times = {
            p: statistics.mean(generate(stage_job(seed, partition=p, steps=3)).step_times.values())
            for p in [*ties, AS_IS]
        }
        fastest = min(times.values())
        assert times[advice()] <= fastest * (1 + GENERATOR_TIE), (seed, times)
        assert times[AS_IS] > max(times[p] for p in ties), seed


@pytest.mark.parametrize("microbatches", [8, 16])
def test_the_generator_at_compute_only_is_replay_1f1b(microbatches: int) -> None:
    """With every timing but the forward and backward at zero, the generator plays exactly the
    1F1B the product prices its advice with."""
    for layers in (AS_IS, advice(microbatches)):
        job = generate(
            stage_job(1, microbatches=microbatches, partition=layers, steps=2, **COMPUTE_ONLY)
        )
        replayed = priced(layers, microbatches) * UNIT
        for step_s in job.step_times.values():
            assert step_s == pytest.approx(replayed, rel=1e-9)


@pytest.mark.parametrize(("microbatches", "gain"), [(8, 0.131), (16, 0.126), (32, 0.123)])
def test_the_advice_priced_by_replay_1f1b(microbatches: int, gain: float) -> None:
    """The product's price of the advice: above +12% from 8 micro-batches on (a heavy last
    stage costs 1F1B more than a heavy first one, so it exceeds 5.6 / 5.0 - 1 at few
    micro-batches and falls toward it as the bubble vanishes)."""
    bare = measure(stage_job(1, microbatches=microbatches, steps=2, **COMPUTE_ONLY))
    assert bare.gain == pytest.approx(gain, abs=0.001)
    assert bare.gain == pytest.approx(
        priced(AS_IS, microbatches) / priced(advice(microbatches), microbatches) - 1, rel=1e-9
    )
    assert bare.gain >= 0.10


def test_the_stage_target_on_the_generator() -> None:
    """Issue 46: at least +10% on each of 5 seeds at 16 micro-batches, at the stated timings
    (tests/whatif/remedies.py STAGE_TIMINGS)."""
    gains = [g.gain for g in over_seeds(stage_job)]
    assert min(gains) >= 0.10, gains
    assert statistics.mean(gains) == pytest.approx(0.106, abs=0.002)  # the figure documented


def test_the_stage_gain_depends_on_the_compute_to_message_ratio() -> None:
    """At the generator's default timings (a unit of layer cost about 0.9 ms forward a
    micro-batch, 0.4 ms transfers) the advice gains about +9.2%, under the target; with more
    compute per message, more (documented: +10.8% at 2x, +11.7% at 4x; seed 1 here)."""
    gains = {
        scale: measure(stage_job(1, timings={}, compute_scale=scale)).gain
        for scale in (1.0, 2.0, 4.0)
    }
    assert gains[1.0] == pytest.approx(0.092, abs=0.003) and gains[1.0] < 0.10
    assert gains[2.0] == pytest.approx(0.108, abs=0.003)
    assert gains[4.0] == pytest.approx(0.117, abs=0.003)


# -- balanced ---------------------------------------------------------------------------------


def test_balanced_jobs_are_unchanged_by_either_remedy() -> None:
    for gain in over_seeds(lambda s: data_job(s, sigma=0.0, steps=5)):
        assert abs(gain.gain) <= 0.01
    for gain in over_seeds(
        lambda s: stage_job(s, costs=(1.0,) * 16, partition=(4, 4, 4, 4), steps=3)
    ):
        assert abs(gain.gain) <= 0.01


def test_layers_refuse_a_partition_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError):
        JobSpec("x", dp=1, pp=4, causes=(Layers(costs=HEADED, partition=(8, 9)),))
