"""Pipeline parallel with ``torch.distributed.pipelining``: one stage per rank, the 1F1B
schedule (``Schedule1F1B``) over microbatches, a plain training loop around it.

    torchrun --nproc-per-node 4 examples/frameworks/pipelining.py [--steps N]

Activations go forward and gradients back as point-to-point messages between neighbouring
stages (``batch_isend_irecv``); each stage runs one forward and one backward per microbatch.
"""

from __future__ import annotations

import argparse

import _knobs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


class Stage(nn.Module):
    def __init__(self, width: int, slow: _knobs.SlowRank) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow()
        return torch.relu(self.linear(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    args = parser.parse_args()
    device = _knobs.init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    # The slow rank's delay is spread over its microbatches' forwards.
    slow = _knobs.SlowRank(forwards_per_step=args.microbatches)
    slow.delay_s /= args.microbatches
    module = Stage(args.width, slow).to(device)
    stage = PipelineStage(module, rank, world, device)
    schedule = Schedule1F1B(
        stage, n_microbatches=args.microbatches, loss_fn=lambda out, y: (out - y).pow(2).mean()
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-2)
    _knobs.one_call(module, optimizer)
    generator = torch.Generator().manual_seed(0)
    batch = 4 * args.microbatches
    for _ in range(args.steps):
        x = torch.randn(batch, args.width, generator=generator).to(device)
        y = torch.randn(batch, args.width, generator=generator).to(device)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad()
    _knobs.write_collective_counts()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
