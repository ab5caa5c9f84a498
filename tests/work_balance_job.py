"""A small data-parallel transformer job over sequences of varying length, for the work-balanced
sampler's real runs (tests/test_work_balance.py and benchmarks/work_balance.py).

Each rank runs one DDP forward per step over its local batch: the model loops over the
sequences, one at a time and each at its own length (packed without padding: a sample's cost
is its own tokens and their square, through attention), and returns the sum of the per-token
cross-entropy losses. The loss is scaled by ``world_size / global tokens``
(:meth:`WorkBalancedSampler.token_loss_scale`), so DDP's averaged gradient is the mean over
the global batch's tokens whichever rank ran which sample. No dropout, fixed seeds.

``device_s_per_token`` > 0 adds a modelled accelerator time per sample, ``a*t + b*t**2``
seconds (``b = a / device_crossover``), as a sleep in the forward: four ranks on a two-core
machine share two cores, so their real compute cannot show what four devices would (a rank
that finishes early gives its core to the one still computing); a sleep per rank can, as in
benchmarks/rebalance.py. The real compute still runs, and still decides the losses.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

VOCAB = 48


@dataclass(frozen=True)
class JobConfig:
    steps: int = 20
    global_batch: int = 16
    samples: int = 16 * 6 + 7  # six full global batches and a partial one per epoch
    median: float = 12.0
    sigma: float = 1.0
    min_len: int = 2
    max_len: int = 96
    d_model: int = 16
    nhead: int = 2
    ff: int = 32
    dtype: str = "float64"
    lr: float = 0.05
    seed: int = 0
    sync_every: int = 4
    fit: bool = True
    """Fit the cost model online from the forward times; else a fixed crossover model."""
    crossover: float = 2048.0
    device_s_per_token: float = 0.0
    shares: tuple[float, ...] | None = None
    """Rank 0's source publishes these shares (speed), to compose with the work split."""
    num_workers: int = 0
    instrument: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def lengths(config: JobConfig) -> list[int]:
    """Log-normal sequence lengths (median, sigma), clipped; the same for every run."""
    generator = torch.Generator().manual_seed(config.seed + 7)
    normal = torch.randn(config.samples, generator=generator, dtype=torch.float64)
    values = torch.exp(math.log(config.median) + config.sigma * normal)
    return [int(min(config.max_len, max(config.min_len, round(v)))) for v in values.tolist()]


class Sequences(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: random tokens of length lengths[i]; the target of a token is the one before
    it (a copy task attention can learn)."""

    def __init__(self, config: JobConfig) -> None:
        self.lengths = lengths(config)
        self.seed = config.seed

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.randint(1, VOCAB, (self.lengths[index],), generator=generator)
        targets = torch.roll(tokens, 1)
        targets[0] = 0
        return tokens, targets


def as_list(batch: list[Any]) -> list[Any]:
    """The collate function: the samples as they are (each its own length)."""
    return batch


class TinyTransformer(nn.Module):
    def __init__(self, config: JobConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, config.d_model)
        self.layer = nn.TransformerEncoderLayer(
            config.d_model, config.nhead, config.ff, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(config.d_model, VOCAB)
        self.device_a = config.device_s_per_token
        self.device_b = config.device_s_per_token / config.crossover

    def forward(self, samples: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The sum of the token losses of every sample, each run at its own length."""
        total = torch.zeros((), dtype=self.head.weight.dtype)
        for tokens, targets in samples:
            hidden = self.layer(self.embed(tokens[None]))
            logits = self.head(hidden)[0]
            total = total + nn.functional.cross_entropy(logits, targets, reduction="sum")
            if self.device_a > 0:
                t = len(tokens)
                time.sleep(self.device_a * t + self.device_b * t * t)
        return total


def run_rank(rank: int, world: int, port: int, config: JobConfig, mode: str) -> dict[str, Any]:
    """One rank of one run: every step's global per-token loss, rank 0's step times, the
    split of each step and the cost model versions. The process group must not exist yet."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from skewtrace.rank.work_balance import WorkBalancedSampler
    from skewtrace.remedy.work_split import TokenCost

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    dtype = getattr(torch, config.dtype)
    try:
        data = Sequences(config)
        source = _Shares(config.shares) if config.shares and rank == 0 else None
        sampler = WorkBalancedSampler(
            data,
            config.global_batch,
            lengths=data.lengths,
            cost=None if config.fit else TokenCost.with_crossover(config.crossover),
            mode=mode,
            seed=config.seed,
            sync_every=config.sync_every,
            source=source,
        )
        loader = DataLoader(
            data, batch_sampler=sampler, collate_fn=as_list, num_workers=config.num_workers
        )
        torch.manual_seed(config.seed)
        model = DistributedDataParallel(TinyTransformer(config).to(dtype))
        if config.fit:
            sampler.time_forward(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
        losses: list[float] = []
        step_s: list[float] = []
        splits: list[list[int]] = []
        work: list[list[float]] = []
        cost_versions: list[int] = []
        step, epoch = 0, 0
        dist.barrier()
        last = time.perf_counter()
        while step < config.steps:
            sampler.set_epoch(epoch)
            for index, batch in enumerate(loader):
                if step >= config.steps:
                    break
                optimizer.zero_grad()
                token_loss = model(batch)
                (token_loss * sampler.token_loss_scale(index)).backward()
                optimizer.step()
                now = time.perf_counter()
                step_s.append(now - last)
                last = now
                reported = token_loss.detach().to(torch.float64).reshape(1)
                dist.all_reduce(reported)
                plan = sampler.step_plan(index)
                losses.append(reported.item() / plan.global_tokens)
                splits.append(sorted(plan.indices))
                work.append(list(plan.work))
                cost_versions.append(plan.cost_version)
                step += 1
                last = time.perf_counter()  # the loss all-reduce is the harness's, not the step's
            epoch += 1
        return {
            "loss": losses,
            "step_s": step_s,
            "indices": splits,
            "work": work,
            "cost_versions": cost_versions,
            "cost": [sampler.cost.linear, sampler.cost.quadratic],
            "config": asdict(config),
        }
    finally:
        dist.destroy_process_group()


class _Shares:
    """Rank 0's fixed shares, as the rebalancing policy would publish them."""

    def __init__(self, shares: tuple[float, ...]) -> None:
        self.shares = dict(enumerate(shares))

    def current_shares(self) -> tuple[dict[int, float], int]:
        return self.shares, 1
