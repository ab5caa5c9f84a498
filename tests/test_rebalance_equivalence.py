"""Rebalancing does not change what the model learns.

With unequal local batches and the loss scaled by ``N * b / B``
(:meth:`skewtrace.rank.rebalance_sampler.ShareSampler.loss_scale`), DDP's averaged gradient is
the mean over the global batch, as with equal shares. Shown twice: in one process, computing each
rank's gradient by hand and averaging as DDP does; and with a real 4-rank gloo DDP job, whose
parameters and loss curve under changing shares match the equal-share run step for step.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from conftest import free_port
from skewtrace.rank.rebalance_sampler import ShareSampler, batch_sizes, loss_scale

WORLD = 4
GLOBAL_BATCH = 64
FEATURES = 12


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 5)
    ).double()


def _data(size: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, FEATURES, generator=generator, dtype=torch.float64)
    return inputs, torch.randint(0, 5, (size,), generator=generator)


def _ddp_like_gradient(
    model: nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    sizes: Sequence[int],
    *,
    scaled: bool = True,
) -> list[torch.Tensor]:
    """Each rank's gradient of its (scaled) mean loss over its slice, averaged over ranks."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    offset = 0
    for size in sizes:
        model.zero_grad()
        loss = nn.functional.cross_entropy(
            model(inputs[offset : offset + size]), targets[offset : offset + size]
        )
        scale = loss_scale(size, len(inputs), len(sizes)) if scaled else 1.0
        (loss * scale).backward()
        for acc, p in zip(total, model.parameters(), strict=True):
            acc += p.grad / len(sizes)  # DDP: all-reduce sum, divided by the world size
        offset += size
    return total


