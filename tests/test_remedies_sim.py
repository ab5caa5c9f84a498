"""The remedies' proof in simulated time (issue 46): their gains on the step simulator.

The jobs (tests/whatif/remedies.py) are the what-if generator's, generated twice from the same
seed, as they are and with the product's remedy applied (the same samples, the same jitter);
every figure is simulated time, so deterministic: the seeds fix it. benchmarks/remedies.py
prints the same figures beside their targets.

- data-parallel, 8 ranks, 64 log-normal sequences a step: split_by_work over equal counts at
  least +20% on each of 5 seeds (about +38% on average: tests/whatif/remedies.py states the
  timings);
- a 4-stage pipeline of 16 equal layers and a loss head (1.4x on the last stage): the advice
  is what an exhaustive search of the 560 contiguous partitions finds; priced by the product's
  replay_1f1b it gains +10.2% at 16 micro-batches (+8.8% at 8). On the generator, with its
  point-to-point transfers, host gaps, jitter and the data-parallel collectives, it gains
  +6.5..+6.8% at 16 micro-batches: the +10% target is not met there (an xfail says so);
- balanced jobs (equal lengths; equal layers, no head): neither remedy changes the step.
"""

from __future__ import annotations

import statistics

import pytest

from skewtrace.remedy.partition import best_partition, replay_1f1b, stage_costs
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


def test_the_advice_is_the_exhaustive_best() -> None:
    advice = best_partition(HEADED, 4)
    every = partitions(len(HEADED), 4)
    assert len(every) == 560  # C(16, 3)
    least = min(max(stage_costs(HEADED, p)) for p in every)
    assert advice.slowest == pytest.approx(least) == 5.0
    slowest, ties, first = exhaustive_best(HEADED, 4)
    assert slowest == least
    assert advice.layers in ties and advice.layers == first == (4, 4, 5, 4)


@pytest.mark.parametrize("microbatches", [8, 16])
def test_the_generator_at_compute_only_is_replay_1f1b(microbatches: int) -> None:
    """With every timing but the forward and backward at zero, the generator plays exactly the
    1F1B the product prices its advice with."""
    unit = 4e-3 / (sum(HEADED) / 4)  # seconds of forward per unit of layer cost
    for layers in (AS_IS, best_partition(HEADED, 4).layers):
        job = generate(
            stage_job(1, microbatches=microbatches, partition=layers, steps=2, **COMPUTE_ONLY)
        )
        costs = stage_costs(HEADED, layers)
        replayed = replay_1f1b(list(costs), [2 * c for c in costs], microbatches) * unit
        for step_s in job.step_times.values():
            assert step_s == pytest.approx(replayed, rel=1e-9)


@pytest.mark.parametrize(("microbatches", "gain"), [(8, 0.088), (16, 0.102), (32, 0.110)])
def test_the_advice_priced_by_replay_1f1b(microbatches: int, gain: float) -> None:
    """The product's price of the advice: +10% from 16 micro-batches (4 per stage) on."""
    bare = measure(stage_job(1, microbatches=microbatches, steps=2, **COMPUTE_ONLY))
    assert bare.gain == pytest.approx(gain, abs=0.001)
    if microbatches >= STAGE_MICROBATCHES:
        assert bare.gain >= 0.10


def test_the_advice_on_the_generator_gains_what_is_documented() -> None:
    gains = [g.gain for g in over_seeds(stage_job)]
    assert min(gains) >= 0.06, gains
    assert max(gains) <= 0.075, gains  # documented as +6.5..+6.8%: a move here is news


@pytest.mark.xfail(
    strict=True,
    reason="issue 46's +10% for the headed pipeline is not met on "
    "the generator at default timings: +6.6% at 16 micro-batches (transfers, "
    "gaps, jitter and collectives dilute the +10.2% replay_1f1b prices)",
)
def test_the_stage_target_on_the_generator() -> None:
    assert min(g.gain for g in over_seeds(stage_job)) >= 0.10


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
