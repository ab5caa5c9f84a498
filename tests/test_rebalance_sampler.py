"""The rank side of rebalancing: batch sizes from shares, epoch coverage, agreement, fail-open.

Ranks are simulated in one process here (one sampler per rank, each reading the same
scripted source); the broadcast between real ranks is exercised in
``tests/test_rebalance_equivalence.py``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import pytest

from skewtrace.rank.rebalance_sampler import ShareSampler, batch_sizes, loss_scale


class Scripted:
    """Shares by call: the n-th read gets ``script[min(n, len - 1)]``."""

    def __init__(self, script: list[tuple[Mapping[int, float] | None, int]]) -> None:
        self.script = script
        self.calls = 0

    def current_shares(self) -> tuple[Mapping[int, float] | None, int]:
        found = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return found


class Broken:
    def current_shares(self) -> Any:
        raise RuntimeError("boom")


def samplers(
    size: int, world: int, global_batch: int, script: Any = None, **kwargs: Any
) -> list[ShareSampler]:
    return [
        ShareSampler(
            size,
            global_batch,
            num_replicas=world,
            rank=rank,
            source=Scripted(script) if script is not None else None,
            **kwargs,
        )
        for rank in range(world)
    ]


def epoch_batches(ranks: list[ShareSampler], epoch: int = 0) -> list[list[list[int]]]:
    """[rank][step] -> indices."""
    for sampler in ranks:
        sampler.set_epoch(epoch)
    return [list(sampler) for sampler in ranks]


# ------------------------------------------------------------------ batch sizes


def test_batch_sizes_sum_exactly_and_follow_the_shares() -> None:
    assert batch_sizes([0.25] * 4, 128) == [32, 32, 32, 32]
    assert batch_sizes([0.5 / 3.5, 1 / 3.5, 1 / 3.5, 1 / 3.5], 128) == [18, 37, 37, 36]
    assert batch_sizes([0.25] * 4, 10) == [3, 3, 2, 2]  # ties to the lower rank
    assert batch_sizes([0.001, 0.333, 0.333, 0.333], 8) == [1, 2, 3, 2]  # at least one each
    assert batch_sizes([0.5, 0.5], 1) == [1, 0]  # fewer items than ranks
    rng = random.Random(3)
    for _ in range(500):
        count = rng.randint(1, 64)
        shares = [rng.random() for _ in range(count)]
        total = rng.randint(count, 4096)
        sizes = batch_sizes(shares, total)
        assert sum(sizes) == total and min(sizes) >= 1
        exact = [s / sum(shares) * total for s in shares]
        assert all(abs(size - e) < 1 + count for size, e in zip(sizes, exact, strict=True))


def test_loss_scale() -> None:
    assert loss_scale(32, 128, 4) == 1.0
    assert loss_scale(18, 128, 4) == pytest.approx(4 * 18 / 128)
    sampler = ShareSampler(130, 64, num_replicas=2, rank=0)
    assert sampler.global_batch_size_at(0) == 64 and sampler.global_batch_size_at(2) == 2
    assert sampler.loss_scale(1, 2) == 1.0  # the last, partial global batch: 2 samples
    assert sampler.loss_scale(40) == pytest.approx(2 * 40 / 64)


# ------------------------------------------------------------------ coverage


@pytest.mark.parametrize("size", [1024, 1000, 1027, 1029])
@pytest.mark.parametrize(
    "shares", [None, {0: 0.1, 1: 0.3, 2: 0.3, 3: 0.3}, {0: 0.7, 1: 0.1, 2: 0.1, 3: 0.1}]
)
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_epoch_covers_each_index_once_whatever_the_shares(
    size: int, shares: Mapping[int, float] | None, shuffle: bool
) -> None:
    world, batch = 4, 64
    ranks = samplers(size, world, batch, [(shares, 1)], shuffle=shuffle)
    for epoch in range(3):
        batches = epoch_batches(ranks, epoch)
        assert len({len(b) for b in batches}) == 1  # every rank runs the same number of steps
        assert all(len(b) == len(ranks[0]) for b in batches)
        seen = sorted(i for rank in batches for step in rank for i in step)
        remainder = size % batch
        expected = size if remainder == 0 or remainder >= world else size - remainder
        assert seen == sorted(set(seen)) and len(seen) == expected
        if expected == size:
            assert seen == list(range(size))
        if shares is not None:
            sizes = [len(batches[r][0]) for r in range(world)]
            assert sizes == batch_sizes([shares[r] for r in range(world)], batch)


def test_a_step_holds_the_same_samples_with_any_shares() -> None:
    equal = epoch_batches(samplers(1000, 4, 64, None), epoch=2)
    skewed = epoch_batches(samplers(1000, 4, 64, [({0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4}, 5)]), 2)
    for step in range(len(equal[0])):
        assert sorted(i for r in equal for i in r[step]) == sorted(
            i for r in skewed for i in r[step]
        )
    assert [len(skewed[r][0]) for r in range(4)] != [16, 16, 16, 16]


def test_drop_last_drops_the_partial_global_batch() -> None:
    ranks = samplers(1000, 4, 64, None, drop_last=True)
    assert len(ranks[0]) == 15
    batches = epoch_batches(ranks)
    assert sum(len(step) for rank in batches for step in rank) == 960


# ------------------------------------------------------------------ agreement


def test_shares_change_only_at_sync_points() -> None:
    script: list[tuple[Mapping[int, float] | None, int]] = [
        (None, 0),
        ({0: 0.1, 1: 0.3, 2: 0.3, 3: 0.3}, 1),
        ({0: 0.4, 1: 0.2, 2: 0.2, 3: 0.2}, 2),
    ]
    ranks = samplers(4096, 4, 64, script, sync_every=5)
    batches = epoch_batches(ranks)
    sizes = [[len(batches[r][s]) for r in range(4)] for s in range(len(batches[0]))]
    expected = [[16] * 4] * 5 + [[7, 19, 19, 19]] * 5 + [[25, 13, 13, 13]] * 54
    assert sizes == expected
    assert ranks[0].shares_version == 2


def test_fail_open_equal_shares(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="skewtrace.rank.rebalance_sampler")
    for source in (
        Broken(),
        Scripted([({0: 0.5, 1: 0.5}, 3)]),  # not this group's ranks
        Scripted([({0: 0.5, 1: 0.5, 2: 0.5, 4: 0.5}, 3)]),
        Scripted([({0: float("nan"), 1: 0.5, 2: 0.5, 3: 0.5}, 3)]),
        Scripted([(None, 3)]),
    ):
        sampler = ShareSampler(256, 64, num_replicas=4, rank=0, source=source)
        assert [len(b) for b in sampler] == [16, 16, 16, 16]
        assert sampler.shares == [0.25] * 4 and sampler.shares_version == 0
    # With no source and no skewtrace session: equal shares, quietly.
    sampler = ShareSampler(256, 64, num_replicas=4, rank=3)
    assert [len(b) for b in sampler] == [16, 16, 16, 16]
    assert len([r for r in caplog.records if "reading shares failed" in r.getMessage()]) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="at least the number of ranks"):
        ShareSampler(100, 3, num_replicas=4, rank=0)
    with pytest.raises(ValueError, match="not in"):
        ShareSampler(100, 8, num_replicas=4, rank=4)
    with pytest.raises(ValueError, match="sync_every"):
        ShareSampler(100, 8, num_replicas=4, rank=0, sync_every=0)


def test_works_as_a_dataloader_batch_sampler_with_workers() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.arange(300))
    sampler = ShareSampler(
        data, 32, num_replicas=2, rank=1, source=Scripted([({0: 0.25, 1: 0.75}, 1)])
    )
    loader = DataLoader(data, batch_sampler=sampler, num_workers=2)
    sizes = [len(batch[0]) for batch in loader]
    assert sizes == [24] * 9 + [9]  # the last global batch has 12 samples: 3 + 9