@pytest.mark.parametrize(
    "shares",
    [
        [0.25, 0.25, 0.25, 0.25],
        [0.5 / 3.5, 1 / 3.5, 1 / 3.5, 1 / 3.5],
        [0.0625, 0.3125, 0.3125, 0.3125],
        [0.7, 0.1, 0.1, 0.1],
    ],
)
def test_share_weighted_gradient_equals_the_equal_share_gradient(shares: list[float]) -> None:
    model = _model()
    inputs, targets = _data(GLOBAL_BATCH)
    equal = _ddp_like_gradient(model, inputs, targets, [GLOBAL_BATCH // WORLD] * WORLD)
    weighted = _ddp_like_gradient(model, inputs, targets, batch_sizes(shares, GLOBAL_BATCH))
    model.zero_grad()
    nn.functional.cross_entropy(model(inputs), targets).backward()
    full = [p.grad.clone() for p in model.parameters()]
    for a, b, c in zip(equal, weighted, full, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(a, c, rtol=1e-12, atol=1e-14)


def test_without_the_loss_scale_unequal_shares_change_the_update() -> None:
    model = _model()
    inputs, targets = _data(GLOBAL_BATCH)
    equal = _ddp_like_gradient(model, inputs, targets, [16] * 4)
    unscaled = _ddp_like_gradient(model, inputs, targets, [6, 20, 20, 18], scaled=False)
    assert max((a - b).abs().max().item() for a, b in zip(equal, unscaled, strict=True)) > 1e-4


def test_optimizer_trajectory_is_the_same_with_momentum_over_many_steps() -> None:
    inputs, targets = _data(GLOBAL_BATCH * 10)
    runs = []
    for shares in ([0.25] * 4, [0.1, 0.3, 0.3, 0.3]):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for step in range(10):
            batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
            grads = _ddp_like_gradient(
                model, inputs[batch], targets[batch], batch_sizes(shares, GLOBAL_BATCH)
            )
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g
            optimizer.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------ real DDP over gloo


class _Script:
    """Rank 0's shares: equal, then a half-speed rank's, then a floor, by sync point."""

    def __init__(self, script: Sequence[Mapping[int, float] | None]) -> None:
        self.script, self.calls = list(script), 0

    def current_shares(self) -> tuple[Mapping[int, float] | None, int]:
        found = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return found, self.calls


SCRIPTS: dict[str, list[Mapping[int, float] | None]] = {
    "equal": [None],
    "changing": [
        None,
        {0: 0.5 / 3.5, 1: 1 / 3.5, 2: 1 / 3.5, 3: 1 / 3.5},
        {0: 0.0625, 1: 0.3125, 2: 0.3125, 3: 0.3125},
        {0: 0.4, 1: 0.2, 2: 0.2, 3: 0.2},
    ],
}
DATASET = 64 * 5 + 9  # five full global batches and a partial one per epoch
STEPS = 14


def _ddp_worker(rank: int, port: int, out: str) -> None:
    import os

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, TensorDataset

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    try:
        inputs, targets = _data(DATASET)
        data = TensorDataset(inputs, targets)
        for name, script in SCRIPTS.items():
            # Only rank 0's source counts: the others read nonsense, which must not matter.
            source = _Script(script) if rank == 0 else _Script([{0: 0.97, 1: 0.01}])
            sampler = ShareSampler(data, GLOBAL_BATCH, seed=3, sync_every=3, source=source)
            loader = DataLoader(data, batch_sampler=sampler)
            model = DistributedDataParallel(_model())
            optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
            losses, sizes, step, epoch = [], [], 0, 0
            while step < STEPS:
                sampler.set_epoch(epoch)
                for index, (x, y) in enumerate(loader):
                    if step >= STEPS:
                        break
                    optimizer.zero_grad()
                    loss = nn.functional.cross_entropy(model(x), y)
                    scale = sampler.loss_scale(len(x), index)
                    (loss * scale).backward()
                    optimizer.step()
                    reported = (loss.detach() * scale).reshape(1)
                    dist.all_reduce(reported)
                    losses.append(reported.item() / WORLD)
                    sizes.append(len(x))
                    step += 1
                epoch += 1
            results[name] = {
                "params": [p.detach().flatten().tolist() for p in model.module.parameters()],
                "loss": losses,
                "sizes": sizes,
            }
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))


@pytest.mark.slow
def test_real_ddp_with_changing_shares_learns_exactly_what_equal_shares_learn(
    tmp_path: Path,
) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]

    equal, changing = ranks[0]["equal"], ranks[0]["changing"]
    # The shares did change, and every rank used rank 0's.
    equal_steps = list(zip(*(r["equal"]["sizes"] for r in ranks), strict=True))
    partial = tuple(batch_sizes([0.25] * 4, DATASET % GLOBAL_BATCH))
    assert equal_steps == ([(16,) * 4] * 5 + [partial]) * 2 + [(16,) * 4] * 2
    per_step = list(zip(*(r["changing"]["sizes"] for r in ranks), strict=True))
    assert per_step[0] == (16, 16, 16, 16)
    assert per_step[3] == tuple(batch_sizes(SCRIPTS["changing"][1].values(), GLOBAL_BATCH))
    assert per_step[6] == tuple(batch_sizes(SCRIPTS["changing"][2].values(), GLOBAL_BATCH))
    assert all(sum(step) in (GLOBAL_BATCH, DATASET % GLOBAL_BATCH) for step in per_step)
    # Same loss curve, same parameters (float64; all-reduce order is the only difference).
    assert changing["loss"] == pytest.approx(equal["loss"], rel=1e-10, abs=1e-12)
    for a, b in zip(changing["params"], equal["params"], strict=True):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-11)
    # And both equal the single-process full-batch run on the same global batches.
    reference = _reference_run()
    for a, b in zip(equal["params"], reference, strict=True):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-11)
    assert equal["loss"][-1] < equal["loss"][0]


def _reference_run() -> list[list[float]]:
    """One process, the mean loss over each whole global batch, the same order of samples."""
    inputs, targets = _data(DATASET)
    order_of = ShareSampler(DATASET, GLOBAL_BATCH, num_replicas=1, rank=0, seed=3)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    step, epoch = 0, 0
    while step < STEPS:
        order_of.set_epoch(epoch)
        for batch in order_of:
            if step >= STEPS:
                break
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs[batch]), targets[batch]).backward()
            optimizer.step()
            step += 1
        epoch += 1
    return [p.detach().flatten().tolist() for p in model.parameters()]
