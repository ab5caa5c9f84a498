"""FSDP2 + tensor parallel on a 2-D device mesh: ``("dp", "tp")``, tensor parallel inside
each row of the mesh and FSDP2 across rows, a plain training loop.

    torchrun --nproc-per-node 4 examples/frameworks/fsdp2_tp.py [--steps N]

Needs an even number of ranks (two-way tensor parallel). Collectives run on two kinds of
groups: the tensor-parallel all-reduces (functional collectives) on each ``tp`` group, the
FSDP2 all-gathers and reduce-scatters on each ``dp`` group.
"""

from __future__ import annotations

import argparse

import _knobs
import torch
import torch.distributed as dist
from tensor_parallel import Model, tp_plan
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import parallelize_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args()
    device = _knobs.init_distributed()
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = Model(args.width, args.depth, _knobs.SlowRank()).to(device)
    parallelize_module(model, mesh["tp"], tp_plan(args.depth))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _knobs.one_call(model, optimizer)
    # Ranks of one tensor-parallel group see the same batch; the rows see different ones.
    generator = torch.Generator().manual_seed(mesh.get_coordinate()[0])
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
