"""Tensor parallel (DTensor): ``parallelize_module`` with ``ColwiseParallel`` and
``RowwiseParallel`` over a 1-D device mesh of every rank, a plain training loop.

    torchrun --nproc-per-node 4 examples/frameworks/tensor_parallel.py [--steps N]

Each MLP's output is all-reduced in forward and its input gradient in backward; DTensor
issues those through functional collectives (``_c10d_functional``), not ``torch.distributed``
calls. Every rank sees the same batch (one data-parallel replica).
"""

from __future__ import annotations

import argparse

import _knobs
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Model(nn.Module):
    def __init__(self, width: int, depth: int, slow: _knobs.SlowRank) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Mlp(width) for _ in range(depth))
        self.slow = slow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.slow()
        for layer in self.layers:
            x = layer(x)
        return x


def tp_plan(depth: int) -> dict[str, object]:
    plan: dict[str, object] = {}
    for i in range(depth):
        plan[f"layers.{i}.up"] = ColwiseParallel()
        plan[f"layers.{i}.down"] = RowwiseParallel()
    return plan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=3)
    args = parser.parse_args()
    device = _knobs.init_distributed()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = Model(args.width, args.depth, _knobs.SlowRank()).to(device)
    parallelize_module(model, mesh, tp_plan(args.depth))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    _knobs.one_call(model, optimizer)
    generator = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        x = torch.randn(8, args.width, generator=generator).to(device)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    _knobs.write_collective_counts()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
