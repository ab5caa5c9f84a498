"""FSDP2: ``fully_shard`` on each block and on the root, a plain training loop.

    torchrun --nproc-per-node 4 examples/frameworks/fsdp2.py [--steps N]

Per step each block's parameters are all-gathered before its forward and again before its
backward, and its gradients reduce-scattered after: three collectives per block per step,
issued by FSDP2 through ``torch.distributed``'s ``_single``/``_tensor`` functions. Runs on CPU
with gloo (or CUDA with NCCL when GPUs are visible).
"""

from __future__ import annotations

import argparse

import _knobs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Model(nn.Module):
    def __init__(self, width: int, depth: int, slow: _knobs.SlowRank) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 1)
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow()
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    device = _knobs.init_distributed()
    torch.manual_seed(0)
    model = Model(args.width, args.depth, _knobs.SlowRank()).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _knobs.one_call(model, optimizer)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(16, args.width, generator=generator).to(device)
        y = torch.randn(16, 1, generator=generator).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    _knobs.write_collective_counts()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
