"""A plain DDP training script that knows nothing of skewtrace: the zero-code example.

``examples/zero_code.sh`` runs it under ``opentelemetry-instrument``, which loads skewtrace
through its ``opentelemetry_instrumentor`` entry point: every DistributedDataParallel, every
DataLoader, every optimizer step and collective is traced with no change here. Launched
one process per rank by torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ...); gloo on
CPU, NCCL when every rank has a GPU.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(
        os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    )
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    torch.manual_seed(0)

    size = args.batch_size * args.steps * dist.get_world_size()
    data = TensorDataset(torch.randn(size, 64), torch.randint(0, 10, (size,)))
    loader = DataLoader(
        data, batch_size=args.batch_size, sampler=DistributedSampler(data), drop_last=True
    )
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()

    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        dist.all_reduce(loss.detach())
    if dist.get_rank() == 0:
        print(f"done: {len(loader)} steps on {dist.get_world_size()} ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
